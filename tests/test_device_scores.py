"""The scorer formulas (one ``jax.numpy`` function each) against float64 NumPy references written from their
docstrings (tests/reference.py): random statistics with masks, rows without tokens, a real -inf; float32 and, under
``jax_enable_x64``, float64; ``jax.jit`` / ``jax.vmap`` / ``jax.grad`` through the public functions;
``device_scores`` by name (its errors), ``scores_from_logits`` (the shift and the mask), ``resource_arrays``; the
doctests; batch-sharded inputs."""
import doctest
import importlib
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import REFERENCES, count, method_references, scores_x64

import mia_jax
from mia_jax import device_scores, scorers, scores_from_logits
from mia_jax.errors import UserError
from mia_jax.methods.freq import FreqTable
from mia_jax.scorers import REGISTRY, expand_methods, k_count, requirements, resource_arrays, zlib_bytes
from mia_jax.stats import TemperedStats, TokenStats, token_stats

METHODS = tuple(expand_methods(sorted(REGISTRY), [0.2, 0.7]))
TEMPERATURES = scorers.acmia.temperatures(0.5)  # ACMIA's [T, T * 2^0.1] (T >= 1 and the kernel: test_acmia.py)
LENGTHS = [0, 1, 2, 3, 4, 7, 20, 90]  # n = 90, k = 0.7 -> 63 tokens exactly (int(90 * 0.7) = 62)
V = 40


