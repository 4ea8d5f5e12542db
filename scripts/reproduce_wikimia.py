"""Reproduce the WikiMIA tables and figures of Shi et al. (2023) for any models.

    python scripts/reproduce_wikimia.py --models smollm2 gemma3-270m --lengths 32 64 --out runs/reproduce

Writes into --out: table1_auroc.{md,csv}, table6_tpr_at_5pct_fpr.{md,csv}, k_sweep.{md,csv,png},
fig2b_auroc_by_length.png, results_long.json, examples.jsonl.gz (one line per cell: its labels and the per-example
scores of every method, from which every table, interval and paired comparison comes), and one resumable run folder
per (model, length, setting) under runs/. A mirrored Smaller-Ref pair (A with reference B and B with reference A) is
refused unless --allow-mirrored, which flags its cells instead.

    python scripts/reproduce_wikimia.py --from results/wikimia_reproduction --out OUT

rebuilds every table and plot from examples.jsonl.gz alone (no model), byte for byte. The run seals its folder at
the end (manifest.json: what the rebuild reads); the rebuild checks examples.jsonl.gz against it and for content (one
line per cell, no example twice), computes everything, and only then writes into --out: an empty or new folder, its
own earlier rebuild of the same folder, or the --from folder itself.
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from mia_jax.runs import entry, files, rundir
from mia_jax import models, reproduce, reproduce_report
from mia_jax.batching import check_tokens_per_batch
from mia_jax.data import WIKIMIA_LENGTHS, wikimia
from mia_jax.errors import UserError

PROG = "python scripts/reproduce_wikimia.py"
PAIRS = Path(__file__).resolve().parents[1] / "configs" / "reference_pairs.yaml"
RESUME_HINT = ("every finished batch is kept in its cell's passes/: run the same command again to resume")


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2"])
    ap.add_argument("--lengths", nargs="+", type=entry.positive_int, default=[32, 64, 128, 256],
                    help=f"WikiMIA lengths ({', '.join(map(str, WIKIMIA_LENGTHS))})")
    ap.add_argument("--ref-models", nargs="+", help="one reference per model (default: configs/reference_pairs.yaml)")
    ap.add_argument("--para-dir", type=entry.input_dir,
                    help="folder with WikiMIA_length{L}_paraphrased.jsonl for the Para. setting")
    ap.add_argument("--n-neighbors", type=entry.positive_int, default=10)
    ap.add_argument("--batch-size", type=entry.positive_int, default=8,
                    help="texts per step of the passes that read one text per row (generated neighbours)")
    ap.add_argument("--tokens-per-batch", type=entry.positive_int,
                    help="token slots of one scoring step (default: 2048 on CPU, 32768 on GPU and TPU)")
    ap.add_argument("--n-bootstrap", type=entry.nonneg_int, default=200)
    ap.add_argument("--seed", type=entry.nonneg_int, default=0)
    ap.add_argument("--limit", type=entry.positive_int, help="first N texts of each split (quick runs)")
    ap.add_argument("--out", type=entry.out_dir, default=Path("runs/reproduce_wikimia"))
    ap.add_argument("--allow-mirrored", action="store_true",
                    help="run mirrored Smaller-Ref pairs (A with reference B and B with reference A), flagged in the "
                         "tables and never bolded: their two cells are one score negated")
    ap.add_argument("--from", dest="from_dir", metavar="DIR",
                    type=entry.source_dir("reproduce_wikimia", example="results/wikimia_reproduction"),
                    help="rebuild the tables and plots of the reproduction in DIR from its examples.jsonl.gz into "
                         "--out (empty, new, an earlier rebuild of DIR, or DIR itself), without any model")
    ap.add_argument("--allow-download", action="store_true",
                    help="fetch models that are not local paths from the Hugging Face Hub (the paper's pairs in "
                         "configs/reference_pairs.yaml are Hub ids)")
    return ap


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv, resume_hint=RESUME_HINT)


def rebuild(src: Path, out: Path) -> None:
    """Tables and plots of the reproduction in ``src`` into ``out``: the input checked against the run's
    manifest and for content before anything is written, then ``out`` claimed (refused untouched when it holds
    anything but an earlier rebuild of ``src``), every output computed, and only then all written together."""
    cells = reproduce.read_examples(src)
    with rundir.rebuild_into(out, [src], "reproduce_wikimia"):
        text, outputs = reproduce.rebuild_outputs(src, cells)
        files.write_all(out, outputs)
    print(text)
    print(f"wrote {out}/", file=sys.stderr)


def _duplicates(values) -> list:
    return sorted({v for v in values if list(values).count(v) > 1}, key=str)


def _check_distinct(texts, name: str) -> None:
    """A text twice in a split would be one example counted twice (and its rebuild refuses such a cell)."""
    first = {}
    for i, text in enumerate(texts):
        if text in first:
            raise UserError(f"{name}: text {i} repeats text {first[text]}; each text once per split")
        first[text] = i


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.from_dir:
        rebuild(args.from_dir, args.out)
        return 0
    bad = [n for n in args.lengths if n not in WIKIMIA_LENGTHS]
    if bad:
        raise UserError(f"--lengths {' '.join(map(str, bad))}: WikiMIA has lengths "
                        f"{', '.join(map(str, WIKIMIA_LENGTHS))}")
    for flag, values in (("--lengths", args.lengths), ("--models", args.models)):
        if _duplicates(values):
            raise UserError(f"{flag} names {', '.join(map(str, _duplicates(values)))} twice: each (model, length, "
                            "setting) is one cell")
    check_tokens_per_batch(args.tokens_per_batch)
    for length in args.lengths:  # every split read (and a paraphrased file checked) before any model loads
        for ds in (wikimia(length), reproduce.paraphrased(length, args.para_dir)):
            if ds is not None:
                _check_distinct(ds.texts[: args.limit] if args.limit else ds.texts, ds.name)
    pairs = yaml.safe_load(PAIRS.read_text())
    refs = args.ref_models or [pairs.get(m) for m in args.models]
    if len(refs) != len(args.models) or None in refs:
        raise UserError(f"no reference model for {[m for m, r in zip(args.models, refs) if r is None]}; "
                        "pass --ref-models")
    mirrored = reproduce.mirrored_pairs(args.models, refs)
    if mirrored and not args.allow_mirrored:
        raise UserError("mirrored Smaller-Ref pairs " + ", ".join(f"{m} -> {r}" for m, r in mirrored)
                        + ": each cell would be the other's score negated (AUROCs summing to 1); give other "
                        "--ref-models, or --allow-mirrored to run them flagged")
    args.mirrored = [m for m, _ in mirrored]
    methods = reproduce.methods_for(reproduce_report.PAPER_METHODS)
    with rundir.claim(args.out):  # the lock; each cell's folder is claimed with its own fingerprint
        reproduce_all(args, refs, methods, Path(args.out))
    return 0


def reproduce_all(args, refs, methods, out: Path) -> None:
    results, examples = [], {}
    mirrored = set(getattr(args, "mirrored", ()))
    labels_of, ref_of = {}, {}
    for name, ref_name in zip(args.models, refs):
        loaded, ref = (models.load(m, allow_download=args.allow_download) for m in (name, ref_name))
        label = loaded.name  # a packaged name, or the folder / file name of a path
        if label in ref_of:
            raise UserError(f"two of --models are both named {label}: their cells would share one folder and one "
                            "table column; give folders of different names")
        ref_of[label] = ref.name
        if name in mirrored:
            labels_of[name] = label
        for length in args.lengths:
            splits = {"Ori.": wikimia(length), "Para.": reproduce.paraphrased(length, args.para_dir)}
            for setting, ds in splits.items():
                if ds is None:
                    continue
                if args.limit:
                    ds.texts, ds.labels = ds.texts[: args.limit], ds.labels[: args.limit]
                print(f"{label} (ref {ref.name}), WikiMIA-{length} {setting}: {len(ds)} texts", file=sys.stderr)
                cell = out / "runs" / f"{label}-{length}-{'para' if setting == 'Para.' else 'ori'}"
                ex = examples.setdefault((label, length, setting), {})
                rows = reproduce.run_cell(loaded, ds, methods, cell, ref=ref, batch_size=args.batch_size,
                                          tokens_per_batch=args.tokens_per_batch,
                                          n_bootstrap=args.n_bootstrap, seed=args.seed, examples=ex,
                                          **reproduce.neighbor_kwargs(loaded, args.n_neighbors, args.seed))
                results += [dict(r, model=label, length=length, setting=setting) for r in rows]
    files.write_jsonl_gz(out / reproduce.EXAMPLES, [
        {"model": m, "length": n, "setting": s, **ex, "ref_model": ref_of[m], "mirrored": m in labels_of.values(),
         "n_bootstrap": args.n_bootstrap, "seed": args.seed} for (m, n, s), ex in examples.items()])
    print(reproduce_report.write_reports(out, results, examples=examples, mirrored=sorted(labels_of.values()),
                                  n_bootstrap=max(1, args.n_bootstrap), seed=args.seed))
    rundir.seal(out, reproduce.REBUILD_READS)  # last: what a --from rebuild reads, as this run wrote it
    print(f"wrote {out}/", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
