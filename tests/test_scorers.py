"""Scorers against plain NumPy references, batching invariance, orientation (higher = member)."""
import jax.numpy as jnp
import numpy as np
import pytest
from reference import count, ref_token_arrays, reference_scores

from mia_jax.errors import UserError
from mia_jax.methods.freq import FreqTable
from mia_jax.scorers import (REGISTRY, TokenBatch, expand_methods, k_count, parse_method, resource_arrays,
                            score_batch)
from mia_jax.stats import token_stats

TEXTS = ["alpha beta gamma", "the quick brown fox jumps", "x", "lorem ipsum dolor sit amet, consectetur"]


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(0)
    b, t, v = 4, 23, 97
    logits = rng.standard_normal((b, t, v)) * 2.5
    targets = rng.integers(0, v, size=(b, t))
    lengths = np.array([23, 11, 1, 17])
    mask = np.arange(t)[None, :] < lengths[:, None]
    return logits, targets, lengths, mask


METHODS = ["loss", "ppl", "zlib", "min_k@0.2", "max_k@0.2", "min_k_pp@0.2", "entropy", "rank",
           "min_k@0.7", "min_k_pp@0.1", "min_k@1"]


def test_scores_match_numpy_reference(case):
    logits, targets, lengths, mask = case
    stats = token_stats(jnp.asarray(logits, jnp.float32), jnp.asarray(targets), chunk_size=40)
    got = score_batch(TokenBatch(stats, mask, TEXTS), METHODS)
    ref_arrays = ref_token_arrays(logits, targets)
    for i, n in enumerate(lengths):
        per = [a[i, :n] for a in ref_arrays]
        want = {}
        for k in (0.2, 0.7, 0.1, 1.0):
            want.update(reference_scores(*per, TEXTS[i], k))
        for m in METHODS:
            np.testing.assert_allclose(got[m][i], want[m], rtol=1e-5, err_msg=f"{m} row {i}")


def test_padding_and_batching_change_nothing(case):
    logits, targets, lengths, mask = case
    full = score_batch(TokenBatch(token_stats(jnp.asarray(logits, jnp.float32), jnp.asarray(targets)), mask, TEXTS),
                       METHODS)
    for i, n in enumerate(lengths):
        # the row alone, cut to its length: no padding at all
        one = token_stats(jnp.asarray(logits[i:i + 1, :n], jnp.float32), jnp.asarray(targets[i:i + 1, :n]))
        alone = score_batch(TokenBatch(one, np.ones((1, n), bool), TEXTS[i:i + 1]), METHODS)
        for m in METHODS:
            np.testing.assert_allclose(alone[m][0], full[m][i], rtol=1e-5, err_msg=m)


def test_row_without_tokens_is_nan(case):
    logits, targets, _, mask = case
    mask = mask.copy()
    mask[1] = False
    got = score_batch(TokenBatch(token_stats(jnp.asarray(logits, jnp.float32), jnp.asarray(targets)), mask, TEXTS),
                      METHODS)
    for m in METHODS:
        assert np.isnan(got[m][1]) and np.all(np.isfinite(np.delete(got[m], 1))), m


def test_every_scorer_is_oriented_higher_is_member():
    """A 'member' whose tokens the model predicts confidently must score above a 'non-member'."""
    rng = np.random.default_rng(1)
    t, v = 40, 64
    targets = rng.integers(0, v, size=(2, t))
    logits = rng.standard_normal((2, t, v))
    onehot = np.eye(v)[targets]
    logits[0] += 6.0 * onehot[0]  # member: targets strongly predicted
    logits[1] -= 2.0 * onehot[1]  # non-member: targets unlikely
    texts = ["same text", "same text"]
    methods = expand_methods(list(REGISTRY), [0.2, 0.5])  # every single-pass scorer
    table = FreqTable(np.arange(v) % 7, "any")  # dc_pdd: any corpus counts; it reads the target ids
    for temperature in (0.5, 2.0):  # ACMIA's AC changes sides at T = 1
        res = {"freq_table": table, "acmia_temperature": temperature, "tag_tab_keywords": np.ones((2, t), bool)}
        stats, tempered = token_stats(jnp.asarray(logits, jnp.float32), jnp.asarray(targets),
                                      temperatures=resource_arrays(methods, res)["acmia_temperature"])
        got = score_batch(TokenBatch(stats, np.ones((2, t), bool), texts, targets, res, tempered), methods)
        for m in methods:
            assert got[m][0] > got[m][1], (m, temperature)


def test_k_count_is_exact():
    assert k_count(0.7, 90) == 63  # int(90 * 0.7) == 62 in the published code
    assert k_count(0.2, 4) == 1 and k_count(0.2, 3) == 1 and k_count(0.2, 10) == 2
    assert k_count(0.3, 10) == 3  # 10 * 0.3 = 2.9999999999999996 in floating point
    np.testing.assert_array_equal(k_count(0.1, np.array([0, 5, 10, 99])), [1, 1, 1, 9])


def test_method_parsing():
    scorer, k = parse_method("min_k_pp@0.25")
    assert scorer.name == "min_k_pp" and k == 0.25
    assert expand_methods(["loss", "min_k"], [0.1, 0.2]) == ["loss", "min_k@0.1", "min_k@0.2"]
    with pytest.raises(UserError, match="known methods: .*min_k@K"):
        parse_method("mink")
    for bad in ("min_k@abc", "min_k@0", "min_k@1.5", "loss@0.2"):
        with pytest.raises(UserError):
            parse_method(bad)


