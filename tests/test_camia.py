"""CAMIA: each single-pass trajectory feature against a float64 loop reference (padding, a prefix's masked context,
rows of 0-2 tokens); the text read after itself against the model's logits of the concatenated ids (with and without
BOS); ``camia_repeat`` end to end, the NaN of a text that alone fills the context."""
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from reference import scores_x64
from tokenizers import Tokenizer, processors

from mia_jax import batching, models
from mia_jax.evaluation import metrics
from mia_jax.engine import runner
from mia_jax.data import wikimia
from mia_jax import scorers
from mia_jax.scorers import TokenBatch, camia, score_batch
from mia_jax.stats import TokenStats

DATA = wikimia(32)
TEXTS = [" ".join(t.split()[:4]) for t in DATA.texts[:5]]  # short: two copies fit the tiny model's 64 tokens
SINGLE = ["camia_slope", "camia_count_1", "camia_count_2", "camia_count_3", "camia_count_pre", "camia_loss_200",
          "camia_loss_300", "camia_calibrated", "camia_ll_tail"]


# ------------------------------------------------------------------------------------- float64 loop references

def ref_lz(x, bins=3):
    """Lempel-Ziv complexity as the authors define it, written with explicit counts: level = how many of the 100
    edges from min(x) to 0 lie strictly below the value; bin = how many of the ``bins`` upper thresholds between the
    lowest and highest level lie strictly below the level; parse into sub-words not seen before."""
    edges = np.linspace(min(x), 0, 100)
    level = [sum(e < v for e in edges) for v in x]
    upper = np.linspace(min(level), max(level), bins + 1)[1:]
    seq = "".join(str(sum(u < lv for u in upper)) for lv in level)
    words, i, w = set(), 0, 1
    while i + w <= len(seq):
        if seq[i:i + w] in words:
            w += 1
        else:
            words.add(seq[i:i + w])
            i, w = i + w, 1
    return len(words) / len(seq)


def ref_features(x, ids):
    """Every single-pass feature of one row's log-probs ``x`` (in order) and target ids, as the authors' loops read."""
    x, n, nan = list(map(float, x)), len(x), float("nan")
    cum = [np.mean(x[:j]) for j in range(1, n + 1)]
    out = {
        "camia_slope": np.polyfit(np.arange(1, n + 1), cum, 1)[0] if n >= 2 else nan,
        "camia_count_pre": np.mean([x[t] > np.mean(x[:t]) for t in range(1, n)]) if n >= 2 else nan,
        "camia_calibrated": np.mean(x) / (len(set(ids)) / n) if n else nan,
        "lz": -ref_lz(x[:200]) if n else nan,
        "camia_ll_tail": np.mean(x[1:]) if n >= 2 else nan,
    }
    for tau in (1, 2, 3):
        out[f"camia_count_{tau}"] = np.mean(np.array(x[:200]) >= -tau) if n else nan
    for cut in (200, 300):
        out[f"camia_loss_{cut}"] = np.mean(x[:cut]) if n else nan
    return out


def hand_made_batch():
    """Rows: long (past both cut-offs), padded, a prefix's context masked in front, 2 tokens, 1 token, none; with
    log-probs exactly at the count thresholds and repeated ids."""
    rng = np.random.default_rng(0)
    b, t = 6, 330
    logprob = -rng.gamma(1.0, 1.5, (b, t))
    logprob[0, :6] = [-1.0, -2.0, -3.0, -0.5, -1.0, -2.0]  # on the thresholds: counted (log p >= -tau)
    ids = rng.integers(0, 40, (b, t))
    mask = np.zeros((b, t), bool)
    mask[0, :] = True
    mask[1, :57] = True
    mask[2, 12:80] = True  # read after a prefix: its context positions are not the text's
    mask[3, :2] = True
    mask[4, :1] = True
    stats = TokenStats(logprob, np.zeros((b, t)), np.ones((b, t)), np.ones((b, t)), np.ones((b, t)), np.zeros((b, t)))
    return TokenBatch(stats, mask, ["t"] * b, ids), logprob, ids, mask


def test_single_pass_features_match_the_loop_reference():
    """float64 (under x64) against the loops to rounding; float32 (the host path) to 1e-5."""
    batch, logprob, ids, mask = hand_made_batch()
    got = scores_x64(batch.stats, mask, SINGLE, ids=ids)
    got["lz"] = camia.lempel_ziv_scores(logprob, mask)
    for r in range(mask.shape[0]):
        want = ref_features(logprob[r][mask[r]], ids[r][mask[r]])
        for m in [*SINGLE, "lz"]:
            if np.isnan(want[m]):
                assert np.isnan(got[m][r]), f"{m} row {r}"
            else:
                np.testing.assert_allclose(got[m][r], want[m], rtol=1e-12, atol=1e-14, err_msg=f"{m} row {r}")
    f32 = score_batch(batch, SINGLE)
    for m in SINGLE:
        np.testing.assert_allclose(f32[m], got[m], rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=m)


