"""mia_jax.engine.generate and the models' KV-cache `decode`: cached logits equal a full forward over the final
sequence for every architecture (left-padded batches, sliding windows), seeded sampling, top-k / top-p,
sample_completions, EOS, truncation, the CLI; transformers' own generate as a reference for the learned-position
models."""
import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mia_jax.engine import generate as G
from mia_jax.engine import nucleus as N
from mia_jax.cli import main
from mia_jax.errors import UserError
from mia_jax.models import checkpoint, gemma3, gpt2, gpt_neox, llama, opt
from mia_jax.models.layers import build_module

V = 64
SW = 4  # sliding window, shorter than the sequences so it matters
CONFIGS = {  # name -> (module class, config)
    "llama_qwen2_mixed_window": (llama.Llama, llama.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, attention_bias=True, model_type="qwen2", sliding_window=SW,
        layer_types=("full_attention", "sliding_attention", "full_attention"))),
    "mistral": (llama.Llama, llama.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, sliding_window=SW, model_type="mistral")),
    "gemma3": (gemma3.Gemma3, gemma3.Gemma3Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=SW,
        layer_types=("sliding_attention", "full_attention", "sliding_attention"))),
    "gpt_neox": (gpt_neox.GPTNeoX, gpt_neox.GPTNeoXConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        rotary_pct=0.5, max_position_embeddings=64)),
    "gpt2": (gpt2.GPT2, gpt2.GPT2Config(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32)),
    "opt_post_ln_projected": (opt.OPT, opt.OPTConfig(
        vocab_size=V, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=32, do_layer_norm_before=False, word_embed_proj_dim=16)),
}
PROMPT_LENS = (9, 4, 1)  # left-padded to 9
N_NEW = 8


def make(name, seed=0):
    """A tiny model with random parameters of scale 0.3 (norm scales 1 + that), built from numpy arrays
    (no per-parameter jax initialisation), so logits and attention are far from uniform."""
    cls, cfg = CONFIGS[name]
    rng = np.random.default_rng(seed)
    shapes = nnx.to_pure_dict(nnx.split(nnx.eval_shape(lambda: cls(cfg)))[1])
    norm_one = not isinstance(cfg, gemma3.Gemma3Config)  # Gemma stores its norm scales as 1 + weight

    def init(path, spec):
        name = str(getattr(path[-1], "key", path[-1]))
        one = norm_one and (name.startswith("ln") or "norm" in name) and not name.endswith("_b")
        return (one + rng.normal(0, 0.3, spec.shape)).astype(np.float32)

    return build_module(cls, cfg, jax.tree_util.tree_map_with_path(init, shapes))


def forward(model, ids):
    """Full-forward logits (jit-compiled: one compilation instead of one per eager op)."""
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))(state, jnp.asarray(ids, jnp.int32)))


@pytest.fixture(scope="module", params=list(CONFIGS))
def family_model(request):
    return request.param, make(request.param)


def left_padded(lengths, seed=0, pad=0):
    rng = np.random.default_rng(seed)
    P = max(lengths)
    ids = np.full((len(lengths), P), pad, np.int32)
    for r, n in enumerate(lengths):
        ids[r, P - n:] = rng.integers(0, V, n)
    return ids, np.array([P - n for n in lengths], np.int32)


