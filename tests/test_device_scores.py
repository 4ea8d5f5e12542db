"""mia_jax.device_scores: every single-pass scorer in jax.numpy, equal to the float64 host path (1e-5 relative in
float32), under jit / vmap / grad and on batch-sharded inputs; and the new host scorers against loop references."""
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mia_jax import device_scores
from mia_jax.scorers import REGISTRY, TokenBatch, expand_methods, k_count, score_batch
from mia_jax.scorers.device import FORMS
from mia_jax.scorers.likelihood import zlib_bytes
from mia_jax.stats import TokenStats

HOST_ONLY = {n for n, s in REGISTRY.items() if s.needs_ids or s.resources}  # dc_pdd: token ids + a frequency table
METHODS = tuple(expand_methods(sorted(set(REGISTRY) & set(FORMS)), [0.2, 0.7]))
LENGTHS = [0, 1, 2, 3, 4, 7, 20, 90]  # n = 90, k = 0.7 -> 63 tokens exactly (int(90 * 0.7) = 62)


def random_batch(seed=0, lengths=LENGTHS, T=96):
    rng = np.random.default_rng(seed)
    B = len(lengths)
    mask = np.arange(T)[None, :] < np.array(lengths)[:, None]
    mask = np.roll(mask, 1, axis=1)  # the scored tokens need not start at 0 (a prefix's context)
    mx = -rng.gamma(1.0, 0.3, (B, T))
    lp = mx - rng.gamma(2.0, 1.5, (B, T))
    mu = -rng.gamma(2.0, 1.5, (B, T))
    var = rng.gamma(2.0, 1.0, (B, T)) + 0.05
    stats = TokenStats(lp.astype(np.float32), mu.astype(np.float32), var.astype(np.float32), (-mu).astype(np.float32),
                       rng.integers(1, 500, (B, T)).astype(np.int32), mx.astype(np.float32))
    texts = [f"text {i} " * (i + 1) for i in range(B)]
    return stats, mask, texts


def host(stats, mask, texts, methods=METHODS):
    return score_batch(TokenBatch(stats, mask, texts), methods)


def dev(stats, mask, texts, methods=METHODS):
    zb = jnp.asarray([zlib_bytes(t) for t in texts], jnp.float32)
    return jax.jit(device_scores, static_argnames="methods")(TokenStats(*map(jnp.asarray, stats)), jnp.asarray(mask),
                                                             methods=methods, zlib_bytes=zb)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_device_equals_host(seed):
    stats, mask, texts = random_batch(seed)
    want, got = host(stats, mask, texts), dev(stats, mask, texts)
    for m in METHODS:
        g = np.asarray(got[m], np.float64)
        assert np.array_equal(np.isnan(g), np.isnan(want[m])), m  # rows without tokens: NaN on both
        np.testing.assert_allclose(g, want[m], rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=m)


def test_vmap_over_a_leading_axis_and_the_exact_k_count():
    stats, mask, texts = random_batch(4)
    methods = ("loss", "min_k@0.7", "gap_k@0.2")
    stacked = TokenStats(*(jnp.stack([jnp.asarray(x)] * 2) for x in stats))
    out = jax.vmap(lambda s, m: device_scores(s, m, methods))(stacked, jnp.stack([jnp.asarray(mask)] * 2))
    want = host(stats, mask, texts, methods)
    for m in methods:
        np.testing.assert_allclose(np.asarray(out[m][1], np.float64), want[m], rtol=1e-5, equal_nan=True)
    row = LENGTHS.index(90)  # min_k@0.7 over 90 tokens averages exactly 63 of them
    lp = np.sort(np.asarray(stats.logprob, np.float64)[row][mask[row]])
    assert float(out["min_k@0.7"][0][row]) == pytest.approx(lp[:63].mean(), rel=1e-6)


