"""mia_jax.models.attention: every implementation against a float64 NumPy reference (GQA, causal, sliding windows,
query offsets, key padding, explicit masks, softcap, rows that see no key), the chunked path's gradient against
the full path's, traced options inside jit / scan, implementation choice, and linear memory of the chunked path."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_chunked_gradient_matches_full

from mia_jax.errors import UserError
from mia_jax.models import attention as A
from mia_jax.models import layers as L


def reference(q, k, v, scale, visible, softcap=None):
    """float64 attention; visible bool [B, T, S]. A row that sees no key averages every value (softmax of equal
    scores), as the pre-issue-14 code did."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, H, Dh = q.shape
    G = H // k.shape[2]
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)  # head h uses kv head h // G
    s = np.einsum("bthd,bshd->bhts", q, k) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    vis = np.broadcast_to(np.asarray(visible, bool)[:, None], s.shape)
    s = np.where(vis, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.where(vis, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    total = p.sum(-1, keepdims=True)
    p = np.where(total > 0, p / np.where(total > 0, total, 1.0), 1.0 / s.shape[-1])
    return np.einsum("bhts,bshd->bthd", p, v)


def numpy_visible(B, T, S, causal=False, sliding_window=None, q_offset=0, key_mask=None, mask=None):
    i = q_offset + np.arange(T)[:, None]
    j = np.arange(S)[None, :]
    vis = np.broadcast_to((j <= i) if causal else np.ones((T, S), bool), (B, T, S))
    if sliding_window is not None:
        vis = vis & (i - j < sliding_window)
    if key_mask is not None:
        vis = vis & np.asarray(key_mask, bool)[:, None, :]
    if mask is not None:
        vis = vis & np.asarray(mask, bool)
    return vis


def qkv(seed, B, T, S, H, KV, Dh, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(shape).astype(dtype))
                 for shape in ((B, T, H, Dh), (B, S, KV, Dh), (B, S, KV, Dh)))


def _case_options(name, B, T, S, rng):
    if name == "causal":
        return dict(causal=True)
    if name == "decode":  # a cache: new queries at slots S-T.., left padding (row 1 has 7 pads), a window
        key_mask = np.ones((B, S), bool)
        key_mask[1, :7] = False
        return dict(causal=True, q_offset=S - T, key_mask=jnp.asarray(key_mask), sliding_window=20)
    if name == "prefill":  # the same from an empty cache: row 1's first query sees only pads
        key_mask = np.ones((B, S), bool)
        key_mask[1, :3] = False
        return dict(causal=True, key_mask=jnp.asarray(key_mask), sliding_window=5)
    if name == "mask":  # explicit per-row mask (row 0, query 3 sees nothing) and a softcap
        mask = rng.random((B, T, S)) > 0.4
        mask[0, 3] = False
        return dict(mask=jnp.asarray(mask), softcap=2.0)
    if name == "bidirectional":  # BERT-like: key padding only, row 1 fully padded
        key_mask = rng.random((B, S)) > 0.3
        key_mask[1] = False
        return dict(key_mask=jnp.asarray(key_mask))
    raise ValueError(name)


# (name, B, T, S, H, KV, Dh): T / S not multiples of the 16 / 8 blocks used; GQA 2, MQA, GQA 3, MHA
CASES = [("causal", 2, 37, 37, 4, 2, 16), ("decode", 2, 5, 35, 6, 2, 8), ("prefill", 2, 21, 21, 3, 1, 8),
         ("mask", 2, 19, 21, 6, 2, 8), ("bidirectional", 2, 13, 13, 3, 3, 8)]


def _run_case(case, seed=1):
    name, B, T, S, H, KV, Dh = case
    opts = _case_options(name, B, T, S, np.random.default_rng(len(name)))
    q, k, v = qkv(seed, B, T, S, H, KV, Dh)
    vis = numpy_visible(B, T, S, **{k_: v_ for k_, v_ in opts.items() if k_ != "softcap"})
    return opts, (q, k, v), vis


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_implementations_match_float64_reference_and_each_other(case):
    opts, (q, k, v), vis = _run_case(case)
    B, T, H, Dh = q.shape
    softcap = opts.pop("softcap", None)

    @jax.jit
    def run(q, k, v):
        out = {impl: A.attention(q, k, v, implementation=impl, block_q=16, block_k=8, softcap=softcap, **opts)
               for impl in ("full", "chunked")}
        out["dot_product"] = A.attention(q, k, v, implementation="dot_product", **opts)  # no softcap there
        return out

    got = {impl: np.asarray(x) for impl, x in run(q, k, v).items()}
    want = reference(q, k, v, Dh ** -0.5, vis, softcap)
    for impl, out in got.items():
        assert out.dtype == np.float32 and out.shape == (B, T, H, Dh)
        np.testing.assert_allclose(out, want if impl != "dot_product" else reference(q, k, v, Dh ** -0.5, vis),
                                   rtol=1e-5, atol=2e-6, err_msg=impl)
    np.testing.assert_allclose(got["chunked"], got["full"], rtol=0, atol=1.5e-6)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("decode", "mask")], ids=lambda c: c[0])
