"""mia_jax.models.{gpt_neox, gpt2, opt}: logit parity with transformers (float32 and bfloat16 parameters),
config variants that must matter, unsupported options, jit, causality and GGUF round trips."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import torch_logits

from mia_jax.models import gpt2, gpt_neox, opt
from mia_jax.models.layers import build_module
from mia_jax.models.llama import ConfigError

TOKENIZER_SIZE = 128  # NeoX gets 8 padded vocabulary rows beyond it, as Pythia does (50304 > 50277)
IDS = np.random.default_rng(0).integers(0, TOKENIZER_SIZE, (2, 12))
TINY = {
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", gpt_neox,
                 dict(vocab_size=136, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=64)),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", gpt2,
             dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=32, bos_token_id=0, eos_token_id=0)),
    "opt": ("OPTForCausalLM", "OPTConfig", opt,
            dict(vocab_size=128, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=32)),
}
CONFIGS = {"gpt_neox": gpt_neox.GPTNeoXConfig, "gpt2": gpt2.GPT2Config, "opt": opt.OPTConfig}


def hf_reference(tmp_path, family, **overrides):
    """A seeded transformers model with every parameter randomised (LayerNorm affines too), saved as
    safetensors; returns (torch model, config.json dict, tensors as numpy)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.numpy import load_file

    model_cls, config_cls, _, base = TINY[family]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**{**base, **overrides})).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(p + 0.1 * torch.randn_like(p) if p.ndim == 1 else 0.08 * torch.randn_like(p))
    model.save_pretrained(tmp_path, safe_serialization=True)
    config = json.loads((tmp_path / "config.json").read_text())
    return model, config, load_file(str(tmp_path / "model.safetensors"))


def diff(module, reference):
    return float(np.abs(np.asarray(module(jnp.asarray(IDS, jnp.int32))) - reference).max())


def check_parity(tmp_path, family, **overrides):
    """Float32 < 1e-4 and bfloat16 < 3e-2 max abs logit difference; returns (module, config, ref logits)."""
    *_, mod, _ = TINY[family]
    model, config, tensors = hf_reference(tmp_path, family, **overrides)
    cfg = CONFIGS[family].from_hf(config)
    params = mod.params_from_hf(cfg, tensors)
    ref = torch_logits(model, IDS)
    f32 = mod.from_params(cfg, params)
    out = f32(jnp.asarray(IDS, jnp.int32))
    assert out.dtype == jnp.float32 and out.shape == (*IDS.shape, cfg.vocab_size)
    d32 = float(np.abs(np.asarray(out) - ref).max())
    bf16 = mod.from_params(cfg, params, "bfloat16")
    assert bf16.embed[...].dtype == jnp.bfloat16
    d16 = diff(bf16, ref)
    print(f"{family} {overrides}: float32 {d32:.2e}  bfloat16 {d16:.2e}  max|logit| {np.abs(ref).max():.2f}")
    assert d32 < 1e-4 and 1e-6 < d16 < 3e-2
    return f32, cfg, ref


def check_jit_and_causality(model, ref):
    """hidden_states under jit (as the runner calls it) times the unembedding gives the reference logits;
    changing later tokens never changes earlier logits (so right padding is harmless)."""
    graphdef, state = nnx.split(model)
    hidden = jax.jit(lambda st, ids: nnx.merge(graphdef, st).hidden_states(ids))(state, jnp.asarray(IDS, jnp.int32))
    assert hidden.shape == (*IDS.shape, model.unembedding().shape[1])
    np.testing.assert_allclose(jnp.einsum("btd,vd->btv", hidden, model.unembedding()), ref, atol=1e-4)
    changed = IDS.copy()
    changed[:, 7:] = 3
    np.testing.assert_allclose(model(jnp.asarray(changed))[:, :7], ref[:, :7], atol=1e-4)


