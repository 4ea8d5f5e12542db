"""Tokens/s of the scoring path (`mia-jax eval`'s runner) on WikiMIA at several batch sizes.

    python scripts/benchmark_eval.py --model smollm2 --length 32 --batch-sizes 1 8 32

Compile time is reported separately: a first pass over the data compiles every bucket shape, the
second pass is timed as steady state.
"""
from __future__ import annotations

import argparse
import time

import jax

from mia_jax import models, runner
from mia_jax.data import wikimia
from mia_jax.scorers import DEFAULT_METHODS, expand_methods


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--limit", type=int, help="first N texts only")
    args = ap.parse_args()
    loaded = models.load(args.model)
    texts = wikimia(args.length).texts[: args.limit]
    methods = expand_methods(DEFAULT_METHODS, [0.2])
    n_tokens = sum(len(e.ids) for e in runner.encode(loaded, texts))
    print(f"device: {jax.devices()[0]}; model {loaded.name}; WikiMIA-{args.length}: {len(texts)} texts, "
          f"{n_tokens} tokens; {len(methods)} methods")
    print("| batch size | first pass (with compiles) | steady state | tokens/s (steady) |")
    print("|---:|---:|---:|---:|")
    for bs in args.batch_sizes:
        t0 = time.perf_counter()
        runner.score_texts(loaded, texts, methods, batch_size=bs, progress=False)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        runner.score_texts(loaded, texts, methods, batch_size=bs, progress=False)
        steady = time.perf_counter() - t0
        print(f"| {bs} | {first:.1f} s | {steady:.1f} s | {n_tokens / steady:.0f} |")


if __name__ == "__main__":
    main()
