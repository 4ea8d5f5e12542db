"""Packed rows (several texts in one row, segment ids) in the model forward: `attention(..., segment_ids=...)` against
a float64 NumPy reference and its chunked gradient against the full path's; positions restarting per segment; and
for every causal family and attention implementation, each packed text's hidden states equal those of the text
run alone (sliding windows, GQA, learned positions and RoPE included)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_chunked_gradient_matches_full
from flax import nnx

from mia_jax.models import attention as A
from mia_jax.models import checkpoint, gemma3, gpt2, gpt_neox, llama, opt, phi3
from mia_jax.models import layers as L

IMPLEMENTATIONS = ("full", "chunked", "dot_product")


def reference(q, k, v, scale, visible):
    """float64 softmax attention with a hand-built visibility [B, T, S]; a row that sees no key averages the values."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    G = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    out = np.empty(q.shape)
    for b in range(q.shape[0]):
        for t in range(q.shape[1]):
            seen = np.flatnonzero(visible[b, t])
            if seen.size == 0:
                out[b, t] = v[b].mean(axis=0)
                continue
            s = np.einsum("hd,shd->hs", q[b, t], k[b, seen]) * scale
            p = np.exp(s - s.max(-1, keepdims=True))
            out[b, t] = np.einsum("hs,shd->hd", p / p.sum(-1, keepdims=True), v[b, seen])
    return out


def visible_by_hand(q_seg, k_seg, causal, q_offset=0, window=None, key_mask=None):
    B, T = q_seg.shape
    S = k_seg.shape[1]
    vis = np.zeros((B, T, S), bool)
    for b in range(B):
        for i in range(T):
            for j in range(S):
                vis[b, i, j] = (q_seg[b, i] == k_seg[b, j] and (not causal or j <= q_offset + i)
                                and (window is None or q_offset + i - j < window)
                                and (key_mask is None or key_mask[b, j]))
    return vis


def qkv(seed, B, T, S, H, KV, Dh):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((B, T, H, Dh), (B, S, KV, Dh),
                                                                                  (B, S, KV, Dh)))


# row 0: texts 1, 2, 3 then padding 0; row 1: unconventional ids (negative, large, an id used twice apart: a
# query sees both of its runs), no padding
SEGMENTS = np.array([[1] * 5 + [2] + [3] * 13 + [0] * 6,
                     [-4] * 9 + [70000] * 3 + [5] * 7 + [-4] * 4 + [2] * 2])


@pytest.mark.parametrize("causal, window", [(True, None), (True, 5), (False, None)])
def test_self_attention_with_segments_matches_float64_reference(causal, window):
    seg = jnp.asarray(SEGMENTS, jnp.int32)
    B, T = seg.shape
    q, k, v = qkv(0, B, T, T, 6, 2, 8)
    want = reference(q, k, v, 0.3, visible_by_hand(SEGMENTS, SEGMENTS, causal, window=window))

    @jax.jit
    def run(q, k, v, seg):
        return {impl: A.attention(q, k, v, scale=0.3, causal=causal, sliding_window=window, segment_ids=seg,
                                  implementation=impl, block_q=4, block_k=8) for impl in IMPLEMENTATIONS}

    for impl, out in run(q, k, v, seg).items():
        assert out.dtype == jnp.float32 and out.shape == q.shape
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=2e-6, err_msg=impl)


def test_kv_segment_ids_offset_key_mask_and_rows_that_see_nothing():
    """Queries at cache slots 15..19 over 20 keys with their own segment ids: query 3 of row 0 has a segment no key
    has (mean of the values, no NaN), row 1 has key padding."""
    q_seg = np.array([[2, 2, 2, 9, 3], [1, 1, 1, 1, 1]])
    k_seg = np.array([[1] * 6 + [2] * 10 + [3] * 4, [1] * 20])
    key_mask = np.ones((2, 20), bool)
    key_mask[1, :4] = False
    q, k, v = qkv(1, 2, 5, 20, 4, 1, 8)
    vis = visible_by_hand(q_seg, k_seg, True, q_offset=15, key_mask=key_mask)
    assert not vis[0, 3].any()
    want = reference(q, k, v, 8 ** -0.5, vis)
    run = jax.jit(lambda q, k, v, qs, ks, km: {impl: A.attention(
        q, k, v, causal=True, q_offset=15, key_mask=km, segment_ids=qs, kv_segment_ids=ks, implementation=impl,
        block_q=2, block_k=8) for impl in IMPLEMENTATIONS})
    for impl, out in run(q, k, v, jnp.asarray(q_seg), jnp.asarray(k_seg), jnp.asarray(key_mask)).items():
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=2e-6, err_msg=impl)


def test_dense_mask_with_segments():
    seg = jnp.asarray(SEGMENTS)
    got = np.asarray(A.dense_mask(SEGMENTS.shape[1], SEGMENTS.shape[1], sliding_window=4, segment_ids=seg))
    np.testing.assert_array_equal(got, visible_by_hand(SEGMENTS, SEGMENTS, True, window=4))