def random_batch(seed=0, lengths=LENGTHS, T=96, minus_inf=True):
    """Statistics [B, T] (float32), the mask (rolled: the scored tokens need not start at 0), texts, ids with
    repeats, a probability table over V ids; padding holds garbage (NaN, inf, 0) that must not leak in."""
    rng = np.random.default_rng(seed)
    B = len(lengths)
    mask = np.roll(np.arange(T)[None, :] < np.array(lengths)[:, None], 1, axis=1)
    mx = -rng.gamma(1.0, 0.3, (B, T))
    lp = mx - rng.gamma(2.0, 1.5, (B, T))
    if minus_inf:
        lp[-1, 5] = -np.inf  # a real token of probability 0
    mu = -rng.gamma(2.0, 1.5, (B, T))
    var = rng.gamma(2.0, 1.0, (B, T)) + 0.05
    rank = rng.integers(1, 500, (B, T))
    garbage = rng.choice([np.nan, np.inf, -np.inf, 0.0], size=(~mask).sum())
    stats = TokenStats(*(np.where(mask, x, 0).astype(np.float32) for x in (lp, mu, var, -mu)),
                       np.where(mask, rank, 0).astype(np.int32), mx.astype(np.float32))
    stats = stats._replace(logprob=stats.logprob.copy())
    stats.logprob[~mask] = garbage
    texts = [f"text {i} " * (i + 1) for i in range(B)]
    ids = rng.integers(0, V // 4 if seed % 2 else V, (B, T))  # many repeats on odd seeds
    freq = FreqTable(rng.integers(0, 100, V), "x").probabilities()
    return stats, mask, texts, ids, freq


def random_tempered(stats, mask, seed=0):
    """TemperedStats [B, T, 2] beside ``random_batch``'s statistics: a real -inf log-prob is -inf at every
    temperature; padding holds garbage (NaN, inf, 0)."""
    rng = np.random.default_rng(seed + 100)
    shape = (*mask.shape, len(TEMPERATURES))
    lp, mu, var = -rng.gamma(2.0, 1.5, shape), -rng.gamma(2.0, 1.5, shape), rng.gamma(2.0, 1.0, shape) + 0.05
    lp[(np.asarray(stats.logprob) == -np.inf) & mask] = -np.inf
    pad = ~np.broadcast_to(np.asarray(mask, bool)[..., None], shape)
    garbage = rng.choice([np.nan, np.inf, -np.inf, 0.0], size=shape)
    return TemperedStats(*(np.where(pad, garbage, x).astype(np.float32) for x in (lp, mu, var)))


def keywords_of(mask):
    """Tag&Tab's keyword tokens beside a batch: every third slot from 1 (each row's first scored token)."""
    return np.broadcast_to(np.arange(np.shape(mask)[-1]) % 3 == 1, np.shape(mask)).copy()


def inputs(texts, ids, freq):
    return dict(ids=ids, zlib_bytes=np.array([zlib_bytes(t) for t in texts], np.float64), freq=freq,
                keywords=keywords_of(ids))


def resources_of(freq, mask):
    """Every resource the registered methods read, as arrays (the keywords of a batch of ``mask``'s shape)."""
    return {"freq_table": jnp.asarray(freq, jnp.float32), "acmia_temperature": jnp.asarray(TEMPERATURES),
            "tag_tab_keywords": jnp.asarray(keywords_of(mask))}


def jitted(stats, mask, texts, ids, freq, methods=METHODS):
    zb = jnp.asarray([zlib_bytes(t) for t in texts], jnp.float32)
    fn = jax.jit(device_scores, static_argnames="methods")
    return fn(TokenStats(*map(jnp.asarray, stats)), jnp.asarray(mask), methods=methods, ids=jnp.asarray(ids),
              zlib_bytes=zb, resources=resources_of(freq, mask),
              tempered=TemperedStats(*map(jnp.asarray, random_tempered(stats, mask))))


def test_every_registered_scorer_has_a_reference_and_is_the_public_function():
    assert set(REGISTRY) == set(REFERENCES)
    for name, scorer in REGISTRY.items():
        assert getattr(scorers, name) is scorer.fn, name  # scorers.min_k is the function, not its module
        assert name in scorers.__all__ and scorer.fn.__doc__ and ">>>" in scorer.fn.__doc__, name
    assert callable(scorers.min_k) and scorers.min_k_pp is REGISTRY["min_k_pp"].fn
    assert mia_jax.device_scores is device_scores and mia_jax.scores_from_logits is scores_from_logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_formulas_equal_the_float64_reference(seed):
    stats, mask, texts, ids, freq = random_batch(seed)
    extra = inputs(texts, ids, freq)
    want = method_references(stats, mask, METHODS, **extra, tempered=random_tempered(stats, mask),
                             temperatures=TEMPERATURES)
    got = jitted(stats, mask, texts, ids, freq)
    for m in METHODS:
        g = np.asarray(got[m], np.float64)
        assert got[m].dtype == jnp.float32 and g.shape == (len(LENGTHS),), m
        assert np.array_equal(np.isnan(g), np.isnan(want[m])), (m, g, want[m])  # rows without tokens: NaN
        assert np.isnan(g[0]), m
        np.testing.assert_allclose(g, want[m], rtol=2e-5, atol=2e-6, equal_nan=True, err_msg=m)


@pytest.mark.parametrize("seed", [3, 4])
def test_float64_under_x64_equals_the_reference_to_rounding(seed):
    stats, mask, texts, ids, freq = random_batch(seed)
    extra = inputs(texts, ids, freq)
    tempered = random_tempered(stats, mask)
    want = method_references(stats, mask, METHODS, **extra, tempered=tempered, temperatures=TEMPERATURES)
    got = scores_x64(stats, mask, METHODS, ids=ids, zlib_bytes=extra["zlib_bytes"], tempered=tempered,
                     resources={"freq_table": freq, "acmia_temperature": TEMPERATURES,
                                "tag_tab_keywords": keywords_of(mask)})
    for m in METHODS:
        np.testing.assert_allclose(got[m], want[m], rtol=1e-11, atol=1e-13, equal_nan=True, err_msg=m)


def test_a_real_minus_inf_token_stays_minus_inf():
    stats, mask, texts, ids, freq = random_batch(0)
    got = jitted(stats, mask, texts, ids, freq, ("loss", "min_k@0.2", "max_k@0.2", "min_k_pp@0.2", "polarized"))
    for m in ("loss", "min_k@0.2", "min_k_pp@0.2", "polarized"):  # the least likely token is selected
        assert float(got[m][-1]) == -np.inf, m
    assert np.isfinite(float(got["max_k@0.2"][-1]))  # not among the most likely


def test_jit_vmap_grad_through_the_public_functions():
    stats, mask, _, ids, freq = random_batch(5, lengths=[20, 7, 0], T=24, minus_inf=False)
    lp, m = jnp.asarray(stats.logprob), jnp.asarray(mask)
    f = jax.jit(scorers.min_k, static_argnames="k")
    np.testing.assert_array_equal(f(lp, m, k=0.2), scorers.min_k(lp, m, k=0.2))
    # vmap over a leading axis: the same numbers as the batch
    stacked = jax.vmap(lambda a, b, c, d: scorers.min_k_pp(a, b, c, d, k=0.7))(
        *(jnp.stack([jnp.asarray(x)] * 2) for x in (stats.logprob, stats.mu, stats.var, mask)))
    np.testing.assert_allclose(stacked[1], scorers.min_k_pp(stats.logprob, stats.mu, stats.var, mask, k=0.7))
    # per-row vmap (1-D rows) by name, the resource array not mapped
    names = ["loss", "gap_k@0.2", "camia_slope", "camia_calibrated", "dc_pdd"]
    res = {"freq_table": jnp.asarray(freq, jnp.float32)}
    one = jax.vmap(lambda s, mm, i: device_scores(s, mm, names, ids=i, resources=res))(
        TokenStats(*map(jnp.asarray, stats)), m, jnp.asarray(ids))
    whole = device_scores(TokenStats(*map(jnp.asarray, stats)), m, names, ids=ids, resources=res)
    for name in one:
        np.testing.assert_allclose(one[name], whole[name], rtol=1e-6, equal_nan=True)
    # grad: 1/count on exactly the selected tokens of min_k; 1/n on every scored token of loss
    g = np.asarray(jax.grad(lambda x: scorers.min_k(x, m, k=0.2)[0])(lp))
    want = np.zeros_like(g)
    want[0, np.argsort(np.where(mask[0], stats.logprob[0], np.inf))[:4]] = 0.25  # 4 lowest of 20
    np.testing.assert_array_equal(g, want)
    np.testing.assert_allclose(np.asarray(jax.grad(lambda x: scorers.loss(x, m)[1])(lp))[1][mask[1]], 1 / 7)


def test_gradients_are_finite_and_zero_outside_the_mask():
    """Padding filled with zeros or garbage (var 0, rank 0, NaN) leaks into neither the scores nor the gradients."""
    stats, mask, texts, ids, freq = random_batch(6, lengths=[5, 12, 0, 2], T=16, minus_inf=False)
    s = TokenStats(*map(jnp.asarray, stats))
    zb = jnp.asarray([zlib_bytes(t) for t in texts], jnp.float32)
    extra = dict(ids=jnp.asarray(ids), zlib_bytes=zb, resources=resources_of(freq, mask),
                 tempered=TemperedStats(*map(jnp.asarray, random_tempered(stats, mask))))
    for m in METHODS:
        for field in ("logprob", "mu", "var", "max_logprob"):
            g = jax.grad(lambda x: jnp.nansum(device_scores(s._replace(**{field: x}), mask, (m,), **extra)[m]))(
                getattr(s, field))
            assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[~mask] == 0), (m, field)


