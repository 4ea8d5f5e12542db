"""Network ops shared by the model families: dtypes and config errors, activations and LayerNorm in float32, RoPE,
causal and grouped-query attention, the KV cache layout, learned positions, the unembedding, and `build_module`
(a module from its parameters). Checkpoint tensors are in `tensors.py`, weight specs in `weights.py`, the shared
decoder in `causal_lm.py`."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.errors import UserError
from mia_jax.models import attention as _attention

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class ConfigError(UserError, ValueError):
    """A model config this implementation does not support."""


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
    """``name`` when it is a supported activation, else ConfigError naming the config ``option``."""
    if name not in ACTIVATIONS:
        raise ConfigError(f"unsupported {option} {name!r}; supported: {sorted(ACTIVATIONS)}")
    return name


def mlp_activation(name: str, x):
    """The activation computed in float32, returned in x's dtype."""
    return ACTIVATIONS[name](x.astype(jnp.float32)).astype(x.dtype)


def check_dtype(dtype: str):
    """The JAX dtype of the name ``dtype`` (``DTYPES``); ConfigError for another name."""
    if dtype not in DTYPES:
        raise ConfigError(f"unsupported dtype {dtype!r}; supported: {list(DTYPES)}")
    return DTYPES[dtype]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BaseConfig:
    """The fields every causal LM family's config has (Hugging Face names). Keyword-only, so that a family's config
    dataclass can subclass this whatever its own fields."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class MultiHeadConfig(BaseConfig):
    """A config whose attention heads split the hidden size (GPT-2, GPT-NeoX, OPT): `head_dim` is derived and
    `__post_init__` fills the fields of `DERIVED` left None ({name: fn(config)}) and checks the model_type
    (`MODEL_TYPE`), the heads and the activation option named `ACTIVATION`."""

    MODEL_TYPE: ClassVar[str]
    FAMILY: ClassVar[str]
    ACTIVATION: ClassVar[str]
    DERIVED: ClassVar[dict[str, Callable]] = {}

    def __post_init__(self):
        for name, fn in self.DERIVED.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, fn(self))
        check_model_type(self.model_type, (self.MODEL_TYPE,), self.FAMILY)
        check_heads(self.hidden_size, self.num_attention_heads)
        check_activation(self.ACTIVATION, getattr(self, self.ACTIVATION))

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head (hidden_size / num_attention_heads)."""
        return self.hidden_size // self.num_attention_heads


def check_model_type(model_type, supported: tuple[str, ...], family: str) -> str:
    """``model_type`` when it is among ``supported`` (the ``family``'s), else ConfigError."""
    if model_type not in supported:
        raise ConfigError(f"unsupported model_type {model_type!r} for {family}; supported: {supported}")
    return model_type


def check_heads(hidden_size: int, num_heads: int, num_kv_heads: int | None = None) -> None:
    """Attention heads must split the hidden size (num_kv_heads None) or group evenly over the key/value heads."""
    if num_kv_heads is None and hidden_size % num_heads:
        raise ConfigError(f"hidden_size={hidden_size} is not a multiple of num_attention_heads={num_heads}")
    if num_kv_heads is not None and num_heads % num_kv_heads:
        raise ConfigError(f"num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_kv_heads}")


def first_id(value):
    """Llama 3 configs list several eos ids; the first is the one used here."""
    return value[0] if isinstance(value, (list, tuple)) else value


def token_ids(hf, bos=None, eos=None, pad=None) -> dict:
    """The bos/eos/pad_token_id config arguments from a config.json dict (defaults: the family's)."""
    defaults = {"bos": bos, "eos": eos, "pad": pad}
    return {f"{k}_token_id": first_id(hf.get(f"{k}_token_id", d)) for k, d in defaults.items()}


def config_from_hf(cls, hf, **given):
    """`cls(...)` from a config.json dict: each dataclass field from `given`, else from `hf` under the same name (a
    family's config fields carry Hugging Face names), else its default. A required field that `hf` lacks is a
    KeyError naming it (`hf.parse_config` reports it as a missing key)."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in given or f.name in hf:
            kwargs[f.name] = given[f.name] if f.name in given else hf[f.name]
        elif f.default is dataclasses.MISSING:
            raise KeyError(f.name)
    return cls(**kwargs)


def config_to_hf(cfg, drop: tuple[str, ...] = (), **extra) -> dict:
    """The inverse of `config_from_hf`: every field but `drop`, plus `extra` (architectures, renamed fields)."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in drop}
    return {**fields, "torch_dtype": "float32", **extra}


def layer_norm(x, weight, bias, eps):
    """LayerNorm with mean and variance in float32, returned in x's dtype; weight / bias None: no affine."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    y = y if weight is None else y * weight.astype(jnp.float32)
    return (y if bias is None else y + bias.astype(jnp.float32)).astype(x.dtype)


def inv_freq(head_dim: int, theta: float, rope_scaling: dict | None = None, freq_factors=None) -> np.ndarray:
    """Inverse RoPE frequencies [head_dim/2] (float32), following transformers' rope_type formulas."""
    inv = (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)).astype(np.float32)
    sc = rope_scaling or {}
    if sc.get("rope_type") == "linear":
        inv = inv / sc["factor"]
    elif sc.get("rope_type") == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, np.float32)
    return inv.astype(np.float32)