@pytest.mark.parametrize("window", [None, 6])
def test_chunked_gradient_with_segments_matches_full(window):
    seg = jnp.asarray(SEGMENTS, jnp.int32)
    q, k, v = qkv(2, *seg.shape, seg.shape[1], 4, 2, 8)
    assert_chunked_gradient_matches_full(q, k, v, causal=True, sliding_window=window, segment_ids=seg, block_q=4,
                                         block_k=8)


def test_one_segment_is_no_segments():
    """A row that is one segment sees what it saw without segment ids (to rounding: XLA fuses a [B, T, S] mask
    differently from a [T, S] one)."""
    q, k, v = qkv(4, 2, 21, 21, 4, 2, 8)
    ones = jnp.full((2, 21), 3, jnp.int32)
    for impl in ("full", "chunked"):
        run = jax.jit(lambda q, k, v, seg, impl=impl: A.attention(q, k, v, causal=True, segment_ids=seg,
                                                                  implementation=impl, block_q=8, block_k=4))
        np.testing.assert_allclose(np.asarray(run(q, k, v, ones)), np.asarray(run(q, k, v, None)), rtol=0,
                                   atol=1e-6, err_msg=impl)


def test_segment_argument_errors():
    q, k, v = qkv(5, 1, 4, 6, 2, 2, 4)
    seg4, seg6 = jnp.ones((1, 4), jnp.int32), jnp.ones((1, 6), jnp.int32)
    with pytest.raises(ValueError, match="pass kv_segment_ids"):
        A.attention(q, k, v, segment_ids=seg4)
    with pytest.raises(ValueError, match="without segment_ids"):
        A.attention(q, k, v, kv_segment_ids=seg6)
    with pytest.raises(ValueError, match=r"kv_segment_ids must be integers \[B, S\] = \[1, 6\]"):
        A.attention(q, k, v, segment_ids=seg4, kv_segment_ids=seg4)
    with pytest.raises(ValueError, match="segment_ids must be integers"):
        A.attention(q, k, v, segment_ids=seg4.astype(jnp.float32), kv_segment_ids=seg6)
    assert A.attention(q, k, v, segment_ids=seg4, kv_segment_ids=seg6).shape == q.shape


def test_segment_positions_restart_at_each_run():
    seg = jnp.asarray([[1, 1, 1, 2, 3, 3, 0, 0], [5, 5, 5, 5, 5, 5, 5, 5], [4, 7, 7, 4, 4, 0, 2, 2]])
    np.testing.assert_array_equal(np.asarray(L.segment_positions(seg)),
                                  [[0, 1, 2, 0, 0, 1, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 0, 1, 0, 0, 1]])


# ----------------------------------------------------------------------------- every causal family

VOCAB = 64
_LLAMA = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)
FAMILIES = {
    "llama": lambda: llama.Llama(llama.LlamaConfig(**_LLAMA, tie_word_embeddings=True)),
    "mistral_window": lambda: llama.Llama(llama.LlamaConfig(  # a sliding window on one layer of two
        **_LLAMA, model_type="mistral", sliding_window=4, layer_types=("sliding_attention", "full_attention"))),
    "phi3": lambda: phi3.Phi3(phi3.Phi3Config(**_LLAMA)),
    "gemma3": lambda: gemma3.Gemma3(gemma3.Gemma3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=4, query_pre_attn_scalar=8, max_position_embeddings=64,
        layer_types=("sliding_attention", "full_attention", "sliding_attention"))),
    "gpt2": lambda: gpt2.GPT2(gpt2.GPT2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, max_position_embeddings=32)),
    "gpt_neox": lambda: gpt_neox.GPTNeoX(gpt_neox.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=32, rotary_pct=0.5)),
    "opt": lambda: opt.OPT(opt.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=48, num_hidden_layers=2,
                                         num_attention_heads=4, max_position_embeddings=32)),
}
ROW = 24


def test_every_family_is_packed():
    """Every family the loader knows (checkpoint.ARCHITECTURES) has a model in FAMILIES."""
    packed = {type(nnx.eval_shape(make)).__module__.rsplit(".", 1)[-1] for make in FAMILIES.values()}
    missing = sorted({a.module for a in checkpoint.ARCHITECTURES.values()} - packed)
    assert not missing, f"families of checkpoint.ARCHITECTURES without a model in FAMILIES: {missing}"