def with_config(module, **changes):
    """The same parameters under a changed config (to show a config option matters); parameters the
    changed config has no place for (e.g. OPT's final norm when post-LN) are dropped."""
    cfg = dataclasses.replace(module.config, **changes)
    wanted = nnx.to_pure_dict(nnx.split(nnx.eval_shape(lambda: type(module)(cfg)))[1])
    params = {k: v for k, v in nnx.to_pure_dict(nnx.split(module)[1]).items() if k in wanted}
    return build_module(type(module), cfg, params)


@pytest.mark.parity
@pytest.mark.parametrize("parallel,rotary_pct,act", [(True, 0.25, "gelu"), (False, 0.25, "gelu"),
                                                      (True, 1.0, "gelu_new"), (False, 1.0, "gelu")])
def test_gpt_neox_parity(tmp_path, parallel, rotary_pct, act):
    model, cfg, ref = check_parity(tmp_path, "gpt_neox", use_parallel_residual=parallel, hidden_act=act,
                                   rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": rotary_pct,
                                                    "rope_type": "default"})
    assert (cfg.use_parallel_residual, cfg.rotary_pct, cfg.hidden_act) == (parallel, rotary_pct, act)
    assert cfg.vocab_size == 136 and model.unembedding().shape == (136, 64) and not cfg.tie_word_embeddings
    assert diff(with_config(model, use_parallel_residual=not parallel), ref) > 1e-3
    assert diff(with_config(model, rotary_pct=1.25 - rotary_pct), ref) > 1e-3
    if parallel and rotary_pct == 0.25:  # the Pythia setting
        assert diff(with_config(model, rotary_emb_base=100.0), ref) > 1e-3
        check_jit_and_causality(model, ref)


def test_gpt_neox_legacy_rotary_keys():
    """Old config.json files spell the rotary settings rotary_pct / rotary_emb_base."""
    cfg = gpt_neox.GPTNeoXConfig.from_hf(dict(model_type="gpt_neox", vocab_size=136, hidden_size=64,
                                              intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                              rotary_pct=0.5, rotary_emb_base=500.0))
    assert (cfg.rotary_pct, cfg.rotary_ndims, cfg.rotary_emb_base) == (0.5, 8, 500.0)


@pytest.mark.parity
@pytest.mark.parametrize("overrides", [{}, {"scale_attn_by_inverse_layer_idx": True, "n_inner": 48}])
def test_gpt2_parity(tmp_path, overrides):
    model, cfg, ref = check_parity(tmp_path, "gpt2", **overrides)
    assert cfg.tie_word_embeddings and model.lm_head is None
    if overrides:
        assert cfg.intermediate_size == 48
        assert diff(with_config(model, scale_attn_by_inverse_layer_idx=False), ref) > 1e-3
    else:
        check_jit_and_causality(model, ref)
    assert diff(with_config(model, scale_attn_weights=False), ref) > 1e-3


@pytest.mark.parity
@pytest.mark.parametrize("overrides", [{}, {"do_layer_norm_before": False, "word_embed_proj_dim": 16},
                                       {"enable_bias": False, "layer_norm_elementwise_affine": False}])
def test_opt_parity(tmp_path, overrides):
    model, cfg, ref = check_parity(tmp_path, "opt", **overrides)
    assert cfg.do_layer_norm_before == overrides.get("do_layer_norm_before", True)
    if not overrides:  # pre-LN: flipping to post-LN (and dropping the final norm) must change the logits
        assert diff(with_config(model, do_layer_norm_before=False), ref) > 1e-3
    elif "word_embed_proj_dim" in overrides:  # post-LN OPT-350m: project_in/out, no final layer norm
        assert model.project_in is not None and model.unembedding().shape == (128, 16)
        assert model.final_norm is None
        check_jit_and_causality(model, ref)
        assert diff(with_config(model, do_layer_norm_before=True, remove_final_layer_norm=True), ref) > 1e-3