def test_cached_generation_logits_equal_full_forward(family_model):
    """Sampled generation (temperature 1) over a left-padded batch: the logits each token was drawn from equal
    the full forward over that row's unpadded prompt + generated tokens."""
    name, model = family_model
    ids, n_pad = left_padded(PROMPT_LENS)
    tokens, finished, logits = G.generate_tokens(model, ids, n_pad, max_new_tokens=N_NEW, temperature=1.0, seed=3,
                                                 return_logits=True)
    tokens, logits = np.asarray(tokens), np.asarray(logits)
    assert tokens.shape == (3, N_NEW) and logits.shape == (3, N_NEW, V) and not np.asarray(finished).any()
    # one full forward over the right-padded final sequences (causal: right padding changes no earlier logit)
    seqs = [np.concatenate([ids[r, n_pad[r]:], tokens[r]]) for r in range(3)]
    full = np.zeros((3, max(map(len, seqs))), np.int32)
    for r, s in enumerate(seqs):
        full[r, :len(s)] = s
    ref = forward(model, full)
    worst = 0.0
    for r, n in enumerate(PROMPT_LENS):
        worst = max(worst, float(np.abs(logits[r] - ref[r, n - 1:n - 1 + N_NEW]).max()))
    print(f"{name}: max |cached - full| logit difference {worst:.2e} (max |logit| {np.abs(ref).max():.1f})")
    assert worst < 1e-4
    # the tokens were really sampled, not all argmax
    assert (tokens != logits.argmax(-1)).any()


def test_decode_chunks_and_init_cache():
    """Prefill in two chunks then single tokens, over a cache longer than needed: same logits as a full forward."""
    model = make("gemma3")
    graphdef, state = nnx.split(model)
    decode = jax.jit(lambda st, *args: nnx.merge(graphdef, st).decode(*args))
    ids, n_pad = left_padded((10, 6), seed=1)
    S = 16
    cache = model.init_cache(2, S)
    assert cache["k"].shape[:3] == (model.config.num_hidden_layers, 2, S) and int(cache["index"]) == 0
    key_mask = jnp.arange(S)[None] >= n_pad[:, None]
    pos = jnp.arange(10)[None] - n_pad[:, None]
    out = []
    for a, b in ((0, 5), (5, 9), (9, 10)):
        lg, cache = decode(state, jnp.asarray(ids[:, a:b]), cache, pos[:, a:b], key_mask)
        out.append(np.asarray(lg))
    assert int(cache["index"]) == 10
    got = np.concatenate(out, axis=1)
    ref = forward(model, np.stack([np.roll(row, -n) for row, n in zip(ids, n_pad)]))  # right-padded rows
    for r in range(2):
        np.testing.assert_allclose(got[r, n_pad[r]:], ref[r, :10 - n_pad[r]], atol=1e-4)


def compiled_loop(model, ids, n_pad, prompts=None):
    """The generation loop compiled for left-padded ``ids`` (top-p 0.9 sampling, N_NEW tokens each)."""
    graphdef, state = nnx.split(model)
    b, i32 = len(ids), jnp.int32
    return G._generate_loop.lower(
        graphdef, state, jnp.asarray(ids, i32), jnp.asarray(n_pad, i32), G.row_keys(0, np.arange(b)),
        jnp.full((b,), N_NEW, i32), jnp.float32(1.0), i32(2**31 - 1), jnp.float32(0.9), i32(-1), i32(0),
        i32(model.config.vocab_size), None if prompts is None else tuple(jnp.asarray(x, i32) for x in prompts),
        max_new_tokens=N_NEW, greedy=False, filters=(False, True), return_logits=False).compile()


def test_prefill_keeps_only_the_last_logits():
    """The prefill unembeds the prompt's last slot only (``decode_last``): the loop compiled for 8 prompts of 256
    tokens over a 16,384-id vocabulary needs less temporary memory than a quarter of the prompts' [B, P, V] float32
    logits (134 MB; with every slot unembedded, as before, it needed 135.0 MB; now 13.5 MB). At Gemma 3's 262,144 ids
    the n-gram coverage attack's 160 rows of ~190 MIMIR tokens would have needed 32 GB."""
    v, b, p = 16384, 8, 256
    cfg = llama.LlamaConfig(vocab_size=v, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1)
    shapes = nnx.to_pure_dict(nnx.split(nnx.eval_shape(lambda: llama.Llama(cfg)))[1])
    rng = np.random.default_rng(0)
    model = build_module(llama.Llama, cfg,
                         jax.tree_util.tree_map(lambda x: rng.normal(0, 0.3, x.shape).astype(np.float32), shapes))
    temp = compiled_loop(model, np.zeros((b, p)), np.zeros(b)).memory_analysis().temp_size_in_bytes
    print(f"temporary memory {temp / 1e6:.1f} MB")
    assert temp < b * p * v * 4 / 4, temp