def test_grad_flows_to_the_selected_tokens():
    stats, mask, _ = random_batch(5, lengths=[20], T=24)
    s = TokenStats(*map(jnp.asarray, stats))
    f = lambda lp, name: device_scores(s._replace(logprob=lp), jnp.asarray(mask), (name,))[name][0]  # noqa: E731
    g_loss = np.asarray(jax.grad(f)(s.logprob, "loss"))
    np.testing.assert_allclose(g_loss[mask], 1 / 20, rtol=1e-6)
    assert np.all(g_loss[~mask] == 0)
    g_min = np.asarray(jax.grad(f)(s.logprob, "min_k@0.2"))  # 4 lowest of 20: 1/4 each, 0 elsewhere
    lowest = np.argsort(np.where(mask[0], stats.logprob[0], np.inf))[:4]
    want = np.zeros(24)
    want[lowest] = 0.25
    np.testing.assert_allclose(g_min[0], want, atol=1e-7)


def test_every_single_pass_scorer_has_a_device_form():
    missing = sorted(set(REGISTRY) - HOST_ONLY - set(FORMS))
    assert not missing, f"registered scorers without a device form: {missing}: add them to scorers/device.py FORMS"
    assert {"dc_pdd"} <= HOST_ONLY and set(FORMS) <= set(REGISTRY)


def test_zero_padding_gives_finite_gradients_and_the_same_scores():
    """Padding filled with zeros (var 0, rank 0) must not leak inf/NaN into the scores or the gradients."""
    stats, mask, texts = random_batch(6, lengths=[5, 12, 0], T=16)
    zeroed = TokenStats(*(np.where(mask, x, 0).astype(x.dtype) for x in stats))
    methods = tuple(m for m in METHODS if not m.startswith("zlib"))
    want = dev(stats, mask, texts, methods)
    got = dev(zeroed, mask, texts, methods)
    for m in methods:
        np.testing.assert_array_equal(np.asarray(got[m]), np.asarray(want[m]), err_msg=m)
        s = TokenStats(*map(jnp.asarray, zeroed))
        g = jax.grad(lambda lp: jnp.nansum(device_scores(s._replace(logprob=lp), jnp.asarray(mask), (m,))[m]))(
            s.logprob)
        assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[~mask] == 0), m


def test_k_count_is_the_host_rule_for_any_k_and_length():
    """The device count is k_count itself (no int32 overflow: n * 1234567 > 2**31 for n = 20000)."""
    n, k = 20000, 0.1234567
    lp = -np.arange(n, dtype=np.float32)[None]
    stats = TokenStats(lp, lp, np.ones_like(lp), lp, np.ones(lp.shape, np.int32), lp)
    mask = np.ones(lp.shape, bool)
    method = f"min_k@{k}"
    got = float(device_scores(TokenStats(*map(jnp.asarray, stats)), jnp.asarray(mask), (method,))[method][0])
    count = int(k_count(k, n))
    assert count == 2469  # floor(20000 * 0.1234567)
    assert got == pytest.approx(-np.arange(n)[::-1][:count].mean(), rel=1e-6)
    assert got == pytest.approx(score_batch(TokenBatch(stats, mask), [method])[method][0], rel=1e-6)


def test_bf16_statistics_are_scored_in_float32():
    stats, mask, texts = random_batch(8, lengths=[7, 30], T=32)
    low = TokenStats(*(jnp.asarray(x).astype(jnp.bfloat16) if x.dtype == np.float32 else jnp.asarray(x)
                       for x in stats))
    got = device_scores(low, jnp.asarray(mask), ("loss", "min_k_pp@0.2"))
    want = host(TokenStats(*(np.asarray(x, np.float32) for x in low)), mask, texts, ("loss", "min_k_pp@0.2"))
    for m, v in got.items():
        assert v.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(v, np.float64), want[m], rtol=1e-5)


def test_host_only_and_multi_pass_methods_are_refused():
    stats, mask, _ = random_batch(0)
    for m in ("dc_pdd", "lowercase"):
        with pytest.raises(ValueError, match="no device form"):
            device_scores(TokenStats(*map(jnp.asarray, stats)), jnp.asarray(mask), (m,))
    with pytest.raises(ValueError, match="zlib_bytes"):
        device_scores(TokenStats(*map(jnp.asarray, stats)), jnp.asarray(mask), ("zlib",))


