"""ACMIA (scorers.acmia): the kernel's tempered statistics against float64 NumPy (padding rows, -inf and NaN logits,
chunks, the hidden-state and vocabulary-sharded variants, the default path untouched), the three formulas from
logits against the float64 reference of tests/reference.py, the library's refusals, and ``mia-jax eval`` on the
tiny Llama (packed rows) against per-text float64 references, with --acmia-temperature's checks."""
import json
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import method_references, ref_tempered, ref_token_arrays

from mia_jax import batching, device_scores, models, scores_from_logits
from mia_jax.cli import main
from mia_jax.data import wikimia
from mia_jax.errors import UserError
from mia_jax.scorers import TokenBatch, acmia, resource_arrays, score_batch
from mia_jax.scorers.base import register
from mia_jax.engine.sharding import make_mesh
from mia_jax.stats import TemperedStats, TokenStats, token_stats, token_stats_from_hidden, \
    token_stats_from_hidden_sharded

ACMIA = ("acmia_ac", "acmia_derivac", "acmia_normac")


def logits_case(seed=0, shape=(2, 7), vocab=300):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((*shape, vocab)) * 3).astype(np.float32)
    logits[0, 1, :40] = -np.inf  # zero-probability tokens (not the target)
    logits[1, 2, 5] = 40.0  # one dominant token
    return logits, rng.integers(0, vocab - 20, shape)


def check_tempered(got: TemperedStats, logits, targets, temperatures, vocab_size=None):
    want = ref_tempered(logits, targets, temperatures, vocab_size)
    for name, g, w in zip(TemperedStats._fields, got, want):
        assert g.shape == w.shape and g.dtype == jnp.float32, name
        w = np.maximum(w, 1e-12) if name == "var_t" else w
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("chunk", [64, 300, 1000])
def test_tempered_statistics_equal_float64_and_leave_the_rest_exactly_as_they_are(chunk):
    logits, targets = logits_case()
    temps = (0.3, 1.0, 2.5)
    plain = token_stats(jnp.asarray(logits), jnp.asarray(targets), vocab_size=280, chunk_size=chunk)
    stats, tempered = token_stats(jnp.asarray(logits), jnp.asarray(targets), vocab_size=280, chunk_size=chunk,
                                  temperatures=jnp.asarray(temps))
    for name, a, b in zip(TokenStats._fields, plain, stats):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)  # bit for bit
    check_tempered(tempered, logits, targets, temps, vocab_size=280)
    np.testing.assert_array_equal(tempered.logprob_t[..., 1], stats.logprob)  # T = 1 is p itself: x / 1 == x