# ---- sampling, seeds, EOS: on the Llama model

@pytest.fixture(scope="module")
def model():
    return make("llama_qwen2_mixed_window", seed=1)


def run(model, **kw):
    ids, n_pad = left_padded(PROMPT_LENS, seed=2)
    tokens, finished, _ = G.generate_tokens(model, ids, n_pad, max_new_tokens=N_NEW, **kw)
    return np.asarray(tokens), np.asarray(finished)


def test_seeds_top_k_top_p(model):
    greedy, _ = run(model)
    a, _ = run(model, temperature=1.0, seed=0)
    b, _ = run(model, temperature=1.0, seed=0)
    c, _ = run(model, temperature=1.0, seed=1)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any() and (a != greedy).any()
    np.testing.assert_array_equal(run(model, temperature=1.0, top_k=1, seed=5)[0], greedy)
    np.testing.assert_array_equal(run(model, temperature=0.7, top_p=1e-6, seed=5)[0], greedy)
    assert (run(model, temperature=1.0, top_k=5, top_p=0.9, seed=0)[0] < V).all()


def test_per_row_keys_and_budgets(model):
    """One key per row: the default keys are row_keys(seed, row); a row's samples do not depend on its batchmates
    (alone, with another prompt length, it draws the same tokens from the same key). Budgets: a row stops after
    its budget (then pad; 0 = filler), not counted as finished; an earlier EOS still stops it."""
    ids, n_pad = left_padded(PROMPT_LENS, seed=2)
    kw = dict(max_new_tokens=N_NEW, temperature=1.0, top_k=10, top_p=0.95)
    a, _, logits = G.generate_tokens(model, ids, n_pad, seed=7, return_logits=True, **kw)
    a, logits = np.asarray(a), np.asarray(logits)
    keys = G.row_keys(7, range(3))
    np.testing.assert_array_equal(G.generate_tokens(model, ids, n_pad, keys=keys, **kw)[0], a)
    np.testing.assert_array_equal(G.generate_tokens(model, ids, n_pad, keys=jax.random.key_data(keys), **kw)[0], a)
    # every drawn token is among the row's top 10 logits (top-k / top-p with per-row keys)
    assert ((logits > np.take_along_axis(logits, a[..., None], -1)).sum(-1) < 10).all()
    for r, n in enumerate(PROMPT_LENS):
        alone = G.generate_tokens(model, ids[r:r + 1, n_pad[r]:], [0], keys=keys[r:r + 1], **kw)[0]
        np.testing.assert_array_equal(np.asarray(alone)[0], a[r])
    swapped = G.generate_tokens(model, ids[::-1], n_pad[::-1], keys=keys[::-1], **kw)[0]
    np.testing.assert_array_equal(np.asarray(swapped)[::-1], a)
    tokens, finished, _ = G.generate_tokens(model, ids, n_pad, seed=7, budgets=[N_NEW, 3, 0], pad_token_id=V - 1,
                                            **kw)
    tokens = np.asarray(tokens)
    np.testing.assert_array_equal(tokens[0], a[0])
    np.testing.assert_array_equal(tokens[1, :3], a[1, :3])
    assert (tokens[1, 3:] == V - 1).all() and (tokens[2] == V - 1).all() and not np.asarray(finished).any()
    eos = int(a[1, 1])
    tokens, finished, _ = G.generate_tokens(model, ids, n_pad, seed=7, budgets=[N_NEW, 3, 0], eos_token_id=eos,
                                            pad_token_id=V - 1, **kw)
    assert np.asarray(finished)[1] and not np.asarray(finished)[2]
    first = int(np.argmax(a[1] == eos))
    np.testing.assert_array_equal(np.asarray(tokens)[1, :first + 1], a[1, :first + 1])
    for bad in ([1, 2], [N_NEW + 1, 0, 0], [-1, 0, 0], [1.5, 0, 0]):
        with pytest.raises(UserError, match="budget"):
            G.generate_tokens(model, ids, n_pad, budgets=bad, **kw)
    with pytest.raises(ValueError, match="one PRNG key per row"):
        G.generate_tokens(model, ids, n_pad, keys=keys[:2], **kw)


