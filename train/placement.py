"""Where the trainer's arrays live on a device mesh, and the checks made before any training step.

The mesh and the partition rules are scoring's (``mia_jax.engine.sharding``): ``--mesh data=..,fsdp=..,model=..`` /
``train.mesh``, and one ``PartitionSpec`` per parameter from the family's weight spec (``sharding.state_specs``;
there is no second set of rules for training). On that mesh:

- parameters, their gradients and the AdamW moments (``mu``, ``nu``) share the parameter's sharding: FSDP over
  ``fsdp`` on the hidden-size side, tensor parallel over ``model`` (vocabulary, heads, MLP); replicated over
  ``data``. Optimizer leaves that are not a parameter's moment (the step count) are replicated;
- the batch [grad_accum, micro, seq_len] is split over ``data`` x ``fsdp`` on its ``micro`` axis; on several
  processes each process builds only its own rows (``local_rows``) and the global array is assembled with
  ``jax.make_array_from_process_local_data``.

``check`` refuses, before anything is trained or written, a mesh whose batch axes do not divide the
micro-batch, a ``model`` axis that does not divide the attention heads, and a run whose quick memory estimate
(``estimate_bytes``) exceeds what the devices have.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mia_jax.engine import sharding
from mia_jax.errors import UserError

BATCH_SPEC = P(None, sharding.BATCH_AXES, None)  # [grad_accum, micro, seq_len]: micro over data x fsdp


def param_shardings(model: nnx.Module, mesh: Mesh) -> dict:
    """{...nested as ``nnx.to_pure_dict``...: NamedSharding} of every parameter, from the partition rules."""
    specs = sharding.state_specs(model, mesh)
    pure = nnx.to_pure_dict(nnx.state(model))
    return jax.tree_util.tree_map_with_path(lambda p, _: NamedSharding(mesh, specs[sharding.path_str(p)]), pure)


def like_params(tree, params_abstract, params_sh, mesh: Mesh):
    """Shardings for a pytree of optimizer state (``tree``: arrays or ShapeDtypeStructs): a leaf whose path ends
    with a parameter's path and has its shape (AdamW's ``mu``/``nu``) gets that parameter's sharding, any other
    leaf (counts) is replicated."""
    by_path = {}
    for (p, x), (_, s) in zip(jax.tree_util.tree_flatten_with_path(params_abstract)[0],
                              jax.tree_util.tree_flatten_with_path(params_sh)[0]):
        by_path[sharding.path_str(p)] = (tuple(x.shape), s)
    replicated = NamedSharding(mesh, P())

    def pick(path, leaf):
        s = sharding.path_str(path)
        best = None
        for p, (shape, sh) in by_path.items():
            if (s == p or s.endswith("/" + p)) and tuple(leaf.shape) == shape and (best is None or len(p) > best[0]):
                best = (len(p), sh)
        return replicated if best is None else best[1]

    return jax.tree_util.tree_map_with_path(pick, tree)


def state_targets(model: nnx.Module, opt, mesh: Mesh) -> tuple[dict, object]:
    """(params, opt_state) of the training state as ``ShapeDtypeStruct``s with their shardings on ``mesh``: float32
    parameters on the rule shardings, optimizer leaves ``like_params``. What the step is jitted with, what a
    checkpoint is restored onto and what the initial state is placed on (``jax.tree.map(lambda x: x.sharding, t)``)."""
    params_sh = param_shardings(model, mesh)
    abstract = jax.eval_shape(lambda: jax.tree.map(lambda x: x.astype(jnp.float32), nnx.to_pure_dict(nnx.state(model))))
    opt_abstract = jax.eval_shape(opt.init, abstract)
    opt_sh = like_params(opt_abstract, abstract, params_sh, mesh)
    with_sharding = lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)  # noqa: E731
    return jax.tree.map(with_sharding, abstract, params_sh), jax.tree.map(with_sharding, opt_abstract, opt_sh)


def shardings_of(target):
    """The shardings of a ``state_targets`` tree."""
    return jax.tree.map(lambda x: x.sharding, target)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The sharding of a training batch on ``mesh`` (``BATCH_SPEC``)."""
    return NamedSharding(mesh, BATCH_SPEC)


def local_rows(mesh: Mesh, shape: tuple[int, int, int]) -> slice:
    """The rows of the ``micro`` axis this process's devices hold (all of them on one process)."""
    index = batch_sharding(mesh).addressable_devices_indices_map(shape).values()
    lo = min(i[1].start or 0 for i in index)
    hi = max(shape[1] if i[1].stop is None else i[1].stop for i in index)
    if (hi - lo) * jax.process_count() != shape[1]:
        raise UserError(f"mesh {sharding.mesh_str(mesh)} on {jax.process_count()} processes: each process must own "
                        "a contiguous block of the batch (the model axis must fit within one host's devices)")
    return slice(lo, hi)


def global_batch(mesh: Mesh, local: np.ndarray, shape: tuple[int, int, int]) -> jax.Array:
    """The global [grad_accum, micro, seq_len] array from this process's rows (``local_rows``)."""
    if jax.process_count() == 1:
        return jax.device_put(local, batch_sharding(mesh))
    return jax.make_array_from_process_local_data(batch_sharding(mesh), local, shape)


