"""One weight spec per model family: a single table giving each parameter its internal name, its Hugging Face
name, its GGUF name, how the array is stored in each, and its logical axes. Everything about a family's
weights is generated from that table:

- `init_params`: the parameters a model holds (the one init style: top-level `nnx.Param`s, and the per-layer ones
  stacked on a leading layer axis in one `Stacked` container), randomly initialised;
- `WeightSpec.from_hf`: a HF state dict (lazy tensors) -> nested params, converted and stacked per layer lazily;
- `WeightSpec.to_hf`: the inverse (export: `train/export.py`);
- `WeightSpec.gguf_to_hf` / `tensors_from_gguf`: llama.cpp names -> HF names, conversion-time changes undone;
- `WeightSpec.logical_axes`: {state path: logical axes}, mapped to mesh axes by `sharding.LOGICAL_AXIS_RULES`.

Internal naming, shared by every family: `embed`, `pos_embed`, `project_in`, `norm` (+ `norm_b`), `project_out`,
`lm_head` at the top; in `layers`: `attn_norm`, `wq` `wk` `wv` (or a fused `w_qkv`), `wo`, `mlp_norm`, `w_gate`
`w_up` `w_down`, biases `b*` / `b_*`, LayerNorm biases `<norm>_b`. Internal matrices are `[in, out]` with heads on
their own axes. Layouts (`Layout`) say how HF stores one: a torch Linear `[out, in]` (LINEAR), GPT-2's Conv1D or an
embedding as it is (MATRIX), vectors flat (VECTOR). Internal weights sharing one HF name are consecutive row
blocks of one fused HF tensor, in table order (Phi-3's qkv_proj -> wq, wk, wv).
"""

from __future__ import annotations

import dataclasses
import math
import re
from functools import partial
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.errors import UserError
from mia_jax.models.tensors import apply, check_float, lazy, stack_layers


@dataclasses.dataclass(frozen=True)
class Layout:
    """How HF stores an internal array: its first `n_in` axes flattened into one dimension and the rest into
    another (`n_in` None: the whole array flattened to 1-D), the two swapped when `transpose` (torch Linear)."""

    transpose: bool = False
    n_in: int | None = None

    def to_internal(self, a, shape):
        """The HF array ``a`` in the internal layout of ``shape`` (transposed, then reshaped)."""
        a = a.T if self.transpose else a
        return a if a.ndim == len(shape) else a.reshape(shape)

    def to_hf(self, w: np.ndarray) -> np.ndarray:
        """The internal array ``w`` in HF's layout (flattened, transposed for a torch Linear)."""
        flat = w.reshape(-1) if self.n_in is None else w.reshape(math.prod(w.shape[:self.n_in]), -1)
        return flat.T if self.transpose else flat

    def hf_rows(self, shape) -> int:
        """The HF tensor's first dimension: what a part of a fused tensor spans."""
        if self.n_in is None:
            return math.prod(shape)
        return math.prod(shape[self.n_in:] if self.transpose else shape[:self.n_in])


VECTOR = Layout()
MATRIX = Layout(n_in=1)  # embeddings and GPT-2 Conv1D weights: [in, out] as stored
LINEAR = Layout(transpose=True, n_in=1)  # torch nn.Linear weight [out, in]


@dataclasses.dataclass(frozen=True)
class Weight:
    """One parameter. `hf` is relative to the body prefix (`head`: to the head prefix), inside the per-layer
    prefix for a layer weight; alternatives may follow the first (which export writes). `gguf` is llama.cpp's
    name (inside `blk.{i}.`), None when GGUF files lack it. `when(cfg)`: present only for such configs.
    `gguf_fix(array, cfg)`: a GGUF array -> the HF array (llama.cpp's conversion undone)."""

    name: str
    hf: str | tuple[str, ...]
    gguf: str | None
    axes: tuple[str, ...]
    layout: Layout = VECTOR
    init: str = "normal"  # "normal" (std 1/sqrt(fan-in)), "embedding" (std 0.02), "ones", "zeros"
    when: Callable[[Any], bool] | None = None
    gguf_fix: Callable[[np.ndarray, Any], np.ndarray] | None = None
    head: bool = False

    @property
    def hf_names(self) -> tuple[str, ...]:
        """The weight's HF tensor names (several for a fused tensor)."""
        return (self.hf,) if isinstance(self.hf, str) else self.hf


def linear(name, hf, gguf, axes, n_in=1, **kw) -> Weight:
    """A torch Linear weight ([out, in] in HF); the first `n_in` internal axes are its input."""
    return Weight(name, hf, gguf, axes, Layout(transpose=True, n_in=n_in), **kw)


def matrix(name, hf, gguf, axes, n_in=1, **kw) -> Weight:
    """A matrix HF stores as it is (an embedding, a GPT-2 Conv1D weight), up to splitting its axes."""
    return Weight(name, hf, gguf, axes, Layout(n_in=n_in), **kw)