def test_rows_of_one_prompt_share_its_prefill(model):
    """Rows that repeat a prompt (the samples of SaMIA and of the n-gram coverage attack) prefill it once
    (``shared_prompts``, as ``generate_ids`` passes it): the same tokens and logits as with every row prefilled, and
    the compiled loop counts under half the floating-point operations (2 prompts of 64 and 40 tokens, 12 rows each,
    prefilled as 8 rows instead of 24: 2.9 times fewer)."""
    ids, n_pad = left_padded((64, 40), seed=4)
    rows = np.repeat([0, 1], 12)
    ids, n_pad = ids[rows], n_pad[rows]
    prompts = G.shared_prompts([list(r[n:]) for r, n in zip(ids, n_pad)])
    assert prompts is not None and list(prompts[1]) == list(rows) and list(prompts[0][:2]) == [0, 12]
    kw = dict(max_new_tokens=N_NEW, temperature=1.0, top_p=0.9, seed=3, return_logits=True)
    every = G.generate_tokens(model, ids, n_pad, **kw)
    shared = G.generate_tokens(model, ids, n_pad, prompts=prompts, **kw)
    np.testing.assert_array_equal(np.asarray(shared[0]), np.asarray(every[0]))
    np.testing.assert_allclose(np.asarray(shared[2]), np.asarray(every[2]), atol=1e-5)
    flops = [compiled_loop(model, ids, n_pad, p).cost_analysis()["flops"] for p in (prompts, None)]
    assert flops[0] < flops[1] / 2, flops


def test_one_compilation_for_keys_budgets_and_sampling_params(model):
    ids, n_pad = left_padded(PROMPT_LENS, seed=2)
    G.generate_tokens(model, ids, n_pad, max_new_tokens=N_NEW, temperature=1.0, top_p=0.9)
    before = G._generate_loop._cache_size()
    for kw in (dict(seed=1), dict(keys=G.row_keys(3, [5, 6, 7])), dict(budgets=[1, 0, 8]),
               dict(temperature=0.5, top_k=3, top_p=0.5, eos_token_id=2, pad_token_id=1, vocab_limit=50)):
        G.generate_tokens(model, ids, n_pad, **{"max_new_tokens": N_NEW, "temperature": 1.0, "top_p": 0.9, **kw})
    assert G._generate_loop._cache_size() == before


def test_row_keys():
    a = G.row_keys(0, [1, 2**32 - 1], [0, 5])
    assert a.shape == (2,)
    want = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), 2**32 - 1), 5)
    np.testing.assert_array_equal(jax.random.key_data(a[1]), jax.random.key_data(want))
    np.testing.assert_array_equal(jax.random.key_data(G.row_keys(0, [0, 1])[1]),
                                  jax.random.key_data(jax.random.fold_in(jax.random.key(0), 1)))
    with pytest.raises(ValueError):
        G.row_keys(0, [1, 2], [3])