def test_k_count_is_exact_for_any_k_and_length():
    """The traced count is k_count itself (no int32 overflow: n * 1234567 > 2**31 for n = 20000)."""
    assert k_count(0.7, 90) == 63 and k_count(0.3, 10) == 3 and k_count(0.1 + 0.2, 1000) == 300
    n, k = 20000, 0.1234567
    lp = -jnp.arange(n, dtype=jnp.float32)[None]
    got = float(jax.jit(scorers.min_k, static_argnames="k")(lp, jnp.ones((1, n), bool), k=k)[0])
    assert count(k, n) == int(k_count(k, n)) == 2469  # floor(20000 * 0.1234567)
    assert got == pytest.approx(-np.arange(n)[::-1][:2469].mean(), rel=1e-6)


def test_bf16_statistics_are_scored_in_float32():
    stats, mask, texts, ids, freq = random_batch(8, lengths=[7, 30], T=32, minus_inf=False)
    low = TokenStats(*(jnp.asarray(x).astype(jnp.bfloat16) if x.dtype == np.float32 else jnp.asarray(x)
                       for x in stats))
    got = device_scores(low, jnp.asarray(mask), ("loss", "min_k_pp@0.2"))
    want = method_references(TokenStats(*(np.asarray(x, np.float32) for x in low)), mask, ("loss", "min_k_pp@0.2"))
    for m, v in got.items():
        assert v.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(v, np.float64), want[m], rtol=1e-5)