def test_short_rows_are_nan_or_defined_as_documented():
    batch, *_ = hand_made_batch()
    got = score_batch(batch, SINGLE)
    two_or_more = {"camia_slope", "camia_count_pre", "camia_ll_tail"}
    for m in SINGLE:
        assert np.isnan(got[m][5]), m  # no token: NaN for every feature
        assert np.isnan(got[m][4]) == (m in two_or_more), m  # one token: only the trajectory needs two
        assert np.isfinite(got[m][3]), m  # two tokens: all defined
    assert got["camia_count_1"][4] in (0.0, 1.0)


def test_padding_and_context_change_nothing():
    batch, logprob, ids, mask = hand_made_batch()
    full = scores_x64(batch.stats, mask, SINGLE, ids=ids)
    for r in (1, 2):
        keep = mask[r]
        n = int(keep.sum())
        stats = TokenStats(*(np.asarray(x)[r][keep][None] for x in batch.stats))
        alone = scores_x64(stats, np.ones((1, n), bool), SINGLE, ids=ids[r][keep][None])
        for m in SINGLE:
            np.testing.assert_allclose(alone[m][0], full[m][r], rtol=1e-12, err_msg=m)


def test_public_functions_under_jit_in_float32_and_their_gradients():
    batch, logprob, ids, mask = hand_made_batch()
    lp32 = np.where(mask, logprob, 0.0).astype(np.float32)  # zero padding
    want = {r: ref_features(logprob[r][mask[r]], ids[r][mask[r]]) for r in range(mask.shape[0])}
    for name in SINGLE:
        fn = getattr(scorers, name)
        args = (jnp.asarray(lp32), jnp.asarray(ids), jnp.asarray(mask)) if name == "camia_calibrated" else (
            jnp.asarray(lp32), jnp.asarray(mask))
        got = jax.jit(fn)(*args)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got, np.float64), [want[r][name] for r in range(mask.shape[0])],
                                   rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=name)
        grad = jax.grad(lambda lp: jnp.nansum(fn(lp, *args[1:])))(jnp.asarray(lp32))
        assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[~mask] == 0), name
    slope = jax.grad(lambda lp: scorers.camia_slope(lp, jnp.asarray(mask))[1])
    assert np.abs(np.asarray(slope(jnp.asarray(lp32)))[1][mask[1]]).sum() > 0  # differentiable where it is


def test_trajectory_orientation():
    """A text whose loss keeps falling (a member, read as the paper describes) scores above a flat one of the same
    mean loss on the trajectory features."""
    n = 60
    falling = np.linspace(-4.0, -0.5, n)  # log p rising: loss falling
    flat = np.full(n, falling.mean()) + 0.3 * np.sin(np.arange(n))
    lp = np.stack([falling, flat])
    stats = TokenStats(lp, *(np.ones_like(lp),) * 5)
    got = score_batch(TokenBatch(stats, np.ones_like(lp, bool)), ["camia_slope", "camia_count_pre"])
    assert got["camia_slope"][0] > 0 and got["camia_slope"][0] > got["camia_slope"][1]
    assert got["camia_count_pre"][0] == 1.0 > got["camia_count_pre"][1]


def test_lempel_ziv_parse():
    # levels 0..99 from min to 0: two distinct values give a two-symbol sequence; "100111" -> 1, 0, 01, 11: 4/6
    x = np.array([0.0, -1.0, -1.0, 0.0, 0.0, 0.0])
    assert camia.lempel_ziv(x, bins=2) == pytest.approx(4 / 6) == ref_lz(list(x), bins=2)
    assert np.isnan(camia.lempel_ziv(np.zeros(0)))


# ------------------------------------------------------------------------------------------- the model passes

@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def tiny_bos(tiny_llama_dir, tmp_path_factory):
    """The same weights with a tokenizer that adds BOS (<|endoftext|>, the config's bos_token_id)."""
    folder = tmp_path_factory.mktemp("tiny_bos")
    for f in tiny_llama_dir.iterdir():
        shutil.copy(f, folder / f.name)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>",
                                                                                                    bos)])
    tok.save(str(folder / "tokenizer.json"))
    loaded = models.load(str(folder))
    assert loaded.add_bos and loaded.tokenizer.encode("a b").ids[0] == bos
    return loaded


_FORWARD = {}


def token_logprobs(loaded, ids) -> np.ndarray:
    """float64 log p(ids[t] | ids[:t]) for t >= 1, from the model's logits and a NumPy log-softmax (one jitted
    forward per model: the ids right-padded to the context, which a causal model's real positions never see)."""
    if id(loaded) not in _FORWARD:
        graphdef, state = nnx.split(loaded.model)
        fn = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))
        _FORWARD[id(loaded)] = lambda x: fn(state, x)
    padded = np.zeros((1, loaded.max_length), np.int32)
    padded[0, : len(ids)] = ids
    logits = np.asarray(_FORWARD[id(loaded)](jnp.asarray(padded))[0, : len(ids)], np.float64)
    logits = logits[:, : batching.real_vocab_size(loaded)]  # padded vocabulary rows have no probability
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return np.array([logp[t - 1, ids[t]] for t in range(1, len(ids))])