def packing():
    """Three texts (lengths 1, 9 or 10 (longer than the window of 4), 3 to 6) as two rows of ROW tokens: row 0 packs
    them 1, 2, 3 with ids 1, 2, 3 and padding (id 0, random tokens); row 1 packs them 3, 1, 2 with ids 7, 2, 5 and
    more padding. -> (texts, ids [2, ROW], segment ids [2, ROW], [(row, start, text index)])."""
    rng = np.random.default_rng(7)
    lengths = [1, int(rng.integers(9, 11)), int(rng.integers(3, 7))]
    texts = [rng.integers(1, VOCAB, n) for n in lengths]
    ids, seg, where = rng.integers(0, VOCAB, (2, ROW)), np.zeros((2, ROW), np.int32), []
    for row, order, labels in ((0, (0, 1, 2), (1, 2, 3)), (1, (2, 0, 1), (7, 2, 5))):
        start = 0
        for n, label in zip(order, labels):
            ids[row, start:start + lengths[n]], seg[row, start:start + lengths[n]] = texts[n], label
            where.append((row, start, n))
            start += lengths[n]
    return texts, ids, seg, where


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    """(name, module, hidden states of each text run alone with the "full" implementation)."""
    model = FAMILIES[request.param]()
    texts, *_ = packing()
    mp = pytest.MonkeyPatch()
    mp.setenv(A.ENV, "full")
    try:
        alone = [np.asarray(model.hidden_states(jnp.asarray(t[None], jnp.int32)))[0] for t in texts]
    finally:
        mp.undo()
    return request.param, model, alone


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_packed_hidden_states_equal_each_text_alone(family, impl, monkeypatch):
    """$MIA_JAX_ATTENTION picks the implementation of every layer (plain causal and sliding-window paths); then the
    explicit `attention=` path (layers without a window) with the environment on the other implementations. Chunked
    blocks of 4 x 4 over 24 tokens: several blocks per text, blocks between texts skipped."""
    name, model, alone = family
    _, ids, seg, where = packing()
    monkeypatch.setattr(A, "BLOCK_Q", 4)
    monkeypatch.setattr(A, "BLOCK_K", 4)
    graphdef, state = nnx.split(model)
    ids, seg = jnp.asarray(ids, jnp.int32), jnp.asarray(seg)
    runs = {}
    monkeypatch.setenv(A.ENV, impl)
    runs["env"] = jax.jit(lambda st, x, s: nnx.merge(graphdef, st).hidden_states(x, segment_ids=s))(state, ids, seg)
    monkeypatch.setenv(A.ENV, "full" if impl != "full" else "chunked")
    runs["argument"] = jax.jit(lambda st, x, s: nnx.merge(graphdef, st).hidden_states(
        x, attention=impl, segment_ids=s))(state, ids, seg)
    for how, hidden in runs.items():
        hidden = np.asarray(hidden)
        assert hidden.shape == (2, ROW, model.unembedding().shape[1]) and np.all(np.isfinite(hidden))
        for row, start, n in where:
            got = hidden[row, start:start + len(alone[n])]
            np.testing.assert_allclose(got, alone[n], rtol=1e-5, atol=1e-5, err_msg=f"{name} {impl} {how} text {n}")


def test_logits_take_segment_ids_and_default_is_unchanged(family):
    """`__call__` passes segment_ids through; one segment per row is the forward without segment ids."""
    name, model, _ = family
    _, ids, seg, _ = packing()
    ids = jnp.asarray(ids, jnp.int32)
    logits = np.asarray(model(ids, jnp.asarray(seg)))
    np.testing.assert_allclose(logits, np.asarray(L.unembed(model.hidden_states(ids, segment_ids=jnp.asarray(seg)),
                                                            model.unembedding())), rtol=1e-6, atol=1e-6)
    plain = np.asarray(model(ids))
    np.testing.assert_allclose(np.asarray(model(ids, jnp.ones_like(ids))), plain, rtol=0, atol=1e-5, err_msg=name)
    assert not np.allclose(logits, plain)


def test_cpu_runs_packed_rows_one_row_at_a_time_in_small_blocks(monkeypatch):
    """On the CPU, "auto" gives packed rows of at least CPU_PACKED_MIN slots to "chunked", which runs them one row
    at a time in CPU_PACKED_BLOCK-slot blocks (so a block between two texts of a row is skipped), with the values
    of "full"."""
    monkeypatch.delenv(A.ENV, raising=False)
    T, packed = A.CPU_PACKED_MIN, dict(structural_only=False, segments_only=True)
    assert A.implementation_for(T, T, **packed) == "chunked"
    assert A.implementation_for(T - 1, T - 1, **packed) == "full"
    assert A.implementation_for(T, T, structural_only=False) == "full"  # a key mask: as before
    seg = jnp.asarray(np.sort(np.random.default_rng(3).integers(0, 9, (3, T)), axis=1), jnp.int32)
    q, k, v = qkv(1, 3, T, T, 4, 2, 8)
    calls, real = [], A._chunked
    monkeypatch.setattr(A, "_chunked", lambda q, *a: calls.append((q.shape[0], a[-3], a[-2])) or real(q, *a))
    got = A.attention(q, k, v, causal=True, segment_ids=seg)
    assert calls == [(1, A.CPU_PACKED_BLOCK, A.CPU_PACKED_BLOCK)]  # traced once, inside the map over rows
    want = reference(q, k, v, 8 ** -0.5, visible_by_hand(np.asarray(seg), np.asarray(seg), True))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=2e-6)