def test_hidden_state_and_vocabulary_sharded_variants():
    rng = np.random.default_rng(3)
    hidden = rng.standard_normal((2, 5, 16)).astype(np.float32)
    w = rng.standard_normal((503, 16)).astype(np.float32)
    bias = rng.standard_normal(503).astype(np.float32)
    targets = rng.integers(0, 500, (2, 5))
    temps = acmia.temperatures(0.7)
    stats, tempered = token_stats_from_hidden(hidden, w, targets, bias=bias, vocab_size=500, chunk_size=64,
                                              temperatures=temps)
    check_tempered(tempered, hidden @ w.T + bias, targets, temps, vocab_size=500)
    sharded = jax.jit(partial(token_stats_from_hidden_sharded, vocab_size=500, chunk_size=64,
                              mesh=make_mesh(devices=jax.devices()[:1])))  # jitted: eager shard_map is slow
    s2, t2 = sharded(hidden, w, targets, bias=bias, temperatures=temps)
    for a, b in zip((*stats, *tempered), (*s2, *t2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_the_compiled_kernel_never_forms_the_full_logits():
    b, t, d, v, c = 2, 8, 16, 65536, 4096
    args = jnp.ones((b, t, d)), jnp.ones((v, d)), jnp.zeros((b, t), jnp.int32)
    text = token_stats_from_hidden.lower(*args, chunk_size=c, temperatures=jnp.ones(2)).compile().as_text()
    wide = set(re.findall(rf"\w+\[[0-9,]*\b{v}\b[0-9,]*\]", text))
    assert wide == {f"f32[{v},{d}]"}, wide  # nothing as wide as the vocabulary but the unembedding itself
    assert f"f32[{b},{t},{c}]" in text


def test_a_nan_logit_and_a_bad_temperature_give_nan_where_they_are():
    logits, targets = logits_case(4)
    temps = jnp.asarray([0.5, 2.0])
    _, clean = token_stats(jnp.asarray(logits), jnp.asarray(targets), chunk_size=64, temperatures=temps)
    logits[1, 3, 150] = np.nan
    stats, got = token_stats(jnp.asarray(logits), jnp.asarray(targets), chunk_size=64, temperatures=temps)
    broken = np.zeros(targets.shape, bool)
    broken[1, 3] = True
    assert np.isnan(stats.logprob[broken]).all()
    for name, g, c in zip(TemperedStats._fields, got, clean):
        g = np.asarray(g)
        assert np.isnan(g[broken]).all() and not np.isnan(g[~broken]).any(), name
        np.testing.assert_array_equal(g[~broken], np.asarray(c)[~broken], err_msg=name)
    for bad in (0.0, -1.0, np.inf, np.nan):  # NaN at that temperature only
        _, t = token_stats(jnp.asarray(logits), jnp.asarray(targets), chunk_size=64,
                           temperatures=jnp.asarray([0.5, bad]))
        for name, x, c in zip(TemperedStats._fields, t, clean):
            assert np.isnan(np.asarray(x)[..., 1]).all(), (name, bad)
            np.testing.assert_array_equal(np.asarray(x)[~broken, 0], np.asarray(c)[~broken, 0], err_msg=name)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_the_formulas_from_logits_equal_the_float64_reference(temperature):
    """scores_from_logits (shift, mask, kernel, formulas) on left-padded rows with repeated ids and a target of
    probability 0, against reference.py from float64 logits; AC is 0 at T = 1."""
    rng = np.random.default_rng(5)
    vocab, length = 60, 16
    ids = rng.integers(0, 12, (3, length))  # many repeats: first occurrences matter
    am = np.ones((3, length), int)
    am[2, :5] = 0  # left padding
    logits = (rng.standard_normal((3, length, vocab)) * 2).astype(np.float32)
    logits[1, 4, ids[1, 5]] = -np.inf  # row 1's sixth token has probability 0
    res = {"acmia_temperature": temperature}
    got = scores_from_logits(logits, ids, am, methods=ACMIA, resources=res, chunk_size=16)
    temps = resource_arrays(ACMIA, res)["acmia_temperature"]
    with np.errstate(invalid="ignore"):  # mu of a row with a -inf logit: unused here
        lp, mu, sigma, ent, rank = ref_token_arrays(logits[:, :-1], ids[:, 1:])
    stats = TokenStats(lp, mu, sigma ** 2, ent, rank, lp)
    mask = (am[:, 1:] & am[:, :-1]).astype(bool)
    want = method_references(stats, mask, ACMIA, ids=ids[:, 1:], tempered=TemperedStats(
        *ref_tempered(logits[:, :-1], ids[:, 1:], temps)), temperatures=temps)
    for m in ACMIA:
        np.testing.assert_allclose(np.asarray(got[m], np.float64), want[m], rtol=2e-5, atol=2e-6, err_msg=m)
    assert float(got["acmia_ac"][1]) == float(got["acmia_derivac"][1]) == -np.inf
    if temperature == 1.0:
        assert float(got["acmia_ac"][0]) == 0.0 == float(got["acmia_ac"][2])


def test_gradients_reach_only_the_first_occurrences():
    ids = jnp.asarray([[3, 4, 3, 5, 4]])
    mask = jnp.asarray([[True, True, True, True, False]])
    x = jnp.linspace(-3.0, -1.0, 10).reshape(1, 5, 2)
    temps = jnp.asarray(acmia.temperatures(2.0))
    g = jax.grad(lambda t: acmia.acmia_derivac(t, ids, mask, temperatures=temps)[0])(x)
    np.testing.assert_allclose(np.asarray(g)[0], [[1 / 3, -1 / 3], [1 / 3, -1 / 3], [0, 0], [1 / 3, -1 / 3], [0, 0]])


def test_what_the_library_refuses():
    logits, targets = logits_case(6)
    stats, tempered = token_stats(jnp.asarray(logits), jnp.asarray(targets), temperatures=acmia.temperatures(2.0))
    mask = np.ones(targets.shape, bool)
    with pytest.raises(UserError, match=r"acmia_ac, acmia_normac need tempered=.*temperatures="):
        device_scores(stats, mask, ["loss", "acmia_ac", "acmia_normac"], ids=targets)
    one = TemperedStats(*(x[..., :1] for x in tempered))
    with pytest.raises(UserError, match=r"tempered.logprob_t has shape \(2, 7, 1\), expected \(2, 7, 2\)"):
        device_scores(stats, mask, ["acmia_ac"], ids=targets, tempered=one)
    with pytest.raises(UserError, match="ACMIA reads 2 temperatures"):
        device_scores(stats, mask, ["acmia_derivac"], ids=targets, tempered=one,
                      resources={"acmia_temperature": np.array([2.0], np.float32)})
    with pytest.raises(UserError, match=r"need the tempered statistics \(TokenBatch.tempered"):
        score_batch(TokenBatch(stats, mask, ids=targets), ["acmia_normac"])
    for bad in (0, -1.0, float("nan"), float("inf"), "warm", [1.0, 2.0]):
        with pytest.raises(UserError, match="acmia_temperature must be one positive, finite temperature"):
            resource_arrays(["acmia_ac"], {"acmia_temperature": bad})
    with pytest.raises(UserError, match="temperatures must be a 1-D array"):
        token_stats(jnp.asarray(logits), jnp.asarray(targets), temperatures=jnp.ones((2, 2)))
    def toy(logprob_t, mask):
        """Reads tempered statistics without their temperatures."""
        return logprob_t.sum(-1)

    with pytest.raises(UserError, match="tempered statistics the resource keyword 'temperatures'"):
        register("toy_tempered")(toy)
    # the default temperature when none is given, the same as giving it
    a = score_batch(TokenBatch(stats, mask, ids=targets, tempered=tempered), ACMIA)
    b = device_scores(stats, mask, ACMIA, ids=targets, tempered=tempered,
                      resources={"acmia_temperature": acmia.DEFAULT_TEMPERATURE})
    for m in ACMIA:
        np.testing.assert_allclose(a[m], b[m], rtol=1e-6)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    ds = wikimia(32)
    rows = [{"input": t, "label": y} for t, y in list(zip(ds.texts, ds.labels))[:10]] + [{"input": "Hi", "label": 0}]
    path = tmp_path_factory.mktemp("acmia") / "small.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, [r["input"] for r in rows]


def refused(capsys, argv, needle):
    """One line on stderr holding ``needle``, exit status 2, no traceback."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_eval_scores_packed_rows_as_each_text_alone(tiny_llama_dir, data_file, tmp_path, capsys):
    path, texts = data_file
    out = tmp_path / "run"
    base = ["eval", "--model", str(tiny_llama_dir), "--data", str(path), "--n-bootstrap", "10", "--no-blind",
            "--no-progress"]
    assert main([*base, "--methods", *ACMIA, "loss", "--acmia-temperature", "0.5", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert json.loads((out / "config.json").read_text())["acmia_temperature"] == 0.5
    loaded = models.load(str(tiny_llama_dir))
    temps = acmia.temperatures(0.5)
    for text, rec in zip(texts, records):
        ids = loaded.tokenizer.encode(text).ids[: loaded.max_length]
        logits = np.asarray(loaded.model(jnp.asarray([ids], jnp.int32)), np.float64)[:, :-1]
        targets = np.asarray(ids[1:])[None]
        vocab = batching.real_vocab_size(loaded)
        lp, mu, sigma, ent, rank = ref_token_arrays(logits, targets, vocab_size=vocab)
        want = method_references(TokenStats(lp, mu, sigma ** 2, ent, rank, lp), np.ones(targets.shape, bool), ACMIA,
                                 ids=targets, tempered=TemperedStats(*ref_tempered(logits, targets, temps, vocab)),
                                 temperatures=temps)
        for m in ACMIA:
            assert np.isfinite(rec["scores"][m]), (m, text)
            np.testing.assert_allclose(rec["scores"][m], want[m][0], rtol=1e-4, atol=1e-5, err_msg=m)
    default = tmp_path / "default"
    assert main([*base, "--methods", "acmia_ac", "--out", str(default)]) == 0
    assert json.loads((default / "config.json").read_text())["acmia_temperature"] == acmia.DEFAULT_TEMPERATURE
    refused(capsys, [*base, "--methods", "loss", "--acmia-temperature", "2", "--out", str(tmp_path / "x")],
            "--acmia-temperature is given but no method among --methods uses it")
    refused(capsys, [*base, "--methods", "acmia_ac", "--acmia-temperature", "0", "--out", str(tmp_path / "y")],
            "--acmia-temperature: must be > 0.0")
    refused(capsys, [*base, "--methods", "acmia_normac", "--window", "8", "--out", str(tmp_path / "z")],
            "--window does not score acmia_normac")
    assert not any((tmp_path / d).exists() for d in "xyz")
