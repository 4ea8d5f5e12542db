"""Tokens/s of the scoring path (`mia-jax eval`'s runner) on WikiMIA at several token budgets per step.

    python scripts/bench/benchmark_eval.py --model smollm2 --length 32 --tokens-per-batch 1024 2048 4096

Compile time is reported separately: a first pass over the data compiles every step shape, the
second pass is timed as steady state. Padding: token slots of the steps not holding a text's token. ``--parts``: then
the first budget's device steps alone and by part (the forward; the forward with the float32 statistics: each its
own jitted program over the same staged batches, ``bench_tools.step_parts``), beside XLA's float32 matmul rate.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import numpy as np

from mia_jax import batching, models
from mia_jax.engine import compilation, runner
from mia_jax.runs import entry
from mia_jax.data import wikimia
from mia_jax.scorers import DEFAULT_METHODS, expand_methods

PROG = "python scripts/bench/benchmark_eval.py"


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--length", type=entry.positive_int, default=32)
    ap.add_argument("--tokens-per-batch", nargs="+", type=entry.positive_int, default=[1024, 2048, 4096])
    ap.add_argument("--limit", type=entry.positive_int, help="first N texts only")
    ap.add_argument("--parts", action="store_true",
                    help="also time the first budget's device steps alone and by part (forward, statistics)")
    return ap


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    texts = wikimia(args.length).texts[: args.limit]  # a bad length before the model loads
    loaded = models.load(args.model)
    methods = expand_methods(DEFAULT_METHODS, [0.2])
    encoded = batching.encode(loaded, texts)
    n_tokens = sum(len(e.ids) for e in encoded)
    print(f"device: {jax.devices()[0]}; model {loaded.name}; WikiMIA-{args.length}: {len(texts)} texts, "
          f"{n_tokens} tokens; {len(methods)} methods")
    print("| tokens per batch | programs (row shape) | padding | first pass (with compiles) | compile | steady state "
          "| tokens/s (steady) |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for budget in args.tokens_per_batch:
        report: dict = {}
        count = compilation.CompileCount("score_step")
        t0 = time.perf_counter()
        runner.score_texts(loaded, texts, methods, tokens_per_batch=budget, progress=False, report=report)
        first = time.perf_counter() - t0
        compiled = count.stop()
        t0 = time.perf_counter()
        runner.score_texts(loaded, texts, methods, tokens_per_batch=budget, progress=False)
        steady = time.perf_counter() - t0
        steps = batching.pack(batching.scoring_lengths(encoded), budget, loaded.max_length)
        shapes = sorted({s.shape for s in steps})
        print(f"| {budget} | {report['scoring_programs']} ({', '.join(f'{r}x{t}' for r, t, _ in shapes)}) | "
              f"{1 - report['tokens'] / report['slots']:.1%} | {first:.1f} s | {compiled['seconds']:.1f} s | "
              f"{steady:.1f} s | {n_tokens / steady:.0f} |")
    if args.parts:
        _parts(loaded, texts, methods, args.tokens_per_batch[0])
    return 0


def _parts(loaded, texts, methods, budget) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_tools: beside this file
    import bench_tools

    staged = bench_tools.staged_steps(loaded, texts, methods, budget)
    whole = float(np.median(bench_tools.device_step_passes(staged, 1.0)))
    parts = {k: float(np.median(v)) for k, v in bench_tools.step_parts(loaded, staged, 1.0).items()}
    rate = bench_tools.matmul_rate()
    print(f"device steps of one pass ({len(staged)} steps of {budget} token slots): forward alone "
          f"{parts['forward']:.1f} s, forward with the statistics {parts['statistics']:.1f} s, whole step "
          f"{whole:.1f} s (separate programs, each timed after one unmeasured pass); CPU {bench_tools.cpu_model()}, "
          f"float32 matmul 2048^3: XLA {rate['xla']:.0f} GFLOP/s, NumPy {rate['numpy']:.0f} GFLOP/s")


if __name__ == "__main__":
    sys.exit(main())
