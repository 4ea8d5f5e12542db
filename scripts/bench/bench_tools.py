"""Measuring helpers of the benchmark scripts: peak resident memory sampled while a block runs, XLA compilation
counts and seconds (JAX monitoring events), the machine's float32 matmul rate (XLA and NumPy), and the toolkit's
scoring pass taken apart (its device steps alone, its phases)."""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from unittest import mock

import numpy as np

from mia_jax.runs import entry


class PeakRSS:
    """Peak resident memory of this process, sampled every ``interval`` seconds while active."""

    def __init__(self, interval=0.005):
        import psutil

        self.proc, self.interval, self.peak, self._stop = psutil.Process(), interval, 0, threading.Event()

    def rss(self):
        return self.proc.memory_info().rss

    def __enter__(self):
        self.base = self.peak = self.rss()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())


class Compiles:
    """Counts XLA backend compilations and sums tracing + lowering + compile seconds (JAX monitoring)."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __init__(self):
        import jax

        self.count, self.seconds, self.active = 0, 0.0, False
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, *args, **kwargs):
        if self.active and event in self.EVENTS:
            self.seconds += duration
            self.count += event == self.EVENTS[-1]

    def __enter__(self):
        self.count, self.seconds, self.active = 0, 0.0, True
        return self

    def __exit__(self, *exc):
        self.active = False


def matmul_rate(n=2048, repeats=5):
    """float32 GFLOP/s of an n x n x n matmul: through XLA (jitted) and through NumPy."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    f = jax.jit(jnp.matmul)
    xa, xb = jnp.asarray(a), jnp.asarray(b)
    f(xa, xb).block_until_ready()
    rates = {}
    for name, call in (("xla", lambda: f(xa, xb).block_until_ready()), ("numpy", lambda: a @ b)):
        call()
        best = min(timed(call) for _ in range(repeats))
        rates[name] = 2 * n**3 / best / 1e9
    return rates


def timed(call) -> float:
    """Seconds that ``call()`` takes."""
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def runnable(approaches, torch_approach: str) -> list:
    """The approaches asked for, less the transformers + torch one when those are not installed (said on stderr)."""
    import importlib.util

    approaches = list(approaches)
    if torch_approach in approaches and any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")):
        print(f"torch / transformers not installed: skipping {torch_approach}", file=sys.stderr)
        approaches.remove(torch_approach)
    return approaches


PRECISIONS = ("default", "float32", "tf32")


def set_matmul_precision(precision: str, torch: bool = False) -> None:
    """float32 matmul precision of JAX (and torch when ``torch``): "default" leaves each framework's own default
    (JAX on a recent NVIDIA GPU: TF32; torch: full float32), "float32" asks both for full float32 (JAX
    ``jax_default_matmul_precision="float32"``, torch ``set_float32_matmul_precision("highest")``), "tf32" for
    TensorFloat-32 (``"tensorfloat32"`` / ``"high"``). On a CPU both compute in float32 whatever is asked."""
    if precision == "default":
        return
    import jax

    jax.config.update("jax_default_matmul_precision", {"float32": "float32", "tf32": "tensorfloat32"}[precision])
    if torch:
        import torch as _torch

        _torch.set_float32_matmul_precision({"float32": "highest", "tf32": "high"}[precision])


def three_ints(letters: str, meaning: str, example: str, name: str):
    """An argparse type of a ``letters`` option (e.g. ``B,T,V``): three whole numbers > 0, else the error names
    them (``meaning``) and gives an ``example``; ``name``: the type's name in argparse's messages."""
    def parse(text: str) -> tuple[int, int, int]:
        parts = text.split(",")
        if len(parts) != 3:
            raise argparse.ArgumentTypeError(f"{text!r}: give {letters} ({meaning}), e.g. {example}")
        return tuple(entry.positive_int(p.strip()) for p in parts)

    parse.__name__ = name
    return parse


def bench_main(prog: str, build_parser, worker, driver, argv, flag: str = "worker") -> int:
    """A benchmark script's ``main`` (``entry.run`` as ``prog``): ``argv`` parsed by ``build_parser()``; with the
    hidden option ``flag`` set, ``worker(args)`` (one measurement in its own process), else ``driver(args)`` (which
    starts the workers and reports). Returns the exit code."""
    def run(argv) -> int:
        args = build_parser().parse_args(argv)
        return worker(args) if getattr(args, flag) else driver(args)

    return entry.run(prog, run, argv)


def add_accelerator_args(ap, torch_what: str = "torch") -> None:
    """The options a benchmark needs on an accelerator: ``--torch-device`` (of ``torch_what``), ``--matmul-precision``
    (:func:`set_matmul_precision`) and ``--peak-tflops`` (MFU against a datasheet peak too)."""
    ap.add_argument("--torch-device", default="cpu", help=f"torch device of {torch_what}, e.g. cuda (default cpu)")
    ap.add_argument("--matmul-precision", default="default", choices=PRECISIONS,
                    help="float32 matmul precision of JAX and torch (default: each framework's own)")
    ap.add_argument("--peak-tflops", type=entry.positive_float,
                    help="also give MFU against this rate (TFLOP/s), e.g. an accelerator's datasheet peak")


def torch_env(env: dict, omp_wait_policy: str, torch_device: str = "cpu") -> dict:
    """The environment of a worker that runs torch: ``OMP_WAIT_POLICY`` unless ``omp_wait_policy`` is "default"
    (torch's own); on a GPU, JAX (which that worker also imports, for the tokenizer and the model's facts) must not
    pre-allocate most of the GPU's memory."""
    if omp_wait_policy != "default":
        env = dict(env, OMP_WAIT_POLICY=omp_wait_policy)
    return env if torch_device == "cpu" else dict(env, XLA_PYTHON_CLIENT_PREALLOCATE="false")


