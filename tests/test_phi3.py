"""mia_jax.models.phi3: logit parity with transformers' Phi3ForCausalLM (float32 and bfloat16 parameters; fused
qkv_proj / gate_up_proj split by the weight spec, grouped-query heads, a sliding window, tied embeddings), decode
against the full forward, a GGUF round trip and the config options it refuses."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mia_jax.models import checkpoint, gguf_io, phi3
from mia_jax.models.layers import ConfigError

IDS = np.random.default_rng(0).integers(0, 96, (2, 12))
TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def hf_reference(tmp_path, **overrides):
    """A seeded transformers Phi-3 with every parameter randomised, saved as safetensors; returns (model,
    config.json dict, tensors, reference logits)."""
    torch, transformers = pytest.importorskip("torch"), pytest.importorskip("transformers")
    from safetensors.numpy import load_file

    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**{**TINY, **overrides})).eval()
    noise = {k: v + 0.1 * torch.randn_like(v) if v.ndim == 1 else 0.08 * torch.randn_like(v)
             for k, v in model.state_dict().items()}
    model.load_state_dict(noise)
    model.save_pretrained(tmp_path, safe_serialization=True)
    with torch.no_grad():
        ref = model(torch.as_tensor(IDS)).logits.float().numpy()
    config = json.loads((tmp_path / "config.json").read_text())
    return model, config, load_file(str(tmp_path / "model.safetensors")), ref


def diff(model, ref):
    return float(np.abs(np.asarray(model(jnp.asarray(IDS, jnp.int32))) - ref).max())


@pytest.mark.parity
@pytest.mark.parametrize("overrides", [{}, {"sliding_window": 5}, {"tie_word_embeddings": True}])
def test_phi3_parity(tmp_path, overrides):
    _, config, tensors, ref = hf_reference(tmp_path, **overrides)
    cfg = phi3.Phi3Config.from_hf(config)
    assert (cfg.num_key_value_heads, cfg.sliding_window) == (2, overrides.get("sliding_window"))
    params = phi3.params_from_hf(cfg, tensors)
    f32 = phi3.from_params(cfg, params)
    d32 = diff(f32, ref)
    bf16 = phi3.from_params(cfg, params, "bfloat16")
    assert bf16.embed[...].dtype == jnp.bfloat16
    d16 = diff(bf16, ref)
    print(f"phi3 {overrides}: float32 {d32:.2e}  bfloat16 {d16:.2e}  max|logit| {np.abs(ref).max():.2f}")
    assert d32 < 1e-4 and 1e-6 < d16 < 3e-2
    assert (f32.lm_head is None) == bool(overrides.get("tie_word_embeddings"))
    # the fused tensors were split: q rows first, then k, then v; gate rows first, then up
    qkv = tensors["model.layers.0.self_attn.qkv_proj.weight"]
    np.testing.assert_array_equal(np.asarray(f32.layers.wk[...][0]).reshape(32, -1), qkv[32:48].T)
    gate_up = tensors["model.layers.0.mlp.gate_up_proj.weight"]
    np.testing.assert_array_equal(np.asarray(f32.layers.w_up[...][0]), gate_up[48:].T)


@pytest.mark.parity
def test_phi3_decode_matches_the_full_forward(tmp_path):
    """Prefill then one token at a time through the KV cache (the shared skeleton's decode) = the full forward."""
    _, config, tensors, ref = hf_reference(tmp_path, sliding_window=5)
    cfg = phi3.Phi3Config.from_hf(config)
    model = phi3.from_params(cfg, phi3.params_from_hf(cfg, tensors))
    cache = model.init_cache(2, 12)
    ids = jnp.asarray(IDS, jnp.int32)
    logits, cache = model.decode(ids[:, :7], cache, jnp.broadcast_to(jnp.arange(7), (2, 7)), jnp.ones((2, 12), bool))
    steps = [logits]
    for t in range(7, 12):
        out, cache = model.decode(ids[:, t:t + 1], cache, jnp.full((2, 1), t), jnp.ones((2, 12), bool))
        steps.append(out)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), ref, atol=1e-4)


@pytest.mark.parity
def test_phi3_gguf_round_trip(tmp_path):
    """Written as llama.cpp's convert_hf_to_gguf.py does for Phi-3 (fused attn_qkv / ffn_up kept fused), read back
    by the library's GGUF reader (config_from_gguf, tensors_from_gguf from the weight spec)."""
    gguf = pytest.importorskip("gguf")
    _, config, tensors, ref = hf_reference(tmp_path)
    to_gguf = {hf.format(i=i): g.format(i=i) for g, hf in phi3.GGUF_TO_HF.items() for i in range(2)}
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "phi3")
    writer.add_context_length(64), writer.add_embedding_length(32), writer.add_block_count(2)
    writer.add_feed_forward_length(48), writer.add_head_count(4), writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"]), writer.add_rope_freq_base(10000.0)
    writer.add_bos_token_id(1), writer.add_eos_token_id(2)
    for name, a in tensors.items():
        writer.add_tensor(to_gguf[name], np.ascontiguousarray(a))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    cfg, hf_tensors, _ = gguf_io.read_gguf(str(tmp_path / "m.gguf"), lambda arch: checkpoint.architecture(arch)[0])
    assert isinstance(cfg, phi3.Phi3Config) and not cfg.tie_word_embeddings and cfg.vocab_size == 96
    assert diff(phi3.from_params(cfg, phi3.params_from_hf(cfg, hf_tensors)), ref) < 1e-4


def test_phi3_is_registered_and_refuses_what_it_does_not_implement():
    module, config_cls = checkpoint.architecture("phi3")
    assert module is phi3 and config_cls is phi3.Phi3Config
    base = dict(TINY, model_type="phi3")
    for bad, pattern in [({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0],
                                               "long_factor": [1.0]}}, "longrope"),
                         ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                               "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
                         ({"hidden_act": "gelu"}, "hidden_act"), ({"model_type": "phi"}, "model_type")]:
        with pytest.raises(ConfigError, match=pattern):
            phi3.Phi3Config.from_hf({**base, **bad})
    assert jax.tree.leaves(phi3.Phi3(phi3.Phi3Config.from_hf(base)).layers.arrays())  # a random init works