def test_sample_logits_support():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05, 0.0]]))  # last token impossible
    keys = jax.random.split(jax.random.key(0), 2000)

    def draw(keys, **kw):
        return jax.vmap(lambda k: N.sample_logits(logits, k[None], **kw)[0])(keys)

    freq = lambda toks: np.bincount(np.asarray(toks), minlength=5) / len(toks)  # noqa: E731
    assert set(np.unique(draw(keys, temperature=1.0, top_k=2))) == {0, 1}
    assert set(np.unique(draw(keys, temperature=1.0, top_p=0.7))) == {0, 1}  # 0.5 < 0.7 <= 0.8
    f = freq(draw(keys, temperature=1.0))
    assert f[4] == 0 and abs(f[0] - 0.5) < 0.05 and abs(f[3] - 0.05) < 0.02
    f = freq(draw(keys, temperature=0.5, top_k=jnp.int32(3), top_p=jnp.float32(0.99)))  # traced filters
    assert f[3] == f[4] == 0 and abs(f[0] - 0.25 / 0.3625) < 0.05  # p^2 renormalised over the top 3
    for n in (1, 2, 5):  # from the n largest (candidates) when every kept token is one, else the whole row
        f = freq(draw(keys, temperature=1.0, top_p=0.9, candidates=n))
        assert f[3] == f[4] == 0 and abs(f[0] - 0.5 / 0.95) < 0.05 and abs(f[2] - 0.15 / 0.95) < 0.03


def test_eos_stops_a_row(model):
    greedy, finished = run(model)
    assert not finished.any()
    eos, step = int(greedy[0, 3]), int(np.argmax(greedy[0] == greedy[0, 3]))  # row 0 emits eos at `step`
    tokens, finished = run(model, eos_token_id=eos, pad_token_id=V - 1)
    assert finished[0]
    np.testing.assert_array_equal(tokens[0, :step + 1], greedy[0, :step + 1])
    assert (tokens[0, step + 1:] == V - 1).all()
    for r in (1, 2):  # other rows go on until their own eos (if any)
        stop = np.flatnonzero(greedy[r] == eos)
        n = stop[0] + 1 if len(stop) else N_NEW
        assert finished[r] == bool(len(stop))
        np.testing.assert_array_equal(tokens[r, :n], greedy[r, :n])


# ---- text level: LoadedModel with a tokenizer

@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return checkpoint.load(str(tiny_llama_dir))


def test_generate_text(loaded):
    prompts = ["The film was released in", "He was born in the city of", "A"]
    out = G.generate(loaded, prompts, max_new_tokens=6)
    # the texts decode greedy continuations: each token is the argmax (over the tokenizer's vocabulary) of a full
    # forward over the prompt and the tokens before it (one right-padded batch: causal, so padding is harmless)
    prompt_ids = G.encode_prompts(loaded, prompts)
    gen = G.generate_ids(loaded, prompt_ids, max_new_tokens=6)
    seqs = [p + gen.completion_ids(r) for r, p in enumerate(prompt_ids)]
    batch = np.zeros((3, max(map(len, seqs))), np.int32)
    for r, q in enumerate(seqs):
        batch[r, :len(q)] = q
    logits = forward(loaded.model, batch)[..., :loaded.tokenizer.get_vocab_size()]
    for r, p in enumerate(prompt_ids):
        completion = gen.completion_ids(r)
        assert len(completion) == 6 or gen.finished[r], r
        assert completion == [int(t) for t in logits[r, len(p) - 1:len(p) - 1 + len(completion)].argmax(-1)]
        assert out[r] == loaded.tokenizer.decode(completion, skip_special_tokens=True)
    assert G.generate(loaded, prompts, max_new_tokens=6) == out
    # each row alone gives the same greedy text as in the left-padded batch
    assert [G.generate(loaded, [p], max_new_tokens=6)[0] for p in prompts] == out