def test_unsupported_options_raise_config_error():
    neox = dict(model_type="gpt_neox", vocab_size=136, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4)
    with pytest.raises(ConfigError, match="hidden_act"):
        gpt_neox.GPTNeoXConfig.from_hf({**neox, "hidden_act": "mish"})
    with pytest.raises(ConfigError, match="rope_type 'linear'"):
        gpt_neox.GPTNeoXConfig.from_hf({**neox, "rope_scaling": {"type": "linear", "factor": 2.0}})
    with pytest.raises(ConfigError, match="model_type"):
        gpt_neox.GPTNeoXConfig.from_hf({**neox, "model_type": "llama"})
    g2 = dict(model_type="gpt2", vocab_size=128, n_embd=32, n_layer=2, n_head=4)
    with pytest.raises(ConfigError, match="add_cross_attention"):
        gpt2.GPT2Config.from_hf({**g2, "add_cross_attention": True})
    with pytest.raises(ConfigError, match="activation_function"):
        gpt2.GPT2Config.from_hf({**g2, "activation_function": "tanh"})
    with pytest.raises(ConfigError, match="activation_function"):
        opt.OPTConfig.from_hf(dict(model_type="opt", vocab_size=128, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                   num_attention_heads=4, activation_function="relu6"))
    with pytest.raises(ConfigError, match="dtype"):
        gpt2.GPT2(gpt2.GPT2Config.from_hf(g2), dtype="float16")


def _gguf_round_trip(tmp_path, family, hf_to_gguf_tensor, meta):
    """Write the HF tensors as llama.cpp's convert_hf_to_gguf.py would, read them back, compare logits."""
    gguf = pytest.importorskip("gguf")
    *_, mod, _ = TINY[family]
    model, config, tensors = hf_reference(tmp_path, family)
    inverse = {hf.format(i=i): g.format(i=i) for g, hf in mod.GGUF_TO_HF.items() for i in range(2)}
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), mod.GGUF_ARCH)
    for key, value in meta(config).items():
        getattr(writer, f"add_{key}")(value)
    for name, a in tensors.items():
        writer.add_tensor(inverse[name], np.ascontiguousarray(hf_to_gguf_tensor(name, a, config)))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        step()
    writer.close()
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    fields = {name: f.contents() for name, f in reader.fields.items()}
    arrays = {t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
              .reshape(tuple(int(n) for n in reversed(t.shape))) for t in reader.tensors}
    cfg = mod.config_from_gguf(fields, arrays)
    assert isinstance(cfg, CONFIGS[family])
    module = mod.from_params(cfg, mod.params_from_hf(cfg, mod.tensors_from_gguf(cfg, arrays)))
    assert diff(module, torch_logits(model, IDS)) < 1e-4
    return cfg


@pytest.mark.parity
def test_gpt_neox_gguf_round_trip(tmp_path):
    def to_gguf(name, a, c):  # q/k/v regrouped from per-head [H, 3, Dh] to [3, H, Dh] rows
        if "query_key_value" not in name:
            return a
        return a.reshape(c["num_attention_heads"], 3, -1, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)

    meta = lambda c: dict(  # noqa: E731
        context_length=c["max_position_embeddings"], embedding_length=c["hidden_size"], block_count=2,
        feed_forward_length=c["intermediate_size"], head_count=c["num_attention_heads"],
        rope_dimension_count=int(0.25 * c["hidden_size"] // c["num_attention_heads"]),
        parallel_residual=True, layer_norm_eps=c["layer_norm_eps"], bos_token_id=0, eos_token_id=0)
    cfg = _gguf_round_trip(tmp_path, "gpt_neox", to_gguf, meta)
    assert (cfg.rotary_pct, cfg.use_parallel_residual, cfg.vocab_size) == (0.25, True, 136)


@pytest.mark.parity
def test_gpt2_gguf_round_trip(tmp_path):
    conv1d = ("c_attn.weight", "c_proj.weight", "c_fc.weight")
    meta = lambda c: dict(  # noqa: E731
        context_length=c["n_positions"], embedding_length=c["n_embd"], block_count=2,
        feed_forward_length=4 * c["n_embd"], head_count=c["n_head"], layer_norm_eps=c["layer_norm_epsilon"])
    cfg = _gguf_round_trip(tmp_path, "gpt2", lambda n, a, c: a.T if n.endswith(conv1d) else a, meta)
    assert cfg.tie_word_embeddings and cfg.max_position_embeddings == 32
