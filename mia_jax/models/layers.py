"""Pieces shared by the causal LMs: dtypes and config errors, RoPE, float32 norms and activations, causal and
grouped-query attention, stacked per-layer parameters applied with `jax.lax.scan`, the KV cache used by every
family's `decode`, lazy checkpoint tensors and their lookup, GGUF metadata helpers and the generic `from_params`."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.errors import UserError

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


def rope_tables(t: int, inv: np.ndarray):
    """(cos, sin), each float32 [T, head_dim], for positions 0..T-1."""
    return rope_at(jnp.arange(t), inv)


def apply_rope(x, cos, sin):
    """x [B, T, H, Dh]; cos/sin float32 [T, Dh] (shared by the batch) or [B, T, Dh] (per-row positions)."""
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos[..., None, :] + rotated * sin[..., None, :]).astype(x.dtype)


def causal_mask(t: int, sliding_window: int | None):
    """[T, T] bool: query i sees key j when j <= i (and i - j < sliding_window when set)."""
    i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
    mask = j <= i
    return mask if sliding_window is None else mask & (i - j < sliding_window)


def gqa_attention(q, k, v, mask, scale: float):
    """Grouped-query attention. q [B, T, H, Dh], k/v [B, S, KV, Dh], mask bool [T, S] or per row [B, T, S]
    -> [B, T, H, Dh]; scores and softmax in float32."""
    B, T, H, Dh = q.shape
    KV = k.shape[2]
    q = q.reshape(B, T, KV, H // KV, Dh)  # query heads grouped by their kv head
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
    mask = mask[:, None, None] if mask.ndim == 3 else mask
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(B, T, H, Dh)


def causal_attention(q, k, v, scale):
    """q, k, v [B, T, H, Dh] -> [B, T, H, Dh]; causal, scores and softmax in float32."""
    return gqa_attention(q, k, v, causal_mask(q.shape[1], None), scale)


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
    q = cache["index"] + jnp.arange(t_new)[:, None]
    k = jnp.arange(s)[None, :]
    full = (k <= q)[None] & key_mask[:, None, :].astype(bool)
    window = full if sliding_window is None else full & (q - k < sliding_window)[None]
    return full, window


def scan_with_cache(params: Mapping[str, Any], layer_fn: Callable, x, xs, cache: dict):
    """Decoder layers over new tokens x [B, T, D] with a KV cache, one `jax.lax.scan` over the stacked `params`.

    `layer_fn(p, h, xs_i) -> (q, k, v, mask, scale, finish)`: the layer's attention inputs for the new tokens
    (q [B, T, H, Dh], k/v [B, T, KV, Dh]), its mask over the cache slots ([B, T, S]), the score scale and
    `finish(attn) -> h`, the rest of the layer. k/v are written into the cache at slot `index` with
    `dynamic_update_slice` and the queries attend over the whole cache. Returns (x, cache advanced by T).
    """
    index, t = cache["index"], x.shape[1]

    def body(carry, px):
        h, ck, cv, i = carry
        q, k, v, mask, scale, finish = layer_fn(px[0], h, px[1])
        ck = jax.lax.dynamic_update_slice(ck, k[None].astype(ck.dtype), (i, 0, index, 0, 0))
        cv = jax.lax.dynamic_update_slice(cv, v[None].astype(cv.dtype), (i, 0, index, 0, 0))
        attn = gqa_attention(q, ck[i].astype(q.dtype), cv[i].astype(v.dtype), mask, scale)
        return (finish(attn), ck, cv, i + 1), None

    (x, k, v, _), _ = jax.lax.scan(body, (x, cache["k"], cache["v"], jnp.int32(0)), (dict(params), xs))
    return x, {"k": k, "v": v, "index": index + t}


def learned_positions(table, positions, offset: int = 0):
    """Rows `positions + offset` of a learned position table, clipped into it (left-padding rows have negative
    positions; their outputs are never used)."""
    return jnp.take(table, jnp.clip(positions + offset, 0, table.shape[0] - 1), axis=0)


def stacked_params(module: nnx.Module) -> dict:
    """{name: [L, ...] array} of a module's nnx.Param attributes."""
    return {k: v[...] for k, v in vars(module).items() if isinstance(v, nnx.Param)}


def scan_layers(module: nnx.Module, layer_fn: Callable, x, xs: Any = None):
    """x <- layer_fn(params_i, x, xs_i) over the stacked parameters of `module` (compile time independent of
    depth)."""
    x, _ = jax.lax.scan(lambda h, px: (layer_fn(px[0], h, px[1]), None), x, (stacked_params(module), xs))
    return x


