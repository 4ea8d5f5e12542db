"""Preemption notices: ``SIGTERM`` (what a Cloud TPU spot or preemptible VM, SLURM and Kubernetes send before they
take the machine) stops a run at a step boundary with its finished work on disk, on every process at the same step.

One implementation, used by scoring (``runner.score_texts``, the streamed windows of ``shards``) and training
(``train.trainer``):

- :func:`install` (the command's guard, ``entry.run``; ``processes.initialize_distributed`` puts it back after JAX's
  runtime took ``SIGTERM`` for its own preemption notifier) makes ``SIGTERM`` set a flag instead of killing the process.
- :func:`agreed` is called by every process after each step, in lockstep (the same number of calls on each): on one
  process it reads the flag; on several, the flags are gathered (one small all-gather) so that a notice to any one
  process stops every process after the same step. The caller saves the step's records or checkpoint, then raises
  :class:`Preempted`.
- The guard prints ``Preempted``'s one line ("preempted after ... (saved); run the same command to resume") and
  exits with ``EXIT_CODE`` (75, ``EX_TEMPFAIL``: a temporary failure, try again), on every process.

A process lost without notice (SIGKILL, a lost host) fails the others' next collective: :func:`lost_process` tells
such an error, and the guard prints :func:`lost_line` and exits 1 at once (not through JAX's exit barrier, which would
wait for the lost process). JAX's runtime may end such a process first by itself (its coordination service reports
the lost task; it aborts with its own log lines): either way within ``processes.HEARTBEAT_S``.
"""
from __future__ import annotations

import re
import signal
import sys
import threading

EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: the run is unfinished, not failed; the same command resumes it
_notice = threading.Event()


class Preempted(Exception):
    """A preemption notice acted on at a step boundary; ``str()`` is the one line the guard prints."""

    def __init__(self, progress: str):
        self.progress = progress
        super().__init__(f"preempted after {progress} (saved); run the same command to resume")


def _on_sigterm(signum, frame) -> None:
    _notice.set()


def install() -> bool:
    """``SIGTERM`` sets the notice (from the main thread only; elsewhere nothing changes); True when installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def agreed() -> bool:
    """Whether any process of the run has received a notice; on several processes a collective that every process
    must call at the same point."""
    import jax

    flag = _notice.is_set()
    if jax.process_count() > 1:
        from mia_jax.runs import processes

        flag = bool(processes.allgather_ints([int(flag)]).any())
    return flag


# ----------------------------------------------------------------------------- a process lost without notice

_RUNTIME_STATUS = re.compile(r"(UNKNOWN|UNAVAILABLE|DEADLINE_EXCEEDED|INTERNAL|ABORTED|CANCELLED): ")


def lost_process(e: BaseException) -> bool:
    """Whether ``e`` is the failure of a collective on a run of several processes: a peer killed, preempted without
    notice or lost with its host (its connections closed: seen at once by the next collective)."""
    jax = sys.modules.get("jax")
    if jax is None or not jax.distributed.is_initialized() or jax.process_count() < 2:
        return False
    # a failed collective surfaces as JaxRuntimeError, or as a ValueError carrying the runtime's status (gloo's)
    return isinstance(e, jax.errors.JaxRuntimeError) or bool(_RUNTIME_STATUS.match(str(e)))


def lost_line(e: BaseException) -> str:
    """The one line (after "PROG: error: ") for :func:`lost_process`'s ``e``."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    return f"another process of this run failed or was lost ({first}); run the same command on every host to resume"
