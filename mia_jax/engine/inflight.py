"""How many scoring steps a pass keeps running at once, and on which threads.

On a GPU or TPU, JAX's asynchronous dispatch already overlaps the host with the device, and the device runs its
programs one after another: a pass keeps one step in flight and writes the records of the one before while it runs.

On the CPU, dispatch is asynchronous too, but XLA runs the programs launched from one thread one after another, and
one program does not keep every core busy (its small fusions and the statistics' reductions run on fewer threads
than its matmuls). Programs launched from two threads run at the same time. So there a pass runs each step on a
worker thread, ``CPU_STEPS`` at once: WikiMIA-32's scoring pass with SmolLM2 took 62.0-62.3 s against 67.6-69.3 s
one step at a time on a 2-core AMD EPYC (BENCHMARKS.md, "The packed engine"). A step's scores do not depend on what
runs beside it; the records are still written in the steps' order.
"""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import jax

CPU_STEPS = 2  # steps running at once on the CPU (two workers; more gave nothing on 2 cores)
POLL_S = 0.002  # how often ``InFlight.result`` looks at a worker's step (a step takes tens of ms or more)


class InFlight:
    """A pass's launched steps, finished in order: ``launch(fn, *args)`` starts ``fn(*args)`` (on a worker thread
    when ``workers`` > 0, else by the caller as JAX dispatches it); ``add(item)`` queues an item holding a launched
    output and returns the items due to finish (the oldest, once more than ``depth`` are queued); ``drain()`` the
    rest. ``result(out)`` is a launched output's value. Use as a context manager: the workers are shut down on
    exit (a step already running is waited for)."""

    def __init__(self, workers: int = 0):
        self.depth = max(workers, 1)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="score-step") if workers else None
        self._queue: deque = deque()

    @classmethod
    def for_backend(cls, mesh=None) -> "InFlight":
        """``CPU_STEPS`` workers on the CPU without a mesh (a mesh's processes run their steps in lockstep), else
        none."""
        return cls(CPU_STEPS if mesh is None and jax.default_backend() == "cpu" else 0)

    def launch(self, fn, *args):
        if self._pool is None:
            return fn(*args)
        return self._pool.submit(lambda: jax.block_until_ready(fn(*args)))

    @staticmethod
    def result(out):
        """A launched output's value. A worker's step is waited for by polling, not by ``Future.result``: the
        KeyboardInterrupt that Ctrl-C raises (``entry._on_sigint``) could land inside ``Condition.wait`` after it
        released its lock, and leaving the ``with`` then failed with "RuntimeError: cannot release un-acquired lock"
        (a traceback and exit 1 instead of the one line and exit 130). ``time.sleep`` is interrupted cleanly."""
        if not isinstance(out, Future):
            return out
        while not out.done():
            time.sleep(POLL_S)
        return out.result()

    def add(self, item) -> list:
        self._queue.append(item)
        return [self._queue.popleft()] if len(self._queue) > self.depth else []

    def drain(self) -> list:
        items, self._queue = list(self._queue), deque()
        return items

    def __enter__(self) -> "InFlight":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
