"""The processes of a multi-host run: starting JAX's distributed runtime, and what the processes tell one another.

One process per host, one global mesh (``engine.sharding``): ``initialize_distributed`` calls
``jax.distributed.initialize()`` when asked (``--distributed`` or ``MIA_JAX_DISTRIBUTED=1``), from JAX's own cluster
detection (Cloud TPU pods, SLURM, Open MPI) or ``MIA_JAX_COORDINATOR`` (host:port of process 0),
``MIA_JAX_NUM_PROCESSES``, ``MIA_JAX_PROCESS_ID`` (``MIA_JAX_LOCAL_DEVICE_IDS``). Every process runs the same command:
process 0 claims the run folder and tells the others (``broadcast_json``), each scores its own slice of the texts
(``process_slice``) in lockstep, the records are gathered (``allgather_json``) and process 0 writes the files
(``is_main_process``). On one process every function here is a no-op or the identity.
"""
from __future__ import annotations

import json
import os
import signal
from typing import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from mia_jax.batching import pow2
from mia_jax.errors import UserError

DISTRIBUTED_ENV = "MIA_JAX_DISTRIBUTED"
COORDINATOR_ENV = "MIA_JAX_COORDINATOR"
NUM_PROCESSES_ENV = "MIA_JAX_NUM_PROCESSES"
PROCESS_ID_ENV = "MIA_JAX_PROCESS_ID"
LOCAL_DEVICES_ENV = "MIA_JAX_LOCAL_DEVICE_IDS"
HEARTBEAT_S = 30  # a process silent this long is lost: the coordination service ends the run on every process


def distributed_requested(flag: bool = False) -> bool:
    """Whether a multi-process run is asked for: ``flag``, or ``MIA_JAX_DISTRIBUTED`` 1, true or yes."""
    return flag or os.environ.get(DISTRIBUTED_ENV, "").lower() in ("1", "true", "yes")


def initialize_distributed(flag: bool = False) -> bool:
    """``jax.distributed.initialize()`` when ``flag`` or ``$MIA_JAX_DISTRIBUTED`` asks for it (before any other JAX
    call), from the variables of the module docstring or JAX's cluster detection; True when initialised here."""
    if not distributed_requested(flag) or jax.distributed.is_initialized():
        return False
    env, kwargs = os.environ, {"heartbeat_timeout_seconds": HEARTBEAT_S}
    if env.get(COORDINATOR_ENV):
        kwargs["coordinator_address"] = env[COORDINATOR_ENV]
    if env.get(NUM_PROCESSES_ENV):
        kwargs["num_processes"] = int(env[NUM_PROCESSES_ENV])
    if env.get(PROCESS_ID_ENV):
        kwargs["process_id"] = int(env[PROCESS_ID_ENV])
    if env.get(LOCAL_DEVICES_ENV):
        kwargs["local_device_ids"] = [int(x) for x in env[LOCAL_DEVICES_ENV].split(",")]
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        jax.distributed.initialize(**kwargs)
    except (RuntimeError, ValueError) as e:
        raise UserError(f"jax.distributed.initialize() failed ({e}); set {COORDINATOR_ENV}, {NUM_PROCESSES_ENV} "
                        f"and {PROCESS_ID_ENV}, or run under a cluster JAX detects (TPU pod, SLURM, Open MPI)") from e
    if callable(sigterm):  # JAX's runtime takes SIGTERM for its own preemption notifier: the caller's handler back
        signal.signal(signal.SIGTERM, sigterm)
    return True


def broadcast_json(obj):
    """Process 0's JSON-serialisable ``obj`` on every process (``obj`` itself on one process); every process waits
    for it."""
    return allgather_json(obj if is_main_process() else None)[0]


def is_main_process() -> bool:
    """Whether this is process 0 (the one that writes the files)."""
    return jax.process_index() == 0


def process_slice(n: int) -> range:
    """The contiguous block of ``range(n)`` this process handles."""
    p, k = jax.process_index(), jax.process_count()
    return range(p * n // k, (p + 1) * n // k)


def _gather_padded(a: np.ndarray) -> np.ndarray:
    """[processes, len(a)]: every process's 1-D ``a`` (the same length everywhere), gathered at a power-of-two length:
    each distinct length is a program compiled and kept by JAX, so a run's gathers of many lengths (a window's
    records) would grow its memory with the corpus."""
    n = a.size
    buf = np.zeros(pow2(n), a.dtype)
    buf[:n] = a
    return np.asarray(multihost_utils.process_allgather(buf)).reshape(jax.process_count(), -1)[:, :n]


def allgather_ints(values: Sequence[int]) -> np.ndarray:
    """int64 [processes, len(values)]: every process's ``values`` (the same length on every process)."""
    a = np.asarray(values, np.int64).reshape(1, -1)
    return a if jax.process_count() == 1 else _gather_padded(a[0])


def allgather_json(obj) -> list:
    """Every process's JSON-serialisable ``obj``, in process order (a plain list on one process)."""
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(json.dumps(obj).encode("utf-8"), np.uint8)
    sizes = allgather_ints([data.size])[:, 0]
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[: data.size] = data
    gathered = _gather_padded(buf)
    return [json.loads(bytes(gathered[i, : sizes[i]]).decode("utf-8")) for i in range(len(sizes))]


def sync(name: str) -> None:
    """A barrier across processes (no-op on one)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