def to_host(tree) -> dict:
    """NumPy copies of (possibly sharded, possibly multi-process) arrays; every process gets the whole arrays."""
    def one(x):
        if getattr(x, "is_fully_addressable", True):
            return np.asarray(jax.device_get(x))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def place_params(model: nnx.Module, params_sh) -> dict:
    """float32 master copies of ``model``'s parameters on their shardings (new buffers: the step donates them, the
    model keeps its own)."""
    pure = nnx.to_pure_dict(nnx.state(model))
    pure = jax.tree.map(lambda x, s: x if isinstance(x, jax.Array) and x.sharding == s else jax.device_put(x, s),
                        pure, params_sh)
    cast = jax.jit(lambda t: jax.tree.map(lambda x: jnp.array(x, jnp.float32, copy=True), t), out_shardings=params_sh)
    return cast(pure)


# ----------------------------------------------------------------------------- checks before the first step


def estimate_bytes(model: nnx.Module, mesh: Mesh, micro: int, seq_len: int, remat: str, loss_chunk: int) -> int:
    """A quick upper estimate of one device's peak memory in training (bytes): float32 master parameters, AdamW's
    two moments, the accumulated and the current gradients (5 x 4 bytes per parameter, divided by the
    parameter's shards), the compute copy of the parameters, the activations kept for the backward pass
    (per layer ~ (8 D + 3 I) floats per token without remat, only the layer inputs with ``remat=layer``, plus one
    layer's worth recomputed) and the chunked loss's [tokens, loss_chunk] block."""
    specs = sharding.state_specs(model, mesh)  # needs only the mesh's axis sizes (an AbstractMesh will do)
    total = 0
    for path, x in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]:
        n = int(np.prod(x.shape))
        for axes in specs[sharding.path_str(path)]:
            n //= int(np.prod([mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes or ())]))
        total += n * (5 * 4 + jnp.dtype(x.dtype).itemsize)
    dims = model.spec.dims(model.config)
    d, inter, layers = dims["embed"], dims.get("mlp", 4 * dims["embed"]), model.config.num_hidden_layers
    tokens = max(1, micro // sharding.batch_shards(mesh)) * seq_len
    per_layer = tokens * (8 * d + 3 * inter) * 4 // mesh.shape["model"]
    acts = tokens * d * 4 * layers + per_layer if remat == "layer" else per_layer * layers
    return total + acts + 3 * tokens * min(loss_chunk, dims["vocab"]) * 4


MEMORY_ENV = "MIA_JAX_DEVICE_MEMORY_GIB"


def memory_from_env() -> float | None:
    """``$MIA_JAX_DEVICE_MEMORY_GIB`` in bytes (``inf`` turns the memory check off), None when unset; a value that
    is not a positive number of GiB is a UserError (checked before a run folder is claimed)."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if not text:
        return None
    try:
        gib = float(text)
    except ValueError:
        gib = float("nan")
    if not gib > 0:  # NaN, zero or negative
        raise UserError(f"${MEMORY_ENV}={os.environ[MEMORY_ENV]!r}: expected a positive number of GiB (or inf to "
                        "skip the memory check)")
    return gib * 2**30


def available_bytes() -> float | None:
    """Memory of one device: ``$MIA_JAX_DEVICE_MEMORY_GIB`` when set (``inf`` turns the check off), else the
    allocator limit on an accelerator, or on CPU the host's available memory divided by the local CPU devices
    (they share it). None when unknown."""
    if (env := memory_from_env()) is not None:
        return env
    dev = jax.local_devices()[0]
    stats = dev.memory_stats() if dev.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemAvailable"] // jax.local_device_count()
    except (OSError, KeyError, ValueError):
        return None


def check_batch(mesh: Mesh, batch_size: int, grad_accum: int) -> None:
    """UserError when a micro-batch cannot be split over the mesh's batch axes (needs no model)."""
    micro, shards = batch_size // grad_accum, sharding.batch_shards(mesh)
    if micro % shards:
        raise UserError(f"mesh {sharding.mesh_str(mesh)}: a micro-batch of {micro} sequences (train.batch_size="
                        f"{batch_size} / train.grad_accum={grad_accum}) cannot be split over data x fsdp = {shards} "
                        "devices; make batch_size / grad_accum a multiple of it, or use another --mesh")


def check(model: nnx.Module, mesh: Mesh, batch_size: int, grad_accum: int, seq_len: int, remat: str,
          loss_chunk: int) -> None:
    """UserError (one line) when the run cannot work on this mesh; see the module docstring."""
    check_batch(mesh, batch_size, grad_accum)
    where = f"mesh {sharding.mesh_str(mesh)}"
    micro, shards = batch_size // grad_accum, sharding.batch_shards(mesh)
    dims = model.spec.dims(model.config)
    tp = mesh.shape["model"]
    if dims.get("heads") and dims["heads"] % tp:
        raise UserError(f"{where}: the model axis ({tp}) does not divide the {dims['heads']} attention heads; "
                        f"use a model axis that divides {dims['heads']}")
    need, have = estimate_bytes(model, mesh, micro, seq_len, remat, loss_chunk), available_bytes()
    if have is not None and need > have:
        raise UserError(f"{where}: training needs about {need / 2**30:.3g} GiB per device (parameters, AdamW state, "
                        f"gradients, activations of {micro // shards} x {seq_len} tokens), more than the "
                        f"{have / 2**30:.3g} GiB available; shard more (fsdp/model), lower train.batch_size or "
                        f"raise train.grad_accum, set train.remat=layer (or ${MEMORY_ENV}=inf to skip this check)")
