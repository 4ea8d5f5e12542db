"""Tokens/s of the scoring path (`mia-jax eval`'s runner) on WikiMIA at several token budgets per step.

    python scripts/benchmark_eval.py --model smollm2 --length 32 --tokens-per-batch 1024 2048 4096

Compile time is reported separately: a first pass over the data compiles every step shape, the
second pass is timed as steady state. Padding: token slots of the steps not holding a text's token.
"""
from __future__ import annotations

import sys
import time

import jax

from mia_jax import batching, compilation, entry, models, runner
from mia_jax.data import wikimia
from mia_jax.scorers import DEFAULT_METHODS, expand_methods

PROG = "python scripts/benchmark_eval.py"


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--length", type=entry.positive_int, default=32)
    ap.add_argument("--tokens-per-batch", nargs="+", type=entry.positive_int, default=[1024, 2048, 4096])
    ap.add_argument("--limit", type=entry.positive_int, help="first N texts only")
    return ap


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    texts = wikimia(args.length).texts[: args.limit]  # a bad length before the model loads
    loaded = models.load(args.model)
    methods = expand_methods(DEFAULT_METHODS, [0.2])
    n_tokens = sum(len(e.ids) for e in batching.encode(loaded, texts))
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
        steps = batching.pack([len(e.ids) for e in batching.encode(loaded, texts)], budget, loaded.max_length)
        shapes = sorted({s.shape for s in steps})
        print(f"| {budget} | {report['scoring_programs']} ({', '.join(f'{r}x{t}' for r, t, _ in shapes)}) | "
              f"{1 - report['tokens'] / report['slots']:.1%} | {first:.1f} s | {compiled['seconds']:.1f} s | "
              f"{steady:.1f} s | {n_tokens / steady:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