def lowest(values, k):
    n = len(values)
    c = max(1, (n * Fraction(repr(k))).numerator // (n * Fraction(repr(k))).denominator)
    return float(np.mean(np.sort(values)[:c]))


def test_new_host_scorers_against_loops():
    stats, mask, texts = random_batch(7)
    got = host(stats, mask, texts, ("min_k_pp_mu@0.2", "min_k_pp_sigma@0.2", "gap_k@0.2", "gap_k@0.7"))
    s = TokenStats(*(np.asarray(x, np.float64) for x in stats))
    for r, n in enumerate(LENGTHS):
        sel = mask[r]
        if n == 0:
            assert all(np.isnan(v[r]) for v in got.values())
            continue
        lp, mu, sd, mx = s.logprob[r][sel], s.mu[r][sel], np.sqrt(s.var[r][sel]), s.max_logprob[r][sel]
        assert got["min_k_pp_mu@0.2"][r] == pytest.approx(lowest(lp - mu, 0.2), rel=1e-12)
        assert got["min_k_pp_sigma@0.2"][r] == pytest.approx(lowest(lp / sd, 0.2), rel=1e-12)
        gap = (lp - mx) / sd
        smooth = gap if n < 3 else np.convolve(gap, np.ones(3) / 3, mode="valid")  # the authors' smoothing
        for k in (0.2, 0.7):
            assert got[f"gap_k@{k:g}"][r] == pytest.approx(lowest(smooth, k), rel=1e-12)


SHARDED = r"""
import jax, jax.numpy as jnp, numpy as np, sys
sys.path.insert(0, sys.argv[1])
from jax.sharding import NamedSharding, PartitionSpec as P
from test_device_scores import METHODS, random_batch, host
from mia_jax import device_scores
from mia_jax.scorers.likelihood import zlib_bytes
from mia_jax.stats import TokenStats
assert jax.device_count() == 8
stats, mask, texts = random_batch(3, lengths=[0, 1, 2, 3, 5, 20, 40, 90])
mesh = jax.make_mesh((8,), ("data",))
rows = NamedSharding(mesh, P("data", None))
s = TokenStats(*(jax.device_put(jnp.asarray(x), rows) for x in stats))
m = jax.device_put(jnp.asarray(mask), rows)
zb = jax.device_put(jnp.asarray([zlib_bytes(t) for t in texts], jnp.float32), NamedSharding(mesh, P("data")))
assert len(s.logprob.sharding.device_set) == 8 and s.logprob.addressable_shards[0].data.shape == (1, 96)
out = jax.jit(device_scores, static_argnames="methods")(s, m, methods=METHODS, zlib_bytes=zb)
want = host(stats, mask, texts)
for k in METHODS:
    assert len(out[k].sharding.device_set) == 8, k
    np.testing.assert_allclose(np.asarray(out[k], np.float64), want[k], rtol=1e-5, atol=1e-6, equal_nan=True)
print("ok")
"""


def test_on_batch_sharded_inputs():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    here = str(Path(__file__).parent)
    r = subprocess.run([sys.executable, "-c", SHARDED, here], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_a_real_minus_inf_token_is_scored_as_on_the_host():
    stats, mask, texts = random_batch(9, lengths=[6, 4], T=8)
    stats = stats._replace(logprob=np.where(np.arange(8) == 2, -np.inf, stats.logprob).astype(np.float32))
    methods = ("loss", "min_k@0.5", "max_k@0.5", "gap_k@0.5", "polarized")
    want, got = host(stats, mask, texts, methods), dev(stats, mask, texts, methods)
    for m in methods:
        np.testing.assert_allclose(np.asarray(got[m], np.float64), want[m], rtol=1e-5, err_msg=m)
