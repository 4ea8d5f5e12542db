"""Checkpoint tensors read only when needed (`Lazy`, stacked per layer), and the GGUF metadata lookups that every
family's `config_from_gguf` shares (`GGUFMeta`). No network ops here: see `layers.py`."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from mia_jax.errors import UserError


class Lazy:
    """A checkpoint tensor that is read (and converted) only when its values are needed. `shape` is known up
    front; `np.asarray(x)` reads it whole; `x[index]` reads what `index` needs, and only that where the source
    allows it (a safetensors slice, the selected layers of a `stack_layers`). Checkpoint readers return these,
    so that `build_module` can place a model tensor by tensor, never holding all of it in host memory."""

    def __init__(self, shape, read: Callable[[], np.ndarray], take: Callable[[tuple], np.ndarray] | None = None,
                 dtype: str | None = None, origin: str | None = None):
        self.shape, self._read, self._take = tuple(int(d) for d in shape), read, take
        self.dtype, self.origin = dtype, origin  # as the file stores it ("F32", "I32", ...; None: float) and where

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    def __array__(self, dtype=None, copy=None):
        a = np.asarray(self._read())
        return a if dtype is None else a.astype(dtype, copy=False)

    def __getitem__(self, index) -> np.ndarray:
        """A copy (never a view that would keep the whole tensor alive)."""
        return np.array(self._take(index) if self._take else np.asarray(self._read())[index])

    def then(self, fn: Callable[[np.ndarray], np.ndarray]) -> "Lazy":
        """`fn` (reshapes, transposes, slices, arithmetic) applied to the float32 values when they are read; a
        shape `fn` cannot produce fails here (jax.eval_shape), before anything is read."""
        shape = jax.eval_shape(fn, jax.ShapeDtypeStruct(self.shape, jnp.float32)).shape
        return Lazy(shape, lambda: fn(np.asarray(self, np.float32)))


class WeightFileError(UserError):
    """A checkpoint file that cannot hold the model's weights (the message names the file and the tensor)."""


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors dtype names of floating-point tensors numpy reads


def check_float(a, name: str) -> None:
    """A checkpoint tensor used as a model weight must be floating point: an integer or boolean tensor (a
    quantized export, a mask buffer saved under a weight's name, a corrupt file) would be read as numbers that
    mean nothing, without a word."""
    dtype = getattr(a, "dtype", None)
    if isinstance(dtype, np.dtype):  # a numpy array (ml_dtypes' bfloat16 is no np.floating: kind "V")
        dtype = None if dtype.kind in "fV" else dtype.name
    if dtype is None or str(dtype).upper() in FLOAT_DTYPES:
        return
    where = getattr(a, "origin", None) or "the checkpoint"
    integer = str(dtype).upper().startswith(("I", "U", "BOOL"))
    what = "an integer type" if integer else "a type this loader does not read"
    raise WeightFileError(f"{where}: tensor {name!r} has dtype {dtype} ({what}), expected floating-point weights "
                          "(F32, F16 or BF16); the file is corrupt or was saved in another format: re-download it "
                          "or re-save the model in float32 / float16 / bfloat16")


def lazy(a) -> Lazy:
    """``a`` as a ``Lazy`` (itself when it is one already)."""
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


class GGUFMeta:
    """The `{general.architecture}.*` metadata of a GGUF file as llama.cpp writes it (gguf-py's constants), with
    the lookups every family's `config_from_gguf` needs. `arrays`: the file's tensors by GGUF name (or None)."""

    def __init__(self, meta: Mapping[str, Any], arrays: Mapping[str, Any] | None = None):
        self.meta, self.arrays, self.arch = meta, arrays, meta["general.architecture"]

    def __call__(self, key: str, default=None):
        """`{arch}.{key}`, e.g. "block_count", "attention.head_count"."""
        return self.meta.get(f"{self.arch}.{key}", default)

    def has(self, tensor: str) -> bool:
        """Whether the file holds the tensor named ``tensor`` (False when the tensors are not given)."""
        return self.arrays is not None and tensor in self.arrays

    def vocab_size(self) -> int:
        """Rows of token_embd when the tensors are given, else `{arch}.vocab_size` or the token list's length."""
        if self.has("token_embd.weight"):
            return int(self.arrays["token_embd.weight"].shape[0])
        size = self("vocab_size") or len(self.meta.get("tokenizer.ggml.tokens") or ())
        if not size:
            raise UserError("GGUF metadata has no vocab_size and no tokenizer.ggml.tokens")
        return int(size)

    def special_ids(self) -> dict:
        """{bos,eos,pad}_token_id keyword arguments of a config."""
        return {f"{k}_token_id": self.meta.get(f"tokenizer.ggml.{g}_token_id")
                for k, g in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))}

    def rope_scaling(self) -> dict | None:
        """transformers' rope_scaling dict from `rope.scaling.type` / `rope.scaling.factor` (None: plain RoPE)."""
        kind = self("rope.scaling.type", "none")
        return None if kind == "none" else {"rope_type": kind, "factor": self("rope.scaling.factor")}
