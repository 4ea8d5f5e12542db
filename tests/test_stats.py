"""token_stats against a float64 NumPy reference, including extreme and bf16 inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mia_jax.stats import VAR_FLOOR, token_stats, token_stats_from_hidden


def reference(logits, targets, vocab_size=None):
    x = np.asarray(logits, np.float64)
    if vocab_size is not None:
        x = x[..., :vocab_size]
    m = x.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(x - m).sum(-1))
    logp = x - lse[..., None]
    p = np.exp(logp)
    lp_t = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    mu = np.sum(np.where(p > 0, p * logp, 0.0), -1)
    var = np.sum(np.where(p > 0, p * (logp - mu[..., None]) ** 2, 0.0), -1)
    x_t = np.take_along_axis(x, targets[..., None], -1)[..., 0]
    rank = 1 + (x > x_t[..., None]).sum(-1)
    return dict(logprob=lp_t, mu=mu, var=np.maximum(var, VAR_FLOOR), entropy=-mu, rank=rank, max_logprob=logp.max(-1))


def assert_close(stats, ref, rtol=1e-5, atol=1e-5):
    for name, want in ref.items():
        got = np.asarray(getattr(stats, name), np.float64)
        assert np.all(np.isfinite(got)), name
        if name == "rank":
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            # relative error < rtol, with an absolute floor for values that are ~0 (e.g. var of a one-hot p)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)


def random_case(seed, shape=(2, 5), vocab=1000, scale=3.0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(shape + (vocab,)) * scale).astype(dtype)
    targets = rng.integers(0, vocab, size=shape)
    return logits, targets


@pytest.mark.parametrize("chunk", [1000, 128, 333, 4096])
def test_random_logits_match_float64(chunk):
    logits, targets = random_case(0)
    stats = token_stats(jnp.asarray(logits), jnp.asarray(targets), chunk_size=chunk)
    assert_close(stats, reference(logits, targets))


def test_extreme_values():
    logits, targets = random_case(1, scale=1.0)
    logits[0, 0, :] = 1e4 * np.sign(logits[0, 0, :])  # +-1e4 everywhere
    logits[0, 1, :] = -1e4
    logits[0, 1, 7] = 1e4  # one huge logit
    targets[0, 1] = 7
    logits[1, 2, :] = np.linspace(-1e4, 1e4, logits.shape[-1])
    logits[1, 3, 5] = 3e4  # single huge logit, target elsewhere: log p(target) ~ -3e4
    stats = token_stats(jnp.asarray(logits), jnp.asarray(targets), chunk_size=128)
    ref = reference(logits, targets)
    assert_close(stats, ref)
    assert np.asarray(stats.logprob)[0, 1] == 0.0
    assert np.asarray(stats.rank)[0, 1] == 1


def test_bfloat16_input():
    logits, targets = random_case(2, scale=5.0)
    bf = jnp.asarray(logits).astype(jnp.bfloat16)
    stats = token_stats(bf, jnp.asarray(targets), chunk_size=256)
    # the reference sees the same bf16-rounded values, so float32 statistics must match closely
    assert_close(stats, reference(np.asarray(bf.astype(jnp.float32)), targets))
    assert stats.logprob.dtype == jnp.float32


def test_padded_vocab_rows_are_masked():
    logits, targets = random_case(3, vocab=1000)
    targets = targets % 900
    logits[..., 900:] = 50.0  # huge padding logits must not matter
    stats = token_stats(jnp.asarray(logits), jnp.asarray(targets), vocab_size=900, chunk_size=256)
    assert_close(stats, reference(logits, targets, vocab_size=900))


def test_minus_inf_logits_get_zero_probability():
    logits, targets = random_case(4, vocab=300)
    targets = targets % 100
    logits[..., 200:] = -np.inf
    stats = token_stats(jnp.asarray(logits), jnp.asarray(targets), chunk_size=64)
    assert_close(stats, reference(logits[..., :200], targets))


def test_from_hidden_equals_logits_path():
    rng = np.random.default_rng(5)
    hidden = rng.standard_normal((3, 7, 32)).astype(np.float32)
    w = rng.standard_normal((1003, 32)).astype(np.float32)
    bias = rng.standard_normal(1003).astype(np.float32)
    targets = rng.integers(0, 1000, size=(3, 7))
    logits64 = hidden.astype(np.float64) @ w.T.astype(np.float64) + bias
    stats = token_stats_from_hidden(jnp.asarray(hidden), jnp.asarray(w), jnp.asarray(targets), bias=jnp.asarray(bias),
                                    vocab_size=1000, chunk_size=256)
    ref = reference(logits64, targets, vocab_size=1000)
    assert_close(stats, ref, rtol=1e-5, atol=1e-4)


def test_from_hidden_never_forms_full_logits():
    """The compiled program holds no [B, T, V] float32 buffer: only [B, T, chunk] ones."""
    b, t, d, v, c = 2, 8, 16, 65536, 4096
    hidden = jnp.ones((b, t, d), jnp.float32)
    w = jnp.ones((v, d), jnp.float32)
    targets = jnp.zeros((b, t), jnp.int32)
    compiled = token_stats_from_hidden.lower(hidden, w, targets, chunk_size=c).compile()
    text = compiled.as_text()
    assert f"f32[{b},{t},{v}]" not in text
    assert f"f32[{b},{t},{c}]" in text


def test_jit_and_vmap_compose():
    logits, targets = random_case(6, shape=(4, 3), vocab=50)
    f = jax.vmap(lambda logits, y: token_stats(logits, y, chunk_size=16).logprob)
    got = f(jnp.asarray(logits), jnp.asarray(targets))
    np.testing.assert_allclose(got, reference(logits, targets)["logprob"], rtol=1e-5)


def test_vocabulary_sharded_variant_on_one_device_equals_the_kernel():
    """The shard_map path (global ids, psum/pmax combination) on a 1-device mesh; 8-device meshes are
    checked in test_sharding.py."""
    from mia_jax.engine.sharding import make_mesh
    from mia_jax.stats import token_stats_from_hidden_sharded

    rng = np.random.default_rng(7)
    hidden = rng.standard_normal((2, 5, 16)).astype(np.float32)
    w = rng.standard_normal((503, 16)).astype(np.float32)
    bias = rng.standard_normal(503).astype(np.float32)
    targets = rng.integers(0, 500, size=(2, 5))
    want = token_stats_from_hidden(hidden, w, targets, bias=bias, vocab_size=500, chunk_size=64)
    got = token_stats_from_hidden_sharded(hidden, w, targets, bias=bias, vocab_size=500, chunk_size=64,
                                          mesh=make_mesh(devices=jax.devices()[:1]))
    for name in want._fields:
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-6, atol=1e-6, err_msg=name)


def test_default_chunk_is_per_backend(monkeypatch):
    """The scoring passes' vocabulary chunk: CPU_CHUNK on the CPU (a block of logits that stays in cache), the
    accelerators' DEFAULT_CHUNK elsewhere."""
    from mia_jax import stats as S
    assert S.default_chunk() == S.CPU_CHUNK != S.DEFAULT_CHUNK
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert S.default_chunk() == S.DEFAULT_CHUNK


