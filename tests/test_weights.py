"""mia_jax.models.weights: every family's weight spec covers its model exactly (names, ranks, partition rules), and
the HF export generated from it (train/export.py) round-trips through mia_jax.models.load and through transformers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from tokenizers import Tokenizer
from tokenizers import models as tok_models

from mia_jax.models import bert, checkpoint, gemma3, gpt2, gpt_neox, layers, llama, load, opt, phi3
from mia_jax.engine.sharding import PARTITION_RULES, path_str
from train.export import save_hf

SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
LLAMA = dict(SMALL, intermediate_size=48, num_key_value_heads=2, max_position_embeddings=64)
CASES = {  # name: (model class, config)
    "llama": (llama.Llama, llama.LlamaConfig(**LLAMA)),
    "llama_tied": (llama.Llama, llama.LlamaConfig(**LLAMA, tie_word_embeddings=True)),
    "mistral_window": (llama.Llama, llama.LlamaConfig(**LLAMA, sliding_window=4, model_type="mistral")),
    "qwen2_biases": (llama.Llama, llama.LlamaConfig(**LLAMA, attention_bias=True, model_type="qwen2")),
    "gemma3": (gemma3.Gemma3, gemma3.Gemma3Config(**LLAMA, head_dim=8, sliding_window=4, rope_local_base_freq=100.0,
                                                  layer_types=("sliding_attention", "full_attention"))),
    "gpt_neox_sequential": (gpt_neox.GPTNeoX, gpt_neox.GPTNeoXConfig(**SMALL, intermediate_size=48,
                                                                     use_parallel_residual=False)),
    "gpt2": (gpt2.GPT2, gpt2.GPT2Config(**SMALL, max_position_embeddings=32)),
    "opt_projected_post_ln": (opt.OPT, opt.OPTConfig(**SMALL, ffn_dim=48, word_embed_proj_dim=16,
                                                     do_layer_norm_before=False, max_position_embeddings=32)),
    "opt_no_bias_no_affine": (opt.OPT, opt.OPTConfig(**SMALL, ffn_dim=48, enable_bias=False,
                                                     layer_norm_elementwise_affine=False, max_position_embeddings=32)),
    "phi3": (phi3.Phi3, phi3.Phi3Config(**LLAMA, sliding_window=4)),
}
IDS = np.random.default_rng(0).integers(0, 60, (2, 10))


def family_of(cls) -> str:
    """The family (its module in mia_jax.models, as checkpoint.ARCHITECTURES names it) of a model class."""
    return cls.__module__.rsplit(".", 1)[-1]


def test_every_family_is_a_case():
    """Every family the loader knows (checkpoint.ARCHITECTURES) has a case here: the tests below (spec, partition
    rules, export round trip, transformers parity) and test_sharding's run on each."""
    missing = sorted({a.module for a in checkpoint.ARCHITECTURES.values()} - {family_of(c) for c, _ in CASES.values()})
    assert not missing, f"families of checkpoint.ARCHITECTURES without a case in CASES: {missing}"


def random_model(cls, cfg, seed=0):
    """Parameters of scale 0.3 (norm scales 1 + that; Gemma's zero-centred ones 0 + that), so logits differ."""
    rng = np.random.default_rng(seed)
    shapes = nnx.to_pure_dict(nnx.split(nnx.eval_shape(lambda: cls(cfg)))[1])
    one = not isinstance(cfg, gemma3.Gemma3Config)

    def init(path, spec):
        name = str(getattr(path[-1], "key", path[-1]))
        return ((one and "norm" in name and not name.endswith("_b")) + rng.normal(0, 0.3, spec.shape)).astype(
            np.float32)

    return layers.build_module(cls, cfg, jax.tree_util.tree_map_with_path(init, shapes))


def logits(model):
    return np.asarray(model(jnp.asarray(IDS, jnp.int32)))


@pytest.mark.parametrize("name", list(CASES))
def test_spec_describes_the_model_exactly(name):
    """Every parameter of the model is in its spec's logical axes with one axis per dimension, and gets a rule
    whose mesh axes come from LOGICAL_AXIS_RULES (the vocabulary over model, heads / MLP over model, the hidden
    dimension of matrices over fsdp, norms replicated)."""
    cls, cfg = CASES[name]
    model = nnx.eval_shape(lambda: cls(cfg))
    axes = cls.spec.logical_axes()
    rules = PARTITION_RULES[type(model).__module__.rsplit(".", 1)[-1]]
    for path, value in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]:
        p = path_str(path)
        assert len(axes[p]) == len(value.shape), (p, axes[p], value.shape)
        assert len(rules[p]) == len(value.shape)
        if "norm" in p:
            assert rules[p] == P(*(None,) * len(value.shape)), p
    assert rules["embed"][0] == "model" and rules["layers/w_down"] == P(None, "model", "fsdp")


def test_fused_hf_tensors_are_split_and_joined_back():
    cls, cfg = CASES["phi3"]
    model = random_model(cls, cfg)
    params = nnx.to_pure_dict(nnx.state(model))
    hf = cls.spec.to_hf(cfg, params)
    assert hf["model.layers.1.self_attn.qkv_proj.weight"].shape == ((4 + 2 + 2) * 8, 32)
    assert hf["model.layers.0.mlp.gate_up_proj.weight"].shape == (2 * 48, 32)
    back = cls.spec.from_hf(cfg, hf)
    for key in ("wq", "wk", "wv", "w_gate", "w_up"):
        np.testing.assert_array_equal(np.asarray(back["layers"][key]), params["layers"][key])


@pytest.mark.parametrize("name", list(CASES))
def test_export_round_trip(tmp_path, name):
    """save_hf (generated from the spec) -> models.load gives the same logits, bit for bit."""
    cls, cfg = CASES[name]
    model = random_model(cls, cfg)
    tokenizer = Tokenizer(tok_models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    save_hf(tmp_path / "model", model, tokenizer)
    loaded = load(str(tmp_path / "model"))
    assert type(loaded.model) is cls and loaded.config == cfg
    np.testing.assert_array_equal(logits(loaded.model), logits(model))


@pytest.mark.parity
@pytest.mark.parametrize("name", list(CASES))
def test_export_loads_in_transformers(tmp_path, name):
    """The exported folder is a valid Hugging Face checkpoint: transformers gives the same logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cls, cfg = CASES[name]
    model = random_model(cls, cfg)
    save_hf(tmp_path / "model", model, Tokenizer(tok_models.WordLevel({"a": 0}, unk_token="a")))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.as_tensor(IDS)).logits.numpy()
    np.testing.assert_allclose(logits(model), ref, atol=1e-4, rtol=0)


def test_bert_spec_reads_both_head_layouts():
    for model_type, head in (("bert", "cls.predictions.transform.dense.weight"), ("roberta", "lm_head.dense.weight")):
        spec = bert.SPECS[model_type]
        assert spec.prefixes[0][1] + spec.top[5].hf == head
        assert set(spec.logical_axes()) == set(bert.SPEC.logical_axes())