def test_multi_pass_methods_have_their_own_registry():
    from mia_jax.engine import passes
    from mia_jax.scorers import MULTI_PASS, MultiPassMethod, Scorer, is_multi_pass, lookup

    assert {"lowercase", "ref", "neighbor", "recall", "con_recall", "pac", "samia"} <= set(MULTI_PASS)
    assert not set(MULTI_PASS) & set(REGISTRY)
    for m in MULTI_PASS.values():  # every second pass a method names is registered, and what it folds is a scorer
        assert set(m.kinds) <= set(passes.PASSES) and m.pass_method in REGISTRY, m.name
    assert MULTI_PASS["con_recall"].kinds == ("prefix_nonmember", "prefix_member")
    assert isinstance(lookup("ref"), MultiPassMethod) and isinstance(lookup("loss"), Scorer) and lookup("x") is None
    assert parse_method("lowercase") == (MULTI_PASS["lowercase"], None)
    assert is_multi_pass("neighbor") and not is_multi_pass("min_k@0.2")
    assert expand_methods(["lowercase", "min_k"], [0.1]) == ["lowercase", "min_k@0.1"]
    with pytest.raises(UserError, match="takes no fraction"):
        parse_method("ref@0.2")
    with pytest.raises(UserError, match="known methods: .*lowercase"):
        parse_method("lowercas")


def test_min_k_pp_ablations_and_gap_k_match_loop_references():
    """min_k_pp_mu / min_k_pp_sigma (Min-K%++ Table 3: l - mu, l / sigma) and gap_k (Kwak and Kim 2026: 3-token
    'valid' moving average of (l - max log p) / sigma, fewer than 3 tokens kept raw) against float64 loops over
    statistics recomputed from the logits."""
    rng = np.random.default_rng(3)
    b, t, v = 6, 21, 53
    logits = rng.standard_normal((b, t, v)) * 2.0
    targets = rng.integers(0, v, size=(b, t))
    lengths = [21, 10, 3, 2, 1, 0]
    mask = np.arange(t)[None, :] < np.array(lengths)[:, None]
    ks = (0.2, 0.5, 1.0)
    methods = [f"{m}@{k:g}" for m in ("min_k_pp_mu", "min_k_pp_sigma", "gap_k") for k in ks]
    got = score_batch(TokenBatch(token_stats(jnp.asarray(logits, jnp.float32), jnp.asarray(targets)), mask), methods)
    lp, mu, sigma, _, _ = ref_token_arrays(logits, targets)
    x = logits - logits.max(-1, keepdims=True)
    top = -np.log(np.exp(x).sum(-1))  # max_v log p_v
    for i, n in enumerate(lengths):
        if n == 0:
            assert all(np.isnan(got[m][i]) for m in methods)
            continue
        mu_cal, sigma_cal, gap = [], [], []
        for j in range(n):
            mu_cal.append(lp[i, j] - mu[i, j])
            sigma_cal.append(lp[i, j] / sigma[i, j])
            gap.append((lp[i, j] - top[i, j]) / sigma[i, j])
        smooth = gap if n < 3 else [(gap[j] + gap[j + 1] + gap[j + 2]) / 3 for j in range(n - 2)]
        for k in ks:
            for name, vals in (("min_k_pp_mu", mu_cal), ("min_k_pp_sigma", sigma_cal), ("gap_k", smooth)):
                c = count(k, len(vals))
                want = sum(sorted(vals)[:c]) / c
                np.testing.assert_allclose(got[f"{name}@{k:g}"][i], want, rtol=1e-5, err_msg=f"{name}@{k} row {i}")
    assert np.all(np.asarray(got["gap_k@1"])[:5] <= 0)  # log p(x_i) <= max_v log p_v: the gap is never positive


def test_k_count_has_no_integer_overflow_and_a_real_minus_inf_token_counts():
    assert k_count(0.1 + 0.2, 1000) == 300  # 0.30000000000000004: numerator 3e16, n * numerator > 2**63
    lp = np.array([[-1.0, -np.inf, -2.0, -0.5, 0.0]])  # a target of probability 0 is the least likely, not 0
    stats = token_stats(jnp.zeros((1, 5, 3)), jnp.zeros((1, 5), jnp.int32))._replace(logprob=lp)
    got = score_batch(TokenBatch(stats, np.array([[1, 1, 1, 1, 0]], bool)), ["min_k@0.5", "max_k@0.5"])
    assert got["min_k@0.5"][0] == -np.inf and got["max_k@0.5"][0] == -0.75


def test_multi_pass_methods_register_with_their_package_and_say_so_when_not_imported():
    """scorers/ imports nothing above stats, so the multi-pass methods (mia_jax/methods/) register when their package
    is imported; a fresh interpreter that never imported it is told so by the unknown-method error, and after the
    import every multi-pass method is known."""
    import subprocess
    import sys

    from helpers import ENV

    code = ("from mia_jax.errors import UserError\nfrom mia_jax.scorers import MULTI_PASS, parse_method\n"
            "try:\n    parse_method('lowercase')\nexcept UserError as e:\n    print(e)\n"
            "import mia_jax.methods\nprint(sorted(MULTI_PASS))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.strip().splitlines()
    assert "unknown method 'lowercase'" in first and "register when mia_jax.methods is imported" in first
    assert {"lowercase", "ref", "neighbor", "recall", "infilling", "em_mia", "ngram_coverage"} <= set(eval(second))