FLOAT_STATS = ("logprob", "mu", "var", "entropy", "max_logprob")


@pytest.mark.parametrize("chunk", [1000, 64])
@pytest.mark.parametrize("where", [7, 999, 500])  # the first chunk, the last (clamped) one, the middle
def test_a_nan_logit_makes_its_positions_statistics_nan(chunk, where):
    """A NaN anywhere among a position's real vocabulary rows makes its every float statistic NaN (never dropped from
    the log-sum-exp as a zero-probability token would be); the other positions are untouched, and a NaN in a padding
    row (at or beyond vocab_size) changes nothing."""
    logits, targets = random_case(11, vocab=1000)
    clean = token_stats(jnp.asarray(logits), jnp.asarray(targets), chunk_size=chunk)
    logits[0, 2, where] = np.nan
    got = token_stats(jnp.asarray(logits), jnp.asarray(targets), chunk_size=chunk)
    broken = np.zeros(targets.shape, bool)
    broken[0, 2] = True
    for name in FLOAT_STATS:
        x = np.asarray(getattr(got, name))
        assert np.isnan(x[broken]).all() and not np.isnan(x[~broken]).any(), name
        np.testing.assert_array_equal(x[~broken], np.asarray(getattr(clean, name))[~broken], err_msg=name)
    if where >= 900:
        padded = token_stats(jnp.asarray(logits), jnp.asarray(targets % 900), vocab_size=900, chunk_size=chunk)
        assert_close(padded, reference(logits, targets % 900, vocab_size=900))


def test_a_nan_row_of_the_unembedding_makes_every_position_nan():
    """A NaN row of the LM head (a broken tied embedding) gives every position one NaN logit: every statistic NaN,
    in the hidden-state kernel and in its vocabulary-sharded variant; a NaN padding row changes nothing."""
    from mia_jax.engine.sharding import make_mesh
    from mia_jax.stats import token_stats_from_hidden_sharded

    rng = np.random.default_rng(12)
    hidden = rng.standard_normal((2, 5, 16)).astype(np.float32)
    w = rng.standard_normal((503, 16)).astype(np.float32)
    targets = rng.integers(0, 500, size=(2, 5))
    clean = token_stats_from_hidden(hidden, w, targets, vocab_size=500, chunk_size=64)
    w[501] = np.nan  # padding: masked
    padded = token_stats_from_hidden(hidden, w, targets, vocab_size=500, chunk_size=64)
    for name in clean._fields:
        np.testing.assert_array_equal(getattr(padded, name), getattr(clean, name), err_msg=name)
    w[42] = np.nan
    mesh = make_mesh(devices=jax.devices()[:1])
    for got in (token_stats_from_hidden(hidden, w, targets, vocab_size=500, chunk_size=64),
                token_stats_from_hidden_sharded(hidden, w, targets, vocab_size=500, chunk_size=64, mesh=mesh)):
        for name in FLOAT_STATS:
            assert np.isnan(np.asarray(getattr(got, name))).all(), name


@pytest.mark.parametrize("bad", ["int_logits", "float_targets", "shape"])
def test_the_kernel_refuses_what_it_cannot_compute(bad):
    """Integer logits, float targets and targets of another shape are one UserError, also under jax.jit."""
    from mia_jax.errors import UserError

    logits, targets = random_case(13, vocab=50)
    args = {"int_logits": (logits.astype(np.int32), targets), "float_targets": (logits, targets.astype(np.float32)),
            "shape": (logits, targets[:, :3])}[bad]
    with pytest.raises(UserError, match="logits|targets"):
        token_stats(jnp.asarray(args[0]), jnp.asarray(args[1]))
    with pytest.raises(UserError):
        jax.jit(lambda x, y: token_stats(x, y).logprob)(jnp.asarray(args[0]), jnp.asarray(args[1]))
