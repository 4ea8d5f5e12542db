"""Pieces shared by the GPT-NeoX, GPT-2 and OPT implementations: float32 LayerNorm, activations, causal
multi-head attention over given q/k/v, stacked per-layer parameters applied with `jax.lax.scan`, checkpoint
tensor lookup, GGUF renaming and the generic `from_params`."""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.errors import UserError
from mia_jax.models.llama import DTYPES, ConfigError

_tanh_gelu = lambda x: jax.nn.gelu(x, approximate=True)  # noqa: E731
_exact_gelu = lambda x: jax.nn.gelu(x, approximate=False)  # noqa: E731
# transformers ACT2FN name -> function (computed in float32 by `mlp_activation`)
ACTIVATIONS: dict[str, Callable] = {
    "gelu": _exact_gelu,
    "gelu_python": _exact_gelu,
    "gelu_new": _tanh_gelu,
    "gelu_fast": _tanh_gelu,
    "gelu_pytorch_tanh": _tanh_gelu,
    "gelu_python_tanh": _tanh_gelu,
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def check_activation(option: str, name: str) -> str:
    if name not in ACTIVATIONS:
        raise ConfigError(f"unsupported {option} {name!r}; supported: {sorted(ACTIVATIONS)}")
    return name


def mlp_activation(name: str, x):
    """The activation computed in float32, returned in x's dtype."""
    return ACTIVATIONS[name](x.astype(jnp.float32)).astype(x.dtype)


def check_dtype(dtype: str):
    if dtype not in DTYPES:
        raise ConfigError(f"unsupported dtype {dtype!r}; supported: {list(DTYPES)}")
    return DTYPES[dtype]


def layer_norm(x, weight, bias, eps):
    """LayerNorm with mean and variance in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (y * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def causal_attention(q, k, v, scale):
    """q, k, v [B, T, H, Dh] -> [B, T, H, Dh]; causal, scores and softmax in float32."""
    t = q.shape[1]
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
    mask = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bhts,bshd->bthd", probs, v)


def check_length(t: int, max_positions: int, family: str):
    if t > max_positions:
        raise UserError(f"{family}: sequence length {t} exceeds max_position_embeddings={max_positions}; "
                        "truncate the inputs (runner max_length)")


def normal_param(rngs: nnx.Rngs, shape, dtype, std: float = 0.02):
    return nnx.Param((jax.random.normal(rngs.params(), shape, jnp.float32) * std).astype(dtype))


def _init_for(name: str, shape, dtype, rngs):
    if name.endswith("_b") or name.startswith("b_"):
        return nnx.Param(jnp.zeros(shape, dtype))
    if name.startswith("ln"):
        return nnx.Param(jnp.ones(shape, dtype))
    return normal_param(rngs, shape, dtype, 1.0 / math.sqrt(shape[1]))


class StackedLayers(nnx.Module):
    """The parameters of all decoder layers, each with a leading [num_layers] axis.

    `shapes` maps a name to its per-layer shape; names starting with "ln" are norm scales (ones), names
    ending in "_b" or starting with "b_" are biases (zeros), everything else a weight (normal / sqrt(fan_in)).
    """

    def __init__(self, num_layers: int, shapes: Mapping[str, tuple], dtype, rngs: nnx.Rngs):
        for name, shape in shapes.items():
            setattr(self, name, _init_for(name, (num_layers, *shape), dtype, rngs))

    def scan(self, layer_fn: Callable, x, xs: Any = None):
        """x <- layer_fn(params_i, x, xs_i) for each layer i (compile time independent of depth)."""
        params = {k: v[...] for k, v in vars(self).items() if isinstance(v, nnx.Param)}
        x, _ = jax.lax.scan(lambda h, px: (layer_fn(px[0], h, px[1]), None), x, (params, xs))
        return x


def unembed(hidden, unembedding):
    """hidden [B, T, D] x unembedding [V, D] -> float32 logits [B, T, V]."""
    return jnp.einsum("btd,vd->btv", hidden, unembedding, preferred_element_type=jnp.float32)


class Tensors:
    """Checkpoint lookup with the name prefixes a family's checkpoints use (e.g. 'transformer.' or none)."""

    def __init__(self, tensors: Mapping[str, np.ndarray], prefixes: tuple[str, ...], probe: str, family: str):
        self.tensors, self.family = tensors, family
        self.prefix = next((p for p in prefixes if p + probe in tensors), prefixes[0])

    def __call__(self, name: str, absolute: bool = False) -> np.ndarray:
        key = name if absolute else self.prefix + name
        if key not in self.tensors:
            raise UserError(f"{self.family} checkpoint is missing tensor {key!r}")
        return np.asarray(self.tensors[key], np.float32)

    def stack(self, table: Mapping[str, tuple[str, Callable]], num_layers: int, layer_fmt: str) -> dict:
        """{internal name: [L, ...] array} from {internal name: (HF suffix, conversion)} per layer."""
        return {key: np.stack([conv(self(layer_fmt.format(i=i) + hf)) for i in range(num_layers)])
                for key, (hf, conv) in table.items()}


def rename_gguf(arrays: Mapping[str, np.ndarray], table: Mapping[str, str], arch: str) -> dict[str, np.ndarray]:
    """GGUF-named arrays -> HF-named arrays via a 'blk.{i}.x' -> 'prefix.{i}.y' table (unknown names fail)."""
    out = {}
    for name, a in arrays.items():
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        key, layer = (f"blk.{{i}}.{m.group(2)}", m.group(1)) if m else (name, "")
        if key not in table:
            raise UserError(f"unexpected tensor {name!r} for a {arch} GGUF")
        out[table[key].format(i=layer)] = a
    return out


def gguf_getter(meta: Mapping[str, Any]):
    arch = meta["general.architecture"]
    return lambda key, default=None: meta.get(f"{arch}.{key}", default)


def gguf_vocab_size(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None) -> int:
    if arrays is not None and "token_embd.weight" in arrays:
        return int(arrays["token_embd.weight"].shape[0])
    size = gguf_getter(meta)("vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
    if not size:
        raise UserError("GGUF metadata has no vocab_size and no tokenizer.ggml.tokens")
    return int(size)


def gguf_special_ids(meta: Mapping[str, Any]) -> dict:
    return {f"{k}_token_id": meta.get(f"tokenizer.ggml.{g}_token_id")
            for k, g in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))}


def build_module(module_cls, cfg, params: dict, dtype: str = "float32"):
    """A `module_cls(cfg, dtype)` holding `params` (nested dict matching its state), without random init."""
    dt = check_dtype(dtype)
    abstract = nnx.eval_shape(lambda: module_cls(cfg, dtype))
    graphdef, state = nnx.split(abstract)
    expected = nnx.to_pure_dict(state)
    flat_expected = dict(jax.tree_util.tree_flatten_with_path(expected)[0])
    flat_given = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    fmt = lambda path: "/".join(str(getattr(p, "key", p)) for p in path)  # noqa: E731
    missing = sorted(fmt(p) for p in flat_expected.keys() - flat_given.keys())
    extra = sorted(fmt(p) for p in flat_given.keys() - flat_expected.keys())
    if missing or extra:
        raise UserError(f"{module_cls.__name__} params do not match the config: missing {missing}, unexpected {extra}")

    def convert(path, spec, value):
        if tuple(spec.shape) != tuple(np.shape(value)):
            raise UserError(f"tensor {fmt(path)} has shape {np.shape(value)}, expected {tuple(spec.shape)}")
        return jnp.asarray(value, dt)

    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(convert, expected, params))
    return nnx.merge(graphdef, state)
