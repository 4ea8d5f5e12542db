"""Device meshes, partition rules per architecture, sharded loading and multi-host helpers.

A mesh has three named axes (`AXES`):

- ``data``:  the batch is split over it (data parallelism); parameters are replicated over it.
- ``fsdp``:  the batch too, and every large parameter on its model-dimension side (ZeRO-3 / FSDP: parameters are
  all-gathered layer by layer inside the jitted forward, by XLA's SPMD partitioner).
- ``model``: tensor parallelism: the vocabulary of the embedding and the LM head, attention heads and the MLP
  hidden dimension; the token statistics then run per vocabulary shard (``stats.token_stats_from_hidden_sharded``).

``make_mesh("data=4,model=2")`` builds one (default: every device on ``data``). Partition rules are not
written here: each family's weight spec (``mia_jax.models.weights``) gives every parameter its logical axes
(``vocab``, ``embed``, ``heads``, ``mlp``, ...), and one table, ``LOGICAL_AXIS_RULES``, maps logical axes to
mesh axes; ``PARTITION_RULES[arch]`` (the model module's name: llama, gemma3, gpt_neox, gpt2, opt, phi3, bert)
is the resulting {state path, e.g. ``layers/wq``: PartitionSpec}. A dimension that is not divisible by its mesh
axes is left unsharded (``fit_spec``), so every rule works with every mesh (e.g. 2 key/value heads on model=4),
only less sharded.

Loading: ``load_sharded`` streams the checkpoint tensor by tensor straight to the shardings. The readers return
lazy tensors (``models.tensors.Lazy``: safetensors memory-mapped and sliced, GGUF dequantized on use), the weight
spec's ``from_hf`` composes its transposes and reshapes onto them and stacks layers lazily, and ``placer`` builds
each parameter from per-device blocks (``jax.make_array_from_single_device_arrays``): each local device's block (the
slice its index selects; a tensor taken as it is, such as a vocabulary-sharded embedding, read as a row slice) is
read and sent to its device before the next. The host holds at most one block, plus one layer's tensor.

Multi-host (one process per host, one global mesh): ``initialize_distributed`` calls ``jax.distributed.initialize()``
when asked (``--distributed`` or ``MIA_JAX_DISTRIBUTED=1``), from JAX's own cluster detection (Cloud TPU pods, SLURM,
Open MPI) or ``MIA_JAX_COORDINATOR`` (host:port of process 0), ``MIA_JAX_NUM_PROCESSES``, ``MIA_JAX_PROCESS_ID``
(``MIA_JAX_LOCAL_DEVICE_IDS``). Every process runs the same command: process 0 claims the run folder and tells the
others (``broadcast_json``), each scores its own slice of the texts in lockstep, the records are gathered
(``allgather_json``) and process 0 writes the files.
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable, Iterable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mia_jax import models
from mia_jax.errors import UserError
from mia_jax.models.checkpoint import ARCHITECTURES

AXES = ("data", "fsdp", "model")
BATCH_AXES = ("data", "fsdp")  # the batch is split over both (fsdp shards parameters *and* data)
VOCAB_AXIS = "model"


# ----------------------------------------------------------------------------- partition rules

# logical axis of the weight specs (`mia_jax.models.weights`) -> mesh axis (maxtext style). Axes not listed are
# replicated: layers, head_dim, qkv, positions, types and norm (vectors over the hidden size: norm scales, biases).
LOGICAL_AXIS_RULES = {"vocab": "model", "embed": "fsdp", "embed_proj": "fsdp", "heads": "model", "kv_heads": "model",
                      "mlp": "model"}


def partition_rules(spec) -> dict[str, P]:
    """{nnx state path: PartitionSpec} of every parameter of a weight spec, from its logical axes."""
    return {path: P(*(LOGICAL_AXIS_RULES.get(a) for a in axes)) for path, axes in spec.logical_axes().items()}


def _families() -> list[str]:
    return sorted({a.module for a in ARCHITECTURES.values()} | {"bert"})


@functools.cache
def _rules(arch: str) -> dict[str, P]:
    return partition_rules(importlib.import_module(f"mia_jax.models.{arch}").SPEC)


class _PartitionRules(Mapping):
    """PARTITION_RULES[arch]: {state path: PartitionSpec} of a family (`mia_jax.models.<arch>.SPEC`), built when
    first asked for (a family module is imported only then)."""

    def __getitem__(self, arch: str) -> dict[str, P]:
        if arch not in _families():
            raise KeyError(arch)
        return _rules(arch)

    def __iter__(self):
        return iter(_families())

    def __len__(self) -> int:
        return len(_families())


PARTITION_RULES: Mapping[str, dict[str, P]] = _PartitionRules()


def architecture_of(model: nnx.Module) -> str:
    """The PARTITION_RULES key of a model: the name of the module that defines its class."""
    return type(model).__module__.rsplit(".", 1)[-1]


def path_str(path: Iterable) -> str:
    """'layers/wq' from an nnx state / pytree path (the trailing Variable '.value' dropped)."""
    keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return "/".join(k for k in keys if k != "value")


def fit_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
    """``spec`` for an array of ``shape``: trailing dims padded with None, mesh axes of size 1 dropped, a mesh
    axis already used by an earlier dimension dropped, and any dimension not divisible by its mesh axes' total
    size left unsharded."""
    out, used = [], set()
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = tuple(a for a in ((axes,) if isinstance(axes, str) else (axes or ())) if mesh.shape[a] > 1
                      and a not in used)
        size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
        keep = names and not dim % size
        used.update(names if keep else ())
        out.append((names[0] if len(names) == 1 else names) if keep else None)
    return P(*out)


def spec_for(arch: str, path: str, shape: Sequence[int], mesh: Mesh) -> P:
    """The PartitionSpec of parameter ``path`` (shape ``shape``) of architecture ``arch`` on ``mesh`` (its rule, fitted
    by :func:`fit_spec`; replicated without a rule); UserError for an architecture without rules."""
    if arch not in PARTITION_RULES:
        raise UserError(f"no partition rules for architecture {arch!r}; known: {', '.join(sorted(PARTITION_RULES))}")
    return fit_spec(PARTITION_RULES[arch].get(path, P()), shape, mesh)


def state_specs(model: nnx.Module, mesh: Mesh) -> dict[str, P]:
    """{state path: PartitionSpec} for every parameter of ``model`` on ``mesh``."""
    arch = architecture_of(model)
    leaves = jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]
    return {path_str(p): spec_for(arch, path_str(p), tuple(getattr(v, "shape", np.shape(v))), mesh) for p, v in leaves}


# ----------------------------------------------------------------------------- meshes


def parse_mesh(spec: str | Mapping[str, int] | None, n_devices: int) -> dict[str, int]:
    """{'data': .., 'fsdp': .., 'model': ..} from 'data=4,model=2' (axes not named are 1, except that
    ``data`` takes whatever the others leave when it is not named or is -1). Must use every device."""
    if spec is None or spec == "" or spec == "auto":
        given: dict[str, int] = {}
    elif isinstance(spec, Mapping):
        given = dict(spec)
    else:
        given = {}
        for part in str(spec).split(","):
            name, _, value = part.partition("=")
            name = name.strip()
            try:
                given[name] = int(value)
            except ValueError:
                raise UserError(f"--mesh {spec!r}: expected comma-separated axis=size, e.g. data=4,model=2") from None
    unknown = sorted(set(given) - set(AXES))
    if unknown:
        raise UserError(f"--mesh {spec!r}: unknown axis {', '.join(unknown)}; axes are {', '.join(AXES)}")
    sizes = {a: given.get(a, 1) for a in AXES}
    if any(v == 0 or v < -1 for v in sizes.values()) or list(sizes.values()).count(-1) > 1:
        raise UserError(f"--mesh {spec!r}: sizes must be positive (one axis may be -1: the rest of the devices)")
    free = next((a for a, v in sizes.items() if v == -1), None)
    if free is None and "data" not in given:
        free = "data"
    if free is not None:
        rest = int(np.prod([v for a, v in sizes.items() if a != free]))
        if n_devices % rest:
            raise UserError(f"--mesh {spec!r}: {n_devices} devices are not divisible by {rest}")
        sizes[free] = n_devices // rest
    if int(np.prod(list(sizes.values()))) != n_devices:
        raise UserError(f"--mesh {spec!r} has {int(np.prod(list(sizes.values())))} devices, "
                        f"but {n_devices} are available ({', '.join(f'{a}={v}' for a, v in sizes.items())})")
    return sizes


def make_mesh(spec: str | Mapping[str, int] | None = None, devices: Sequence | None = None) -> Mesh:
    """A ``Mesh`` over ``devices`` (default: all devices of all processes) with axes ``AXES``: devices ordered by
    (process, id), ``model`` fastest, then ``fsdp``, then ``data``, so that tensor-parallel groups are neighbours and,
    on several hosts, every process owns a contiguous block of the batch (the runner's multi-host path checks it)."""
    devices = list(jax.devices() if devices is None else devices)
    devices.sort(key=lambda d: (d.process_index, d.id))
    sizes = parse_mesh(spec, len(devices))
    return Mesh(np.array(devices, dtype=object).reshape([sizes[a] for a in AXES]), AXES)


def mesh_str(mesh: Mesh) -> str:
    """``mesh``'s axis sizes as ``"data=2,fsdp=1,model=4"``."""
    return ",".join(f"{a}={mesh.shape[a]}" for a in mesh.axis_names)


def batch_spec(ndim: int = 2) -> P:
    """The PartitionSpec of an ``ndim``-D batch: its first axis split over ``BATCH_AXES``, the rest whole."""
    return P(BATCH_AXES, *(None,) * (ndim - 1))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """:func:`batch_spec` on ``mesh``, as a NamedSharding."""
    return NamedSharding(mesh, batch_spec(ndim))


def batch_shards(mesh: Mesh) -> int:
    """Number of batch shards: a batch's rows must be a multiple of it."""
    return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def local_batch_shards(mesh: Mesh) -> int:
    """Batch shards held by this process (all of them on one host). Raises UserError when the mesh does
    not give every process its own contiguous block of the batch (e.g. a model axis spanning hosts)."""
    n_proc = jax.process_count()
    if n_proc == 1:
        return batch_shards(mesh)
    grid = mesh.devices.reshape(batch_shards(mesh), -1)  # [batch shard, model]
    owners = np.vectorize(lambda d: d.process_index)(grid)
    per = grid.shape[0] // n_proc if grid.shape[0] % n_proc == 0 else 0
    ok = per > 0 and all((owners[i * per:(i + 1) * per] == p).all() for i, p in enumerate(range(n_proc)))
    if not ok:
        raise UserError(f"mesh {mesh_str(mesh)} on {n_proc} processes: every process must own whole batch shards "
                        "(the model axis must fit within one host's devices, and data x fsdp must be a multiple of "
                        "the number of processes)")
    return per


# ----------------------------------------------------------------------------- placing parameters


def shard_model(model: nnx.Module, mesh: Mesh) -> dict[str, P]:
    """Place every parameter of ``model`` (in place) on ``NamedSharding(mesh, spec)`` from
    ``PARTITION_RULES``; returns the specs. Each device receives only its own slices
    (``make_array_from_callback`` over the host value), so it also works across processes when every
    process holds the same host values. Already-placed parameters are left as they are."""
    specs = state_specs(model, mesh)
    graphdef, state = nnx.split(model)
    placed_any = False

    def place(path, value):
        nonlocal placed_any
        sharding = NamedSharding(mesh, specs[path_str(path)])
        if isinstance(value, jax.Array) and value.sharding == sharding:
            return value
        if isinstance(value, jax.Array) and value.sharding.is_equivalent_to(sharding, value.ndim):
            return value
        placed_any = True
        host = np.asarray(jax.device_get(value))
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    new = jax.tree_util.tree_map_with_path(place, state)
    if placed_any:
        nnx.update(model, new)
    return specs


def placer(mesh: Mesh, on_block: Callable[[str, np.ndarray], None] | None = None) -> Callable:
    """A ``place`` for ``models.load`` / ``layers.build_module``: each parameter goes to
    ``NamedSharding(mesh, spec_for(arch, path))``: each local device's block is read from the lazy checkpoint
    tensor and sent to its device before the next is read (devices holding the same block share one read),
    so the host holds one block at a time. ``on_block(path, block)`` sees every block read (tests use it)."""

    def place(arch: str, path: str, shape: tuple, value, dtype) -> jax.Array:
        sharding = NamedSharding(mesh, spec_for(arch, path, shape, mesh))
        key, host, shards = None, None, []
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            if key != (k := tuple((s.start, s.stop, s.step) for s in index)):
                key, host = k, None  # drop the previous block before reading the next
                host = np.asarray(value[index]).astype(dtype)
                if on_block is not None:
                    on_block(path, host)
            shards.append(jax.device_put(host, device))
        return jax.make_array_from_single_device_arrays(shape, sharding, shards)

    return place


def gathered_for_lookup(tree, mesh: Mesh):
    """``tree`` (an nnx state or its pure dict, inside a jitted function) with the token embedding ``embed``
    constrained to its sharding without ``fsdp`` (all-gathered over fsdp, as FSDP gathers any weight before use;
    still split over ``model``). Without it, XLA's SPMD partitioner cannot partition the lookup of a batch that is
    split over fsdp from a table whose hidden dimension is split over fsdp too, and gives up by replicating the
    whole batch's [B, T, D] embeddings on every device ("involuntary full rematerialization")."""
    def constrain(path, x):
        if path_str(path) != "embed" or "fsdp" not in mesh.axis_names or mesh.shape["fsdp"] == 1:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, fit_spec(P(VOCAB_AXIS), x.shape, mesh)))

    return jax.tree_util.tree_map_with_path(constrain, tree)


def load_sharded(name_or_path: str, mesh: Mesh, **kwargs):
    """``models.load`` with every tensor streamed from the checkpoint straight to its sharding on ``mesh``."""
    loaded = models.load(name_or_path, place=placer(mesh), **kwargs)
    shard_model(loaded.model, mesh)  # a no-op unless some state was not placed by the rules
    return loaded


# ----------------------------------------------------------------------------- multi-host arrays


def host_local_rows(x: jax.Array, mesh: Mesh) -> np.ndarray:
    """This process's rows of a batch-sharded global array, as NumPy (the whole array on one host)."""
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(x))
    return np.asarray(multihost_utils.global_array_to_host_local_array(x, mesh, batch_spec(x.ndim)))


def global_batch(mesh: Mesh, local: np.ndarray) -> jax.Array:
    """A batch-sharded global array from this process's rows (all rows on one host)."""
    sharding = batch_sharding(mesh, local.ndim)
    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    return jax.make_array_from_process_local_data(sharding, local)