def test_chunked_gradient_matches_full(case):
    """decode: offset, key padding, window, empty rows; mask: explicit mask with an empty row, softcap."""
    opts, (q, k, v), _ = _run_case(case, seed=2)
    assert_chunked_gradient_matches_full(q, k, v, block_q=16, block_k=8, **opts)


def test_traced_scale_offset_and_window_inside_scan():
    """What the families pass: a per-layer scale and sliding flag scanned with the parameters, the cache index as a
    traced offset; the chunked path takes them all traced."""
    B, T, S, H, KV, Dh = 1, 6, 30, 4, 2, 8
    q, k, v = qkv(4, B, T, S, H, KV, Dh)
    key_mask = jnp.ones((B, S), bool).at[0, :3].set(False)
    scales, sliding = jnp.asarray([0.3, 0.5]), jnp.asarray([False, True])

    @jax.jit
    def run(q, k, v, index):
        def layer(_, xs):
            scale, slide = xs
            window = jnp.where(slide, 4, S)
            return None, A.attention(q, k, v, scale=scale, causal=True, q_offset=index, sliding_window=window,
                                     key_mask=key_mask, implementation="chunked", block_q=4, block_k=8)
        return jax.lax.scan(layer, None, (scales, sliding))[1]

    got = np.asarray(run(q, k, v, jnp.int32(20)))
    for n, (scale, window) in enumerate([(0.3, None), (0.5, 4)]):
        vis = numpy_visible(B, T, S, causal=True, q_offset=20, sliding_window=window, key_mask=key_mask)
        np.testing.assert_allclose(got[n], reference(q, k, v, scale, vis), rtol=1e-5, atol=2e-6)


def test_bfloat16_inputs_give_bfloat16_close_to_float32():
    q, k, v = qkv(5, 1, 40, 40, 4, 2, 16)
    want = reference(q, k, v, 0.25, numpy_visible(1, 40, 40, causal=True))
    run = jax.jit(lambda q, k, v: {impl: A.attention(q, k, v, causal=True, implementation=impl, block_q=16,
                                                     block_k=16) for impl in ("full", "chunked")})
    for impl, out in run(*(x.astype(jnp.bfloat16) for x in (q, k, v))).items():
        assert out.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=3e-2, err_msg=impl)


def test_layers_helpers_keep_their_contract():
    """The family-facing helpers in layers.py: same masks and results as before issue 14."""
    cache = {"k": jnp.zeros((1, 2, 10, 1, 4)), "index": jnp.int32(4)}
    key_mask = jnp.asarray([[True] * 10, [False] * 2 + [True] * 8])
    q, k, v = qkv(6, 2, 9, 9, 4, 2, 8)

    @jax.jit
    def run(q, k, v):
        return (L.causal_mask(6, None), L.causal_mask(6, 2), *L.cache_masks(cache, 3, key_mask, 2),
                L.gqa_attention(q, k, v, L.causal_mask(9, None), 0.4),
                L.causal_attention(q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2), 0.4))

    causal, window, full_c, window_c, gqa, mha = (np.asarray(x) for x in run(q, k, v))
    tril = np.tril(np.ones((6, 6), bool))
    np.testing.assert_array_equal(causal, tril)
    np.testing.assert_array_equal(window, tril & ~np.tril(np.ones((6, 6), bool), -2))
    np.testing.assert_array_equal(full_c, numpy_visible(2, 3, 10, causal=True, q_offset=4, key_mask=key_mask))
    np.testing.assert_array_equal(window_c, numpy_visible(2, 3, 10, causal=True, q_offset=4, key_mask=key_mask,
                                                          sliding_window=2))
    want = reference(q, k, v, 0.4, numpy_visible(2, 9, 9, causal=True))
    np.testing.assert_allclose(gqa, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(mha, want, rtol=1e-5, atol=2e-6)


def test_implementation_choice(monkeypatch):
    monkeypatch.delenv(A.ENV, raising=False)
    n = int(np.sqrt(A.CHUNKED_MIN_SCORES))
    assert A.implementation_for(n - 1, n) == "full"
    assert A.implementation_for(n, n) == "chunked"
    assert A.implementation_for(1, n * n) == "chunked"  # one new token over a huge cache
    assert A.implementation_for(n, n, "full") == "full"
    monkeypatch.setenv(A.ENV, "chunked")
    assert A.implementation_for(8, 8) == "chunked"
    assert A.implementation_for(8, 8, "full") == "full"  # the argument wins over the environment
    monkeypatch.setenv(A.ENV, "flash")
    with pytest.raises(UserError, match=r"\$MIA_JAX_ATTENTION='flash' is not one of auto, full, dot_product"):
        A.implementation_for(8, 8)
    with pytest.raises(UserError, match="no softcap"):
        A.implementation_for(8, 8, "dot_product", softcap=30.0)


def test_gpu_auto_gives_cudnn_packed_rows_up_to_its_limit(monkeypatch):
    monkeypatch.delenv(A.ENV, raising=False)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    bf16, limit, packed = jnp.bfloat16, A.CUDNN_MASK_MAX_SCORES, dict(structural_only=False, segments_only=True)
    assert A.implementation_for(512, 512, dtype=bf16, **packed) == "dot_product"  # packed rows
    assert A.implementation_for(limit, 1, dtype=bf16, **packed) == "dot_product"
    assert A.implementation_for(limit + 1, 1, dtype=bf16, **packed) == "chunked"
    assert A.implementation_for(8192, 8192, dtype=bf16) == "dot_product"  # flags only: no mask to hold
    assert A.implementation_for(512, 512, dtype=bf16, structural_only=False) == "chunked"  # a key mask: as before
    assert A.implementation_for(512, 512, dtype=jnp.float32, **packed) == "chunked"
    assert A.implementation_for(512, 512, dtype=bf16, softcap=30.0, **packed) == "chunked"
    seen = []  # and attention() tells packed rows apart from other masks
    monkeypatch.setattr(A, "_dot_product", lambda *a: seen.append("dot_product"))
    q = jnp.zeros((1, 8, 2, 8), bf16)
    seg = jnp.array([[1, 1, 1, 2, 2, 2, 0, 0]])
    A.attention(q, q, q, causal=True, segment_ids=seg)
    A.attention(q, q, q, causal=True, key_mask=jnp.ones((1, 8), bool))
    assert seen == ["dot_product"]


def _lowered(T, impl, grad=False):
    q = jax.ShapeDtypeStruct((1, T, 2, 16), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, T, 1, 16), jnp.float32)
    f = lambda q, k, v: A.attention(q, k, v, causal=True, implementation=impl)  # noqa: E731
    if grad:
        f = jax.grad(lambda q, k, v, f=f: f(q, k, v).sum(), argnums=(0, 1, 2))
    return jax.jit(f).lower(q, kv, kv)