def torch_sync(device) -> None:
    """Wait for torch's queued work on ``device`` (a no-op on the CPU)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere) and the cores this process
    may use: a figure holds only on the machine it was measured on."""
    import platform

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {cores} cores"


def run_bounded(cmd: list, env: dict, timeout: float, stdout=None) -> tuple[int | None, float]:
    """Run ``cmd`` in its own process group; past ``timeout`` seconds kill that group (the command and any process
    it started). Returns (exit status, or None when it was stopped at the timeout; wall seconds)."""
    import signal
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=stdout, start_new_session=True)
    rc = None
    try:
        rc = proc.wait(timeout=max(timeout, 0.001))
    except subprocess.TimeoutExpired:
        pass
    finally:  # at the timeout, or when this process is interrupted while waiting
        if rc is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return rc, time.perf_counter() - t0


def repeat(fn, min_seconds: float, max_passes: int = 200) -> list[float]:
    """Seconds of ``fn()`` passes (each to completion), repeated until they add up to ``min_seconds`` (at least
    one pass)."""
    times = []
    while not times or (sum(times) < min_seconds and len(times) < max_passes):
        times.append(timed(fn))
    return times


def max_rel_diff(xs: list, ys: list, methods) -> dict:
    """{method: the largest |x - y| / max(|x|, 1e-6) over texts} of two lists of per-text score dicts (None, a
    missing or a non-finite score skipped)."""
    import math

    worst = {}
    for sx, sy in zip(xs, ys):
        for m in methods:
            u, v = (sx or {}).get(m), (sy or {}).get(m)
            if u is not None and v is not None and math.isfinite(u) and math.isfinite(v):
                worst[m] = max(worst.get(m, 0.0), abs(u - v) / max(abs(u), 1e-6))
    return worst


def staged_steps(loaded, texts, methods, tokens_per_batch) -> list[tuple]:
    """``score_texts``' own batches, taken on their way into the jitted step and placed on the device: [(step, state,
    batch)] of one pass."""
    import jax

    from mia_jax.engine import runner

    staged, real = [], runner.shared_score_step

    def staging(*args, **kwargs):
        step = real(*args, **kwargs)

        def run(state, batch):
            staged.append((step, state, jax.device_put(batch)))
            return step(state, batch)
        return run

    with mock.patch.object(runner, "shared_score_step", staging):
        runner.score_texts(loaded, texts, methods, tokens_per_batch=tokens_per_batch, progress=False)
    return staged


def _back_to_back(programs, min_seconds) -> list[float]:
    """Seconds of running every (fn, state, batch) of ``programs`` back to back, after one unmeasured run."""
    import jax

    def run():
        jax.block_until_ready([fn(state, batch) for fn, state, batch in programs])

    run()
    return repeat(run, min_seconds)


def device_step_passes(staged, min_seconds) -> list[float]:
    """Seconds of the scoring steps alone: a pass's own batches (``staged_steps``) run back to back (``repeat``): the
    device's share of a pass, without the host's encoding, packing and records."""
    return _back_to_back(staged, min_seconds)


def step_parts(loaded, staged, min_seconds) -> dict[str, list[float]]:
    """Seconds of the first parts of a pass's device steps, each its own jitted program over the same batches
    (``staged_steps``, run as ``device_step_passes``): ``forward`` (the model's final hidden states over the packed
    rows) and ``statistics`` (those and the float32 statistics over the vocabulary, ``score_step``'s own code); the
    whole step less ``statistics`` is each text's gathering and the methods' formulas."""
    import jax
    from flax import nnx

    from mia_jax.engine import score_step
    from mia_jax.batching import real_vocab_size

    graphdef, vocab = nnx.split(loaded.model)[0], real_vocab_size(loaded)

    def forward(state, batch):
        return nnx.merge(graphdef, state).hidden_states(batch["ids"], segment_ids=batch["segment_ids"])

    def stats(state, batch):
        return score_step._token_stats(nnx.merge(graphdef, state), batch["ids"], vocab, score_step.default_chunk(),
                                       None, batch["segment_ids"])

    return {name: _back_to_back([(fn, state, batch) for _, state, batch in staged], min_seconds)
            for name, fn in (("forward", jax.jit(forward)), ("statistics", jax.jit(stats)))}


PHASES = {"start": "encode", "plan": "plan", "dispatch": "dispatch", "finish": "finish"}  # engine.phases


def pass_phases(loaded, texts, methods, tokens_per_batch) -> dict[str, float]:
    """Seconds of one more pass, by phase of ``runner.score_texts`` (``engine.phases``): ``encode`` (``start``:
    tokenizing, the sink), ``plan`` (packing), ``dispatch`` (rows and masks built, each step launched), ``finish``
    (waiting for each step's scores, then its records), ``rest`` (the pass's wall time less those): where the host's
    share of a pass goes."""
    from mia_jax.engine import phases, runner

    spent = dict.fromkeys(PHASES.values(), 0.0)

    def timed_phase(name):
        fn = getattr(phases, name)

        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[PHASES[name]] += time.perf_counter() - t0
        return run

    with mock.patch.multiple(phases, **{name: timed_phase(name) for name in PHASES}):
        t0 = time.perf_counter()
        runner.score_texts(loaded, texts, methods, tokens_per_batch=tokens_per_batch, progress=False)
        wall = time.perf_counter() - t0
    return dict(spent, rest=wall - sum(spent.values()), wall=wall)