def test_bad_arguments_are_user_errors_naming_what_to_pass():
    stats, mask, texts, ids, freq = random_batch(0)
    s, m = TokenStats(*map(jnp.asarray, stats)), jnp.asarray(mask)
    cases = [((s, m, ["lowercase"]), {}, "second pass"), ((s, m, ["min_k"]), {}, "needs a fraction"),
             ((s, m, ["nope"]), {}, "unknown method"), ((s, m, "loss"), {}, "tuple or list"),
             ((s, m, ["zlib"]), {}, r"zlib_bytes=.*scorers.zlib_bytes\(text\)"),
             ((s, m, ["camia_calibrated", "dc_pdd"]), {}, "camia_calibrated, dc_pdd need ids="),
             ((s, m, ["dc_pdd"]), {"ids": ids}, "needs a freq_table: make one"),
             ((s, m[:, :5], ["loss"]), {}, r"mask has shape \(8, 5\), expected \(8, 96\)"),
             ((s, m, ["zlib"]), {"zlib_bytes": np.ones(3)}, "zlib_bytes has shape")]
    for args, kw, match in cases:
        with pytest.raises(UserError, match=match):
            device_scores(*args, **kw)
    with pytest.raises(UserError, match="second pass"):
        scores_from_logits(jnp.zeros((1, 3, 4)), jnp.zeros((1, 3), int), jnp.ones((1, 3)), methods=["ref"])
    with pytest.raises(UserError, match="tuple or list"):
        scores_from_logits(jnp.zeros((1, 3, 4)), jnp.zeros((1, 3), int), jnp.ones((1, 3)), methods="loss")
    with pytest.raises(UserError, match=r"attention_mask has shape \(1, 2\), expected \(1, 3\)"):
        scores_from_logits(jnp.zeros((1, 3, 4)), jnp.zeros((1, 3), int), jnp.ones((1, 2)))
    assert requirements(["loss", "zlib", "dc_pdd"]) == (True, True, ("freq_table",))
    assert requirements(["camia_calibrated"]) == (True, False, ())


def test_dc_pdd_ids_outside_the_table_are_refused_or_nan_under_a_trace():
    stats, mask, texts, ids, freq = random_batch(0)
    s, m = TokenStats(*map(jnp.asarray, stats)), jnp.asarray(mask)
    bad = ids.copy()
    bad[3, np.flatnonzero(mask[3])[0]] = V + 2  # a scored id past the table
    res = {"freq_table": jnp.asarray(freq, jnp.float32)}
    with pytest.raises(UserError, match=f"token id {V + 2} is outside the frequency table's vocabulary of {V}"):
        device_scores(s, m, ["dc_pdd"], ids=bad, resources=res)
    with pytest.raises(UserError, match=f"token id {V + 2} is outside"):  # the host check a jitted step runs before
        scorers.check_ids(["loss", "dc_pdd"], bad, mask, {"freq_table": freq})
    scorers.check_ids(["dc_pdd"], ids, mask, {"freq_table": freq})
    traced = jax.jit(lambda i: device_scores(s, m, ["dc_pdd"], ids=i, resources=res)["dc_pdd"])(jnp.asarray(bad))
    good = device_scores(s, m, ["dc_pdd"], ids=ids, resources=res)["dc_pdd"]
    assert np.isnan(traced[3]) and np.array_equal(np.isnan(np.delete(traced, 3)), np.isnan(np.delete(good, 3)))
    pad_only = ids.copy()
    pad_only[~mask] = -5  # padding ids are never read
    np.testing.assert_array_equal(device_scores(s, m, ["dc_pdd"], ids=pad_only, resources=res)["dc_pdd"], good)