def test_chunked_memory_is_linear_in_length():
    """Compiled temporary memory from T = 2048 to 4096: x4 for the full path (its [T, S] scores), under x2.5 for
    the chunked one; and neither the chunked forward nor its gradient (the custom VJP recomputes the blocks)
    has a tensor anywhere near [T, S] in its program."""
    temp = {(impl, T): _lowered(T, impl).compile().memory_analysis().temp_size_in_bytes
            for impl in ("chunked", "full") for T in (2048, 4096)}
    assert temp["full", 4096] / temp["full", 2048] > 3.5  # the measure sees quadratic memory when it is there
    assert temp["chunked", 4096] / temp["chunked", 2048] < 2.5
    assert temp["chunked", 4096] < temp["full", 4096] / 20
    for grad in (False, True):
        text = _lowered(4096, "chunked", grad).as_text()
        shapes = [[int(d) for d in s.split("x")] for s in re.findall(r"tensor<([0-9x]+)x[a-z]", text)]
        assert shapes and max(int(np.prod(s)) for s in shapes) < 4096 * 4096 // 8
    full_text = _lowered(4096, "full", grad=True).as_text()
    assert "4096x4096" in full_text  # the pattern does find [T, S] tensors


@pytest.mark.parametrize("T,S,causal,with_mask", [(7, 7, True, False), (7, 7, False, False), (6, 7, False, True),
                                                  (7, 7, True, True), (6, 6, True, False)])
def test_cudnn_call_is_padded_to_even_lengths(monkeypatch, T, S, causal, with_mask):
    """cuDNN's backward refuses odd lengths, so `_cudnn` pads them; with the cuDNN call routed to XLA here (no GPU)
    the padded call gives the unpadded output and gradients, and cuDNN only ever sees even lengths."""
    real = jax.nn.dot_product_attention
    seen = []

    def routed(q, k, v, *, implementation=None, **kw):
        seen.append((q.shape[1], k.shape[1]))
        return real(q, k, v, implementation="xla", **kw)

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, n, 4, 8)), jnp.float32) for n in (T, S, S))
    kw = {"scale": 0.3, "is_causal": causal} if not with_mask else {"scale": 0.3, "mask": jnp.asarray(
        rng.random((2, 1, T, S)) < 0.7).at[..., 0].set(True)}

    def loss(fn, q, k, v):
        return jnp.sum(jnp.sin(fn(q, k, v)))

    expected = jax.value_and_grad(lambda *a: loss(lambda q, k, v: real(q, k, v, implementation="xla", **kw), *a),
                                  argnums=(0, 1, 2))(q, k, v)
    monkeypatch.setattr(jax.nn, "dot_product_attention", routed)
    got = jax.value_and_grad(lambda *a: loss(lambda q, k, v: A._cudnn(q, k, v, kw), *a), argnums=(0, 1, 2))(q, k, v)
    assert seen and all(t % 2 == 0 and s % 2 == 0 for t, s in seen)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for g, e in zip(got[1], expected[1]):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