def test_generate_ids_eos_and_truncation(loaded):
    prompt = G.encode_prompts(loaded, ["The film was released in"])
    gen = G.generate_ids(loaded, prompt, max_new_tokens=6)
    eos = int(gen.tokens[0, 2])
    stopped = G.generate_ids(dataclasses.replace(loaded, eos_token_id=eos), prompt, max_new_tokens=6)
    first = int(np.argmax(gen.tokens[0] == eos))
    assert stopped.finished[0] and stopped.n_generated[0] == first + 1
    assert stopped.completion_ids(0) == [int(t) for t in gen.tokens[0, :first]]
    no_stop = G.generate_ids(dataclasses.replace(loaded, eos_token_id=eos), prompt, max_new_tokens=6,
                             stop_at_eos=False)
    np.testing.assert_array_equal(no_stop.tokens, gen.tokens)
    # context 64: a 70-token prompt keeps its last 64 - 6 tokens
    long_prompt = [list(range(1, 71))]
    gen = G.generate_ids(loaded, long_prompt, max_new_tokens=6, return_logits=True)
    assert gen.truncated == [True] and gen.prompt_ids == [list(range(13, 71))]
    ref = forward(loaded.model, [gen.prompt_ids[0] + list(gen.tokens[0])])[0, 57:63]
    np.testing.assert_allclose(gen.logits[0], ref, atol=1e-4)
    with pytest.raises(UserError, match="context"):
        G.generate_ids(loaded, prompt, max_new_tokens=64)
    # per-row budgets: each prompt is fitted to the context minus its own budget; the loop may be longer
    gen = G.generate_ids(loaded, long_prompt * 3, max_new_tokens=64, budgets=[2, 6, 0], temperature=1.0, top_k=5)
    assert [len(p) for p in gen.prompt_ids] == [62, 58, 64] and gen.truncated == [True] * 3
    assert list(gen.n_generated) == [2, 6, 0] and [len(gen.completion_ids(r)) for r in range(3)] == [2, 6, 0]
    again = G.generate_ids(loaded, long_prompt, max_new_tokens=6, keys=G.row_keys(0, [1]), temperature=1.0, top_k=5)
    assert again.completion_ids(0) == gen.completion_ids(1)  # row 1's key, same prompt tokens: same sample
    with pytest.raises(UserError, match="64 new tokens do not fit"):
        G.generate_ids(loaded, prompt * 2, max_new_tokens=64, budgets=[1, 64])
    for bad in (dict(temperature=-1.0), dict(top_k=0), dict(top_p=0.0), dict(max_new_tokens=0)):
        with pytest.raises(UserError):
            G.generate_ids(loaded, prompt, **{"max_new_tokens": 4, **bad})


def test_sample_completions(loaded, monkeypatch):
    prompts = ["The film was released in", "He was born in the city of", "A", "The station opened"]
    ids, budgets = G.encode_prompts(loaded, prompts), [5, 2, 9, 1]
    shared, real = [], G.generate_tokens
    monkeypatch.setattr(G, "generate_tokens", lambda *a, **k: shared.append(k["prompts"] is not None) or real(*a, **k))
    texts, n_tokens = G.sample_completions(loaded, ids, budgets, prompts, n_samples=3, temperature=1.0, top_k=5,
                                           seed=3, batch_size=3, progress=False)
    assert shared == [True, True]  # 9 rows of 3 prompts a loop: each prompt prefilled once (as 8 rows, padded)
    assert [len(t) for t in texts] == [len(n) for n in n_tokens] == [3] * 4
    assert all(0 <= n <= b for b, ns in zip(budgets, n_tokens) for n in ns)
    # sample j of a prompt is the row with key row_keys(seed, text_hash(key text), j), alone or in any batch
    gen = G.generate_ids(loaded, ids[2:3] * 3, max_new_tokens=9, temperature=1.0, top_k=5,
                         keys=G.row_keys(3, [G.text_hash(prompts[2])] * 3, [0, 1, 2]))
    assert n_tokens[2] == [len(gen.completion_ids(j)) for j in range(3)]
    assert texts[2] == [loaded.tokenizer.decode(gen.completion_ids(j), skip_special_tokens=True) for j in range(3)]
    alone = [G.sample_completions(loaded, [i], [b], [p], n_samples=3, temperature=1.0, top_k=5, seed=3,
                                  progress=False) for i, b, p in zip(ids, budgets, prompts)]
    assert [t[0][0] for t in alone] == texts and [t[1][0] for t in alone] == n_tokens
    assert G.sample_completions(loaded, [], [], [], n_samples=2, progress=False) == ([], [])
    assert G.text_hash("abc") == int.from_bytes(hashlib.sha256(b"abc").digest()[:4], "little")