def test_resource_arrays_from_what_the_cli_passes():
    table = FreqTable(np.array([3, 0, 1, 6]), "x")
    got = resource_arrays(["loss", "dc_pdd"], {"freq_table": table, "unused": 1})
    assert list(got) == ["freq_table"] and got["freq_table"].dtype == np.float32
    np.testing.assert_allclose(got["freq_table"], (np.array([3, 0, 1, 6]) + 1) / 14, rtol=1e-7)
    np.testing.assert_array_equal(resource_arrays(["dc_pdd"], {"freq_table": table.probabilities()})["freq_table"],
                                  got["freq_table"])
    assert resource_arrays(["loss"], None) == {}
    for bad in (np.zeros(3), np.ones((2, 2)) / 4, [], [0.5, 1.5]):
        with pytest.raises(UserError, match="1-D array of probabilities"):
            resource_arrays(["dc_pdd"], {"freq_table": bad})
    with pytest.raises(UserError, match="needs a freq_table"):
        resource_arrays(["dc_pdd"], {})
    # device_scores takes the table itself too (converted on the host)
    stats, mask, _, ids, _ = random_batch(1)
    ids = ids % 4
    a = device_scores(stats, mask, ["dc_pdd"], ids=ids, resources={"freq_table": table})["dc_pdd"]
    b = device_scores(stats, mask, ["dc_pdd"], ids=ids, resources=got)["dc_pdd"]
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("side", ["right", "left"])
def test_scores_from_logits_is_device_scores_on_hand_shifted_stats(side):
    rng = np.random.default_rng(11)
    B, T, Vv = 4, 12, 50
    lengths = np.array([12, 7, 2, 1])  # one text of 1 token: nothing to predict, NaN
    real = np.arange(T)[None] < lengths[:, None]
    if side == "left":
        real = real[:, ::-1]
    logits = jnp.asarray(rng.standard_normal((B, T, Vv)) * 2, jnp.float32)
    ids = rng.integers(0, Vv - 3, (B, T))
    methods = ("loss", "min_k@0.2", "min_k_pp@0.2", "camia_calibrated", "zlib", "dc_pdd")
    freq = jnp.asarray(FreqTable(rng.integers(0, 9, Vv), "x").probabilities(), jnp.float32)
    zb = jnp.arange(1.0, B + 1)
    fn = jax.jit(scores_from_logits, static_argnames=("methods", "vocab_size", "chunk_size"))
    got = fn(logits, jnp.asarray(ids), jnp.asarray(real.astype(np.int32)), methods=methods, vocab_size=Vv - 3,
             chunk_size=16, zlib_bytes=zb, resources={"freq_table": freq})
    # by hand: each row's real tokens, target t+1 predicted at t, both real
    mask = real[:, 1:] & real[:, :-1]
    stats = token_stats(logits[:, :-1], jnp.asarray(ids[:, 1:]), vocab_size=Vv - 3, chunk_size=16)
    want = device_scores(stats, mask, list(methods), ids=ids[:, 1:], zlib_bytes=zb, resources={"freq_table": freq})
    assert mask.sum(-1).tolist() == (lengths - 1).tolist()
    for m in methods:
        np.testing.assert_allclose(got[m], want[m], rtol=1e-6, equal_nan=True, err_msg=m)
        assert np.isnan(got[m][3]) and np.all(np.isfinite(got[m][:3])), m
    # the same text right- and left-padded scores the same
    row = np.asarray(ids[1][real[1]])
    other = scores_from_logits(logits[1:2, real[1]], row[None], np.ones((1, 7), int), methods=["loss"],
                               vocab_size=Vv - 3)
    np.testing.assert_allclose(other["loss"][0], got["loss"][1], rtol=1e-6)
    # the default methods need nothing but the logits
    assert set(scores_from_logits(logits, ids, real)) == set(scorers.LOGIT_METHODS)


# every module holding a registered scorer, and the helpers beside them
DOCTESTED = sorted({s.fn.__module__.rsplit(".", 1)[-1] for s in REGISTRY.values()} | {"reduce", "dispatch"})


@pytest.mark.parametrize("module", DOCTESTED)
def test_doctests(module):
    mod = importlib.import_module(f"mia_jax.scorers.{module}")
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0 and result.failed == 0, result
    documented = {n for n, s in REGISTRY.items() if s.fn.__module__ == mod.__name__}
    tested = {t.name.rsplit(".", 1)[-1] for t in doctest.DocTestFinder().find(mod) if t.examples}
    assert documented <= tested, documented - tested


SHARDED = r"""
import jax, jax.numpy as jnp, numpy as np, sys
sys.path.insert(0, sys.argv[1])
from jax.sharding import NamedSharding, PartitionSpec as P
from test_device_scores import METHODS, TEMPERATURES, random_batch, random_tempered, inputs, resources_of
from reference import method_references
from mia_jax import device_scores
from mia_jax.stats import TemperedStats, TokenStats
assert jax.device_count() == 8
stats, mask, texts, ids, freq = random_batch(3, lengths=[0, 1, 2, 3, 5, 20, 40, 90])
extra = inputs(texts, ids, freq)
mesh = jax.make_mesh((8,), ("data",))
rows, one = NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P("data"))
s = TokenStats(*(jax.device_put(jnp.asarray(x), rows) for x in stats))
m, i = jax.device_put(jnp.asarray(mask), rows), jax.device_put(jnp.asarray(ids), rows)
zb = jax.device_put(jnp.asarray(extra["zlib_bytes"], jnp.float32), one)
tempered = random_tempered(stats, mask)
t = TemperedStats(*(jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("data", None, None))) for x in tempered))
assert len(s.logprob.sharding.device_set) == 8 and s.logprob.addressable_shards[0].data.shape == (1, 96)
out = jax.jit(device_scores, static_argnames="methods")(s, m, methods=METHODS, ids=i, zlib_bytes=zb,
                                                        resources=resources_of(freq, mask), tempered=t)
want = method_references(stats, mask, METHODS, **extra, tempered=tempered, temperatures=TEMPERATURES)
for k in METHODS:
    assert len(out[k].sharding.device_set) == 8, k
    np.testing.assert_allclose(np.asarray(out[k], np.float64), want[k], rtol=2e-5, atol=2e-6, equal_nan=True)
print("ok")
"""


def test_on_batch_sharded_inputs():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    here = str(Path(__file__).parent)
    r = subprocess.run([sys.executable, "-c", SHARDED, here], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
