"""The published per-example approach as one command, end to end: load the model into transformers + torch, then one
text per forward pass, full ``log_softmax``, Min-K% / Min-K%++ / loss in NumPy per text (the Min-K%++ authors'
``run.py`` loop; ``benchmark.py``'s approach (c)). The anchor that ``mia-jax eval`` is timed against as a whole
command (``farm-bench --vs``, BENCHMARKS.md), and the reference its scores are compared with::

    python scripts/bench/published_loop.py --model smollm2 --length 32 --out /tmp/published.jsonl
    python scripts/bench/published_loop.py --compare /tmp/published.jsonl runs/wikimia-32-smollm2/results.jsonl

Needs torch and transformers (the test extra). The count of the k% lowest is the toolkit's exact max(1, floor(k n))
(the authors' ``int(n * k)`` differs from it for a few lengths), so the two sides compute the same quantity.
``--compare A B`` prints, per method, how many texts agree within 1e-3 (absolute) and the largest difference.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_tools, benchmark: beside this file
import bench_tools  # noqa: E402
from benchmark import METHODS, per_text, torch_arrays, transformers_model  # noqa: E402

from mia_jax.runs import entry  # noqa: E402
from mia_jax.data import WIKIMIA_LENGTHS  # noqa: E402
from mia_jax.errors import UserError  # noqa: E402

PROG = "python scripts/bench/published_loop.py"


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--length", type=entry.positive_int, default=32,
                    help=f"WikiMIA length ({', '.join(map(str, WIKIMIA_LENGTHS))})")
    ap.add_argument("--limit", type=entry.positive_int, help="first N texts only")
    ap.add_argument("--out", type=entry.out_file, default=Path("published.jsonl"),
                    help="the per-text scores (a JSONL file)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), type=entry.input_file,
                    help="two results files to compare (no model run)")
    return ap


def run(args) -> None:
    import torch

    from mia_jax import models
    from mia_jax.batching import encode
    from mia_jax.data import wikimia

    t0 = time.perf_counter()
    loaded = models.load(args.model)
    model = transformers_model(loaded)
    texts = wikimia(args.length).texts[: args.limit]
    encoded = encode(loaded, texts)
    arrays = torch_arrays(model, loaded, "cpu")
    scores = per_text(encoded, arrays)
    Path(args.out).write_text("".join(json.dumps({"index": i, "scores": s}) + "\n" for i, s in enumerate(scores)))
    print(f"published loop: {len(texts)} texts, {sum(len(e.ids) for e in encoded)} tokens in "
          f"{time.perf_counter() - t0:.1f} s (torch {torch.__version__}, {torch.get_num_threads()} threads); "
          f"wrote {args.out}", file=sys.stderr)


def compare(a: str, b: str) -> None:
    def read(path):
        try:
            return [json.loads(line)["scores"] for line in Path(path).read_text(encoding="utf-8-sig").splitlines()
                    if line.strip()]
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"{path}: not a results file ({e})") from None

    ra, rb = read(a), read(b)
    if len(ra) != len(rb):
        raise UserError(f"{a} has {len(ra)} records, {b} {len(rb)}")
    for m in METHODS:
        x = np.array([np.nan if r is None or r.get(m) is None else r[m] for r in ra], float)
        y = np.array([np.nan if r is None or r.get(m) is None else r[m] for r in rb], float)
        diff = np.abs(x - y)
        print(f"{m}: {int(np.sum(diff <= 1e-3))}/{len(x)} within 1e-3, largest difference {np.nanmax(diff):.2e}")


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.compare:
        compare(*args.compare)
        return 0
    if args.length not in WIKIMIA_LENGTHS:  # a bad length before the model loads
        raise UserError(f"--length {args.length}: WikiMIA has lengths {', '.join(map(str, WIKIMIA_LENGTHS))}")
    os.environ.update(bench_tools.torch_env({}, "PASSIVE"))  # as benchmark.py's torch worker, before torch loads
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