def rope_at(positions, inv: np.ndarray):
    """(cos, sin), each float32 [..., head_dim], for integer positions [...] (rotate-half layout)."""
    angles = jnp.asarray(positions).astype(jnp.float32)[..., None] * jnp.asarray(inv, jnp.float32)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """x [B, T, H, Dh]; cos/sin float32 [T, Dh] (shared by the batch) or [B, T, Dh] (per-row positions)."""
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos[..., None, :] + rotated * sin[..., None, :]).astype(x.dtype)


def causal_mask(t: int, sliding_window: int | None):
    """[T, T] bool: query i sees key j when j <= i (and i - j < sliding_window when set)."""
    return _attention.dense_mask(t, t, causal=True, sliding_window=sliding_window)


def gqa_attention(q, k, v, mask, scale: float, segment_ids=None):
    """Grouped-query attention. q [B, T, H, Dh], k/v [B, S, KV, Dh], mask bool [T, S] or per row [B, T, S]
    -> [B, T, H, Dh]; scores and softmax in float32 (`mia_jax.models.attention.attention`: chunked, memory
    linear in T, for long sequences). `segment_ids` int [B, T] (T == S): also only keys of the query's segment."""
    return _attention.attention(q, k, v, scale=scale, mask=mask, segment_ids=segment_ids)


def causal_attention(q, k, v, scale, segment_ids=None):
    """q, k, v [B, T, H, Dh] -> [B, T, H, Dh]; causal (no [T, T] mask is built), scores and softmax in float32.
    `segment_ids` int [B, T] (packed rows): a query sees only the earlier keys of its own segment."""
    return _attention.attention(q, k, v, scale=scale, causal=True, segment_ids=segment_ids)


def segment_positions(segment_ids):
    """int32 positions [B, T] of packed rows: t minus the index of the first token of t's run of equal consecutive
    segment ids (0 at each text's first token)."""
    t = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)
    starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]],
                             axis=1)
    return t - jax.lax.cummax(jnp.where(starts, t, 0), axis=1)


# ----------------------------------------------------------------------------- KV cache


def init_cache(num_layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int, dtype) -> dict:
    """An empty KV cache: k, v [L, B, S, KV, Dh] (parameter dtype) and the next slot to write, `index`."""
    shape = (num_layers, batch, max_len, kv_heads, head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype), "index": jnp.zeros((), jnp.int32)}


def cache_masks(cache: dict, t_new: int, key_mask, sliding_window: int | None = None):
    """(full, window) bool [B, T_new, S] for queries in slots index..index+T_new-1: a key slot is visible when it
    is not after the query, valid in `key_mask` [B, S], and (window) fewer than `sliding_window` slots back.
    Left-padded rows hold their real tokens in consecutive slots, so slot distance is position distance."""
    s = cache["k"].shape[2]
    full = _attention.dense_mask(t_new, s, q_offset=cache["index"], key_mask=key_mask)
    window = full if sliding_window is None else _attention.dense_mask(
        t_new, s, sliding_window=sliding_window, q_offset=cache["index"], key_mask=key_mask)
    return full, window


def learned_positions(table, positions, offset: int = 0):
    """Rows `positions + offset` of a learned position table, clipped into it (left-padding rows have negative
    positions; their outputs are never used)."""
    return jnp.take(table, jnp.clip(positions + offset, 0, table.shape[0] - 1), axis=0)


def check_length(t: int, max_positions: int, family: str):
    """UserError when a sequence of ``t`` tokens is longer than the model's ``max_positions``; None otherwise."""
    if t > max_positions:
        raise UserError(f"{family}: sequence length {t} exceeds max_position_embeddings={max_positions}; "
                        "truncate the inputs (runner max_length)")


def unembed(hidden, unembedding):
    """hidden [B, T, D] x unembedding [V, D] -> float32 logits [B, T, V]."""
    return jnp.einsum("btd,vd->btv", hidden, unembedding, preferred_element_type=jnp.float32)


def build_module(module_cls, cfg, params: dict, dtype: str = "float32", place: Callable | None = None):
    """A `module_cls(cfg, dtype)` holding `params` (nested dict matching its state; arrays or `Lazy`), without
    random init. Each tensor is read, converted and placed in turn: by default on the default device; with
    `place(arch, path, shape, value, dtype) -> jax.Array` wherever that puts it (`sharding.load_sharded`)."""
    dt = check_dtype(dtype)
    arch = module_cls.__module__.rsplit(".", 1)[-1]
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
        shape = tuple(spec.shape)
        if shape != tuple(np.shape(value)):
            raise UserError(f"tensor {fmt(path)} has shape {np.shape(value)}, expected {shape}")
        if place is not None:
            return place(arch, fmt(path), shape, value, dt)
        return jnp.asarray(np.asarray(value), dt)

    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(convert, expected, params))
    return nnx.merge(graphdef, state)