def embedding(name, hf, gguf, axes=("vocab", "embed"), **kw) -> Weight:
    """An embedding table ([vocab, embed] in both layouts) named ``name`` internally, ``hf`` and ``gguf`` in the files.
    """
    return Weight(name, hf, gguf, axes, MATRIX, init="embedding", **kw)


def norm(name, hf, gguf, axes=("norm",), init="ones", **kw) -> Weight:
    """A norm scale (ones; Gemma's zero-centred scales: init="zeros")."""
    return Weight(name, hf, gguf, axes, VECTOR, init=init, **kw)


def bias(name, hf, gguf, axes=("norm",), **kw) -> Weight:
    """A bias vector (zeros at initialisation) named ``name`` internally, ``hf`` and ``gguf`` in the files."""
    return Weight(name, hf, gguf, axes, VECTOR, init="zeros", **kw)


class Stacked(nnx.Module):
    """The parameters of all decoder layers, each with a leading [num_layers] axis (applied with jax.lax.scan)."""

    def __init__(self, params: Mapping[str, nnx.Param]):
        for name, p in params.items():
            setattr(self, name, p)

    def arrays(self) -> dict:
        """{name: [L, ...] array}."""
        return {k: v[...] for k, v in vars(self).items() if isinstance(v, nnx.Param)}

    def scan(self, layer_fn: Callable, x, xs: Any = None, remat: bool = False):
        """x <- layer_fn(params_i, x, xs_i) for each layer i (compile time independent of depth). ``remat``: each
        layer is a ``jax.checkpoint`` (only its input x is kept for the backward pass, which recomputes the layer's
        activations): activation memory of one layer plus L inputs instead of L layers' activations."""
        body = lambda h, px: (layer_fn(px[0], h, px[1]), None)  # noqa: E731
        if remat:
            body = jax.checkpoint(body, prevent_cse=False)  # inside a scan CSE across iterations cannot happen
        return jax.lax.scan(body, x, (self.arrays(), xs))[0]


