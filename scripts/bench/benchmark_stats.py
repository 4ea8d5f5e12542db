"""Peak memory of the statistics step: vocabulary-chunked from hidden states vs a full float32 log_softmax.

Memory is XLA's own accounting of the compiled program (arguments + outputs + temporaries, from
``compiled.memory_analysis()``), so the figures are exact and repeatable; wall time is the median of
a few steady-state runs after compilation.

    python scripts/bench/benchmark_stats.py --shapes 8,128,49152 8,128,262144
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_tools beside this file
from bench_tools import three_ints  # noqa: E402

from mia_jax.runs import entry  # noqa: E402
from mia_jax.stats import TokenStats, token_stats_from_hidden  # noqa: E402

PROG = "python scripts/bench/benchmark_stats.py"


shape = three_ints("B,T,V", "batch, tokens, vocabulary", "8,128,49152", "shape")


def full_log_softmax(hidden, w, targets):
    """The published approach: logits, full log_softmax, probs * log_probs, all [B, T, V] float32."""
    logits = jnp.einsum("btd,vd->btv", hidden, w)
    logp = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(logp)
    lp = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
    mu = jnp.sum(p * logp, -1)
    var = jnp.sum(p * jnp.square(logp), -1) - jnp.square(mu)
    rank = 1 + jnp.sum(logp > lp[..., None], -1)
    return TokenStats(lp, mu, var, -mu, rank, jnp.max(logp, -1))


def measure(fn, args, repeats=3):
    compiled = jax.jit(fn).lower(*args).compile()
    mem = compiled.memory_analysis()
    peak = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return peak, mem.temp_size_in_bytes, float(np.median(times))


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", type=shape, default=[(8, 128, 49152), (8, 128, 262144)], help="B,T,V")
    ap.add_argument("--dim", type=entry.positive_int, default=576,
                    help="hidden size D (SmolLM2: 576, Gemma-3-270m: 640)")
    ap.add_argument("--chunk-size", type=entry.positive_int, default=8192)
    return ap


def main(argv=None) -> int:
    return entry.run(PROG, report, argv)


def report(argv) -> int:
    """The table of every ``--shapes`` entry: peak, temporary memory and time of both approaches."""
    args = build_parser().parse_args(argv)
    print(f"device: {jax.devices()[0]}, hidden size {args.dim}, chunk {args.chunk_size}")
    print("| [B, T, V] | float32 logits | full log_softmax: peak / temp / time "
          "| chunked from hidden: peak / temp / time | chunked / logits |")
    print("|---|---:|---:|---:|---:|")
    mib = 2**20
    for b, t, v in args.shapes:
        rng = np.random.default_rng(0)
        hidden = jnp.asarray(rng.standard_normal((b, t, args.dim)), jnp.float32)
        w = jnp.asarray(rng.standard_normal((v, args.dim)) / np.sqrt(args.dim), jnp.float32)
        targets = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
        logits_bytes = b * t * v * 4
        full = measure(full_log_softmax, (hidden, w, targets))
        chunked = measure(lambda h, w_, y: token_stats_from_hidden(h, w_, y, chunk_size=args.chunk_size),
                          (hidden, w, targets))
        # what the statistics add on top of the inputs (hidden states and the unembedding already exist)
        print(f"| {b}, {t}, {v} | {logits_bytes / mib:.0f} MiB | {full[0] / mib:.0f} / {full[1] / mib:.0f} MiB / "
              f"{full[2] * 1e3:.0f} ms | {chunked[0] / mib:.0f} / {chunked[1] / mib:.1f} MiB / "
              f"{chunked[2] * 1e3:.0f} ms"
              f" | temp {chunked[1] / logits_bytes:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