def alone_and_repeated(loaded, text):
    """(log-probs of the text alone, of its second copy after the first), the copy without the BOS it may add."""
    ids = loaded.tokenizer.encode(text).ids
    second = ids[1:] if loaded.add_bos and ids[:1] == [loaded.bos_token_id] else ids
    full = ids + second
    return token_logprobs(loaded, ids), token_logprobs(loaded, full)[len(ids) - 1:], len(ids)


@pytest.mark.parametrize("which", ["tiny", "tiny_bos"])
def test_text_read_after_itself_scores_its_second_copy(which, request):
    loaded = request.getfixturevalue(which)
    recs = runner.score_texts(loaded, TEXTS, ["loss"], prefixes=TEXTS, progress=False)
    got = metrics.scores_by_method(recs, ["loss"])["loss"]
    refs = [alone_and_repeated(loaded, t) for t in TEXTS]
    np.testing.assert_allclose(got, [second.mean() for _, second, _ in refs], rtol=1e-5)
    assert [r["n_context"] for r in recs] == [n for *_, n in refs]
    assert not any(r.get("truncated") for r in recs)


@pytest.mark.parametrize("which", ["tiny", "tiny_bos"])
def test_camia_repeat_end_to_end(which, request, tmp_path):
    loaded = request.getfixturevalue(which)
    report = {}
    recs = runner.score_dataset(loaded, TEXTS, ["camia_repeat", "camia_slope"], out_dir=tmp_path, progress=False,
                                report=report)
    s = metrics.scores_by_method(recs, ["camia_repeat", "camia_slope"])
    want_repeat, want_slope = [], []
    for t in TEXTS:
        alone, second, _ = alone_and_repeated(loaded, t)
        want_repeat.append(alone.mean() - second[-alone.size:].mean())  # the same tokens in both means
        cum = np.cumsum(alone) / np.arange(1, alone.size + 1)
        want_slope.append(np.polyfit(np.arange(1, alone.size + 1), cum, 1)[0])
    np.testing.assert_allclose(s["camia_repeat"], want_repeat, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s["camia_slope"], want_slope, rtol=1e-4, atol=1e-6)
    assert sorted(report) == ["main", "repeat"]
    scored = "loss" if loaded.add_bos else "camia_ll_tail"
    rec = json.loads((tmp_path / "passes" / "repeat.jsonl").read_text().splitlines()[0])
    assert list(rec["scores"]) == [scored]


def test_text_filling_the_context_is_nan_with_the_reason(tiny, tmp_path):
    long_text = " ".join(DATA.texts[40:48])  # alone more than the tiny model's 64 tokens
    medium = " ".join(DATA.texts[6].split()[:14])  # over half the context: the first copy is cut from its start
    exact = next(long_text[:c] for c in range(len(long_text))  # exactly the context: nothing of it is cut
                 if len(tiny.tokenizer.encode(long_text[:c]).ids) == tiny.max_length)
    texts = [TEXTS[0], long_text, medium, exact]
    n_medium = len(tiny.tokenizer.encode(medium).ids)
    assert len(tiny.tokenizer.encode(long_text).ids) > tiny.max_length > n_medium > tiny.max_length // 2
    recs = runner.score_dataset(tiny, texts, ["loss", "camia_repeat"], out_dir=tmp_path, progress=False)
    assert recs[0]["scores"]["camia_repeat"] is not None and "nan_reasons" not in recs[0]
    for r in (recs[1], recs[3]):  # scored alone, but no room for a copy before it
        assert r["scores"]["loss"] is not None and r["scores"]["camia_repeat"] is None and "skip_reason" not in r
        assert "cannot be read after itself" in r["nan_reasons"]["camia_repeat"]
    # the medium text: its second copy read after the end of the first (the context keeps the last tokens)
    ids = tiny.tokenizer.encode(medium).ids
    keep = ids[len(ids) - (tiny.max_length - n_medium):]
    alone = token_logprobs(tiny, ids)
    second = token_logprobs(tiny, keep + ids)[len(keep) - 1:]
    np.testing.assert_allclose(recs[2]["scores"]["camia_repeat"], alone.mean() - second[1:].mean(), rtol=1e-4,
                               atol=1e-5)
    pass_recs = [json.loads(line) for line in (tmp_path / "passes" / "repeat.jsonl").read_text().splitlines()]
    assert pass_recs[2]["truncated"] and pass_recs[2]["n_context"] == len(keep)