def init_param(rngs, shape, dtype, fan_in):
    return nnx.Param((jax.random.normal(rngs.params(), shape, jnp.float32) / math.sqrt(fan_in)).astype(dtype))


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
        return scan_layers(self, layer_fn, x, xs)

    def scan_cached(self, layer_fn: Callable, x, xs, cache: dict):
        """`scan_with_cache` over these layers."""
        return scan_with_cache(stacked_params(self), layer_fn, x, xs, cache)


def unembed(hidden, unembedding):
    """hidden [B, T, D] x unembedding [V, D] -> float32 logits [B, T, V]."""
    return jnp.einsum("btd,vd->btv", hidden, unembedding, preferred_element_type=jnp.float32)


class Lazy:
    """A checkpoint tensor that is read (and converted) only when its values are needed. `shape` is known up
    front; `np.asarray(x)` reads it whole; `x[index]` reads what `index` needs, and only that where the source
    allows it (a safetensors slice, the selected layers of a `stack_layers`). Checkpoint readers return these,
    so that `build_module` can place a model tensor by tensor, never holding all of it in host memory."""

    def __init__(self, shape, read: Callable[[], np.ndarray], take: Callable[[tuple], np.ndarray] | None = None):
        self.shape, self._read, self._take = tuple(int(d) for d in shape), read, take

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __array__(self, dtype=None, copy=None):
        a = np.asarray(self._read())
        return a if dtype is None else a.astype(dtype, copy=False)

    def __getitem__(self, index) -> np.ndarray:
        """A copy (never a view that would keep the whole tensor alive)."""
        return np.array(self._take(index) if self._take else np.asarray(self._read())[index])

    def then(self, fn: Callable[[np.ndarray], np.ndarray]) -> "Lazy":
        """`fn` (reshapes, transposes, arithmetic) applied to the float32 values when they are read."""
        shape = jax.eval_shape(fn, jax.ShapeDtypeStruct(self.shape, jnp.float32)).shape
        return Lazy(shape, lambda: fn(np.asarray(self, np.float32)))


def lazy(a) -> Lazy:
    return a if isinstance(a, Lazy) else Lazy(np.shape(a), lambda: a)


def apply(a, fn: Callable[[np.ndarray], np.ndarray]):
    """`fn(a)` for an array, deferred to the read for a `Lazy`."""
    return a.then(fn) if isinstance(a, Lazy) else fn(np.asarray(a, np.float32))


def stack_layers(layers: list[Lazy]) -> Lazy:
    """The [n, ...] stack of per-layer tensors, built when read; `x[index]` builds only the layers and the
    part of each that `index` selects."""
    shapes = {x.shape for x in layers}
    if len(shapes) != 1:
        raise UserError(f"per-layer tensors of different shapes {sorted(shapes)} cannot be stacked")

    def take(index):
        index = index if isinstance(index, tuple) else (index,)
        first, rest = (index[0], index[1:]) if index else (slice(None), ())
        return np.stack([layers[i][rest] for i in range(len(layers))[first]])

    return Lazy((len(layers), *layers[0].shape), lambda: np.stack([np.asarray(x, np.float32) for x in layers]), take)


class Tensors:
    """Checkpoint lookup with the name prefixes a family's checkpoints use (e.g. 'transformer.' or none)."""

    def __init__(self, tensors: Mapping[str, np.ndarray], prefixes: tuple[str, ...], probe: str, family: str):
        self.tensors, self.family = tensors, family
        self.prefix = next((p for p in prefixes if p + probe in tensors), prefixes[0])

    def lazy(self, name: str, absolute: bool = False) -> Lazy:
        """The tensor, read when its values are needed."""
        key = name if absolute else self.prefix + name
        if key not in self.tensors:
            raise UserError(f"{self.family} checkpoint is missing tensor {key!r}")
        return lazy(self.tensors[key])

    def __call__(self, name: str, absolute: bool = False) -> np.ndarray:
        return np.asarray(self.lazy(name, absolute), np.float32)

    def stack(self, table: Mapping[str, tuple[str, Callable]], num_layers: int, layer_fmt: str) -> dict:
        """{internal name: lazy [L, ...] stack} from {internal name: (HF suffix, conversion)} per layer."""
        return {key: stack_layers([self.lazy(layer_fmt.format(i=i) + hf).then(conv) for i in range(num_layers)])
                for key, (hf, conv) in table.items()}


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