def test_cli_generate(tiny_llama_dir, capsys):
    assert main(["generate", "--model", str(tiny_llama_dir), "--prompt", "The film was", "--prompt", "A",
                 "--n", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The film was") and "\n---\nA" in out
    assert main(["generate", "--model", str(tiny_llama_dir), "--prompt", "A", "--top-p", "1.5"]) == 2
    assert "--top-p: must be a fraction in (0, 1], got 1.5" in capsys.readouterr().err


# ---- transformers' generate with left padding (learned-position models: position ids from the attention mask)

@pytest.mark.parity
@pytest.mark.parametrize("family", ["gpt2", "opt"])
def test_left_padded_greedy_matches_transformers(tmp_path, family):
    from test_models_zoo import CONFIGS as ZOO_CONFIGS
    from test_models_zoo import TINY, hf_reference

    torch = pytest.importorskip("torch")
    ref_model, config, tensors = hf_reference(tmp_path, family)
    mod = TINY[family][2]
    cfg = ZOO_CONFIGS[family].from_hf(config)
    model = mod.from_params(cfg, mod.params_from_hf(cfg, tensors))
    ids, n_pad = left_padded((7, 3), seed=4, pad=1)
    tokens, _, logits = G.generate_tokens(model, ids, n_pad, max_new_tokens=6, return_logits=True, pad_token_id=1)
    mask = (np.arange(ids.shape[1])[None] >= n_pad[:, None]).astype(np.int64)
    with torch.no_grad():
        out = ref_model.generate(torch.as_tensor(ids, dtype=torch.long), attention_mask=torch.as_tensor(mask),
                                 max_new_tokens=6, do_sample=False, pad_token_id=1, eos_token_id=None,
                                 output_logits=True, return_dict_in_generate=True)
    np.testing.assert_array_equal(np.asarray(tokens), out.sequences[:, ids.shape[1]:].numpy())
    np.testing.assert_allclose(np.asarray(logits), torch.stack(out.logits, 1).float().numpy(), atol=1e-4)


@pytest.mark.slow
def test_smollm2_cli_capital_of_france(capsys):
    try:
        checkpoint.resolve_model("smollm2")
    except UserError as e:
        pytest.skip(str(e))
    assert main(["generate", "--model", "smollm2", "--prompt", "The capital of France is", "--n", "20"]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "Paris" in out


def _kept_by_sorting(x: np.ndarray, top_k, top_p) -> np.ndarray:
    """The tokens the filters keep, by sorting the row in float64 (the definition): the k largest, then of those
    the smallest set of most likely tokens whose mass reaches top_p; every logit at or above the smallest kept one."""
    desc = -np.sort(-x)
    k = x.size if top_k is None else min(top_k, x.size)
    keep = np.arange(x.size) < k
    if top_p is not None:
        p = np.where(keep, np.exp(desc - desc[0]), 0.0)
        p /= p.sum()
        keep &= np.cumsum(p) - p < top_p
    return x >= desc[keep].min()


@pytest.mark.parametrize("top_k, top_p", [(None, 0.95), (None, 0.5), (None, 1e-6), (50, None), (1, None),
                                          (3, 0.9), (50, 0.5), (2000, 0.99)])
def test_filter_threshold_keeps_what_sorting_keeps(top_k, top_p):
    """``nucleus.filter_threshold`` (no sort: bit-by-bit searches over the logits' order keys) keeps exactly the
    tokens a float64 sort of each row keeps, on rows with ties (at the k-th largest too) and -inf logits."""
    rng = np.random.default_rng(7)
    rows = [rng.normal(size=1000) * s for s in (0.3, 2.0, 8.0) for _ in range(20)]
    rows += [np.round(rng.normal(size=1000) * 2) / 2 for _ in range(20)]  # many ties
    rows += [np.where(rng.random(1000) < 0.3, -np.inf, rng.normal(size=1000)) for _ in range(20)]
    x = np.asarray(rows, np.float32)
    keys = N.order_keys(jnp.asarray(x))
    kept = np.asarray(keys >= N.filter_threshold(jnp.asarray(x), keys, top_k, top_p)[:, None])
    want = np.stack([_kept_by_sorting(r.astype(np.float64), top_k, top_p) for r in x])
    assert (kept == want).all(), np.flatnonzero((kept != want).any(axis=1))
    assert kept.any(axis=1).all()


def test_order_keys_follow_the_floats():
    x = np.array([-np.inf, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, np.inf], np.float32)
    keys = np.asarray(N.order_keys(jnp.asarray(x))).astype(np.int64)
    assert (np.diff(keys) > 0).all()


BOTH = {"candidates", "whole row"}


@pytest.mark.parametrize("top_k, top_p, paths_taken", [(None, 0.95, BOTH), (None, 0.5, BOTH), (50, None, BOTH),
                                                        (3, 0.9, {"candidates"}), (200, None, {"whole row"}),
                                                        (None, 1.0, {"whole row"})])
@pytest.mark.parametrize("fallback_rows", [N.FALLBACK_ROWS, (1,), (50,)])
def test_sample_logits_draws_among_candidates_or_the_whole_row(top_k, top_p, paths_taken, fallback_rows,
                                                               monkeypatch):
    """``nucleus.sample_logits`` draws a row from its ``candidates`` largest logits when every token the filters
    keep (a float64 sort of the row) is one of them, else over its whole row, with the row's key either way; a row's
    token does not depend on the other rows (the batch shuffled and cut gives the same tokens); whether the rows to
    redo over their whole vocabulary are gathered (``fallback_rows``: 1, 50 or the default sizes) changes nothing."""
    monkeypatch.setattr(N, "FALLBACK_ROWS", fallback_rows)
    rng = np.random.default_rng(3)
    rows = [rng.normal(size=1000) * s for s in (0.1, 0.5, 2.0, 8.0) for _ in range(10)]
    rows += [np.round(rng.normal(size=1000)) for _ in range(5)]  # ties at the smallest candidate
    x = np.asarray(rows, np.float32)
    keys = G.row_keys(0, range(len(x)))
    n = 64
    got = np.asarray(N.sample_logits(jnp.asarray(x), keys, top_k=top_k, top_p=top_p, candidates=n))
    paths = set()
    for r, row in enumerate(x):
        kept = _kept_by_sorting(row.astype(np.float64), top_k, top_p)
        top = np.argsort(-row, kind="stable")[:n]
        neg = np.finfo(np.float32).min
        if row[top[-1]] < row[kept].min():  # every kept token above the smallest candidate: all are candidates
            want = top[int(jax.random.categorical(keys[r], jnp.where(kept[top], row[top], neg)))]
            paths.add("candidates")
        else:
            want = int(jax.random.categorical(keys[r], jnp.where(kept, row, neg)))
            paths.add("whole row")
        assert got[r] == want, r
    assert paths == paths_taken
    perm = rng.permutation(len(x))[:17]
    again = np.asarray(N.sample_logits(jnp.asarray(x[perm]), keys[perm], top_k=top_k, top_p=top_p, candidates=n))
    np.testing.assert_array_equal(again, got[perm])