def _random(w: Weight, shape, dtype, rngs: nnx.Rngs) -> nnx.Param:
    if w.init in ("ones", "zeros"):
        return nnx.Param(jnp.full(shape, 1.0 if w.init == "ones" else 0.0, dtype))
    fan_in = math.prod(shape[-len(w.axes):][:w.layout.n_in or 1])
    std = 0.02 if w.init == "embedding" else 1.0 / math.sqrt(fan_in)
    return nnx.Param((jax.random.normal(rngs.params(), shape, jnp.float32) * std).astype(dtype))


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """A family's weights: `top` (outside the layers) and `layers` (one entry per per-layer parameter).

    `dims(cfg)`: size of each logical axis. `prefixes`: (body, head) HF name prefixes, the first pair whose
    embedding (`top[0]`) a checkpoint holds is used, the first is written. `layer_hf`: the per-layer HF prefix
    inside the body. `gguf_ignore`: GGUF tensors that `config_from_gguf` reads, dropped from the weights.
    """

    family: str
    dims: Callable[[Any], dict[str, int]]
    top: tuple[Weight, ...]
    layers: tuple[Weight, ...]
    layer_hf: str = "layers.{i}."
    prefixes: tuple[tuple[str, str], ...] = (("", ""),)
    gguf_ignore: tuple[str, ...] = ()

    def present(self, cfg) -> tuple[list[Weight], list[Weight]]:
        """(top-level, per-layer) weights that config ``cfg`` has."""
        keep = lambda ws: [w for w in ws if w.when is None or w.when(cfg)]  # noqa: E731
        return keep(self.top), keep(self.layers)

    def shape(self, w: Weight, cfg) -> tuple[int, ...]:
        """The internal shape of weight ``w`` under config ``cfg``."""
        dims = self.dims(cfg)
        return tuple(dims[a] for a in w.axes)

    def logical_axes(self) -> dict[str, tuple[str, ...]]:
        """{nnx state path: logical axes} of every parameter any config can have (per-layer: "layers" first)."""
        return {**{w.name: w.axes for w in self.top}, **{f"layers/{w.name}": ("layers", *w.axes) for w in self.layers}}

    # ------------------------------------------------------------------ Hugging Face

    def _prefix(self, w: Weight, body: str, head: str, layer: int | None) -> str:
        return head if w.head else body + ("" if layer is None else self.layer_hf.format(i=layer))

    def _rows(self, w: Weight, group: list[Weight], cfg) -> slice | None:
        """The rows of a fused HF tensor that `w` is (None: the whole tensor)."""
        parts = [x for x in group if x.hf == w.hf]
        if len(parts) == 1:
            return None
        start = sum(x.layout.hf_rows(self.shape(x, cfg)) for x in parts[:parts.index(w)])
        return slice(start, start + w.layout.hf_rows(self.shape(w, cfg)))

    def from_hf(self, cfg, tensors: Mapping[str, Any]) -> dict:
        """A HF state dict (numpy or `Lazy`, any of `prefixes`) -> the nested params of the model, lazily: a
        tensor stored as the model holds it is passed on as it is (so a row block reads only its rows), the
        others are converted when read, one layer at a time."""
        top, layers = self.present(cfg)
        first = top[0].hf_names[0]
        body, head = next((p for p in self.prefixes if p[0] + first in tensors), self.prefixes[0])

        def read(w: Weight, group: list[Weight], layer: int | None = None):
            prefix = self._prefix(w, body, head, layer)
            key = next((prefix + n for n in w.hf_names if prefix + n in tensors), prefix + w.hf_names[0])
            if key not in tensors:
                raise UserError(f"{self.family} checkpoint is missing tensor {key!r}")
            check_float(tensors[key], key)
            a, shape, rows = lazy(tensors[key]), self.shape(w, cfg), self._rows(w, group, cfg)
            if rows is None and not w.layout.transpose and a.ndim == len(shape):
                return a
            return a.then(lambda x: w.layout.to_internal(x if rows is None else x[rows], shape))

        out = {w.name: read(w, top) for w in top}
        out["layers"] = {w.name: stack_layers([read(w, layers, i) for i in range(cfg.num_hidden_layers)])
                         for w in layers}
        return out

    def to_hf(self, cfg, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Nested params (`nnx.to_pure_dict` of the state) -> HF-named float32 numpy tensors (fused parts
        concatenated), under the first of `prefixes`."""
        top, layers = self.present(cfg)
        unknown = sorted(set(params.get("layers", {})) - {w.name for w in layers})
        unknown += sorted(k for k in params if k != "layers" and k not in {w.name for w in top})
        if unknown:
            raise UserError(f"export: no Hugging Face name for parameters {unknown} of {self.family}")
        body, head = self.prefixes[0]
        out: dict[str, np.ndarray] = {}

        def put(name: str, a) -> None:
            a = np.asarray(a, np.float32)
            out[name] = np.concatenate([out[name], a]) if name in out else a

        for w in top:
            if params.get(w.name) is not None:
                put(self._prefix(w, body, head, None) + w.hf_names[0], w.layout.to_hf(np.asarray(params[w.name])))
        for w in layers:
            stacked = np.asarray(params["layers"][w.name], np.float32)
            for i in range(cfg.num_hidden_layers):
                put(self._prefix(w, body, head, i) + w.hf_names[0], w.layout.to_hf(stacked[i]))
        return {k: np.ascontiguousarray(v) for k, v in out.items()}

    # ------------------------------------------------------------------ GGUF

    def gguf_to_hf(self) -> dict[str, str]:
        """{GGUF name: HF name} ("blk.{i}.x" -> "...{i}.y"; the first prefixes) of every weight GGUF files hold."""
        body, head = self.prefixes[0]
        table = {w.gguf: self._prefix(w, body, head, None) + w.hf_names[0] for w in self.top if w.gguf}
        table.update({"blk.{i}." + w.gguf: body + self.layer_hf + w.hf_names[0] for w in self.layers if w.gguf})
        return table

    def tensors_from_gguf(self, cfg, arrays: Mapping[str, Any]) -> dict[str, Any]:
        """GGUF arrays ([out, in] numpy order, lazy) -> HF-named tensors, each weight's `gguf_fix` applied."""
        table = self.gguf_to_hf()
        fixes = {**{w.gguf: w.gguf_fix for w in self.top if w.gguf_fix},
                 **{"blk.{i}." + w.gguf: w.gguf_fix for w in self.layers if w.gguf_fix}}
        out = {}
        for name, a in arrays.items():
            if name in self.gguf_ignore:
                continue
            m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
            key, layer = (f"blk.{{i}}.{m.group(2)}", m.group(1)) if m else (name, "")
            if key not in table:
                raise UserError(f"unexpected tensor {name!r} for a {self.family} GGUF")
            fix = fixes.get(key)
            out[table[key].format(i=layer)] = a if fix is None else apply(a, partial(fix, cfg=cfg))
        return out


def init_params(module: nnx.Module, spec: WeightSpec, cfg, dtype, rngs: nnx.Rngs) -> None:
    """Set `module`'s parameters from `spec`: each top-level weight (None where the config has none) and
    `module.layers`, a `Stacked` holding the per-layer weights with a leading [num_hidden_layers] axis."""
    top, layers = spec.present(cfg)
    names = {w.name for w in top}
    for w in spec.top:
        setattr(module, w.name, _random(w, spec.shape(w, cfg), dtype, rngs) if w.name in names else None)
    module.layers = Stacked({w.name: _random(w, (cfg.num_hidden_layers, *spec.shape(w, cfg)), dtype, rngs)
                             for w in layers})
