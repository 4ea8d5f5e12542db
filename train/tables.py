"""Every table and figure of a contamination run or sweep, rebuilt from its per-example scores (no model needed).

Every run writes ``examples.jsonl.gz`` (one JSON object per eval example: the corpus's eval fields but the text,
``text_sha256``, the blind-baseline score and every method's score under the trained and the base model) beside
``run.json``; every table and figure of the run, or of a sweep of runs, is a function of those files alone::

    python -m train.tables --from results/contamination/lr     # a sweep folder, or one run's folder

One run: Table 3, Table 7, roc.png (train/run_tables.py); a sweep: each run's, and the sweep's own table or figure
(train/sweep_tables.py, chosen by the sweep's ablation: train/ablations.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

from mia_jax.runs import entry, files, rundir
from train.ablations import ABLATIONS
from train.loading import load_source
from train.run_tables import run_outputs

PROG = "python -m train.tables"


def rebuild_outputs(folder: Path, loaded=None) -> tuple[str, dict[str, str | bytes]]:
    """(the main table's markdown, {path relative to the output folder: content}) of every table and figure of a
    run or sweep folder; nothing is written. ``loaded``: :func:`load_source` of ``folder`` when already read."""
    kind, runs = loaded if loaded is not None else load_source(folder)
    if kind is None:
        _, outputs = run_outputs(runs[0][1]["examples"], runs[0][1])
        return outputs["table3.md"], outputs
    outputs: dict[str, str | bytes] = {}
    res = []
    for name, info in runs:
        results, outs = run_outputs(info["examples"], info)
        outputs.update({f"{name}/{k}": v for k, v in outs.items()})
        res.append(dict(results, examples=info["examples"], corpus=info.get("corpus"), config=info["config"]))
    text, outs = ABLATIONS[kind].table(res, runs[0][1]["methods"])
    outputs.update(outs)
    return text, outputs


def rebuild(folder: Path, out: Path | None = None) -> str:
    """A run folder (holding examples.jsonl.gz) or a sweep folder (sub-folders lr_*, size_*, news_*, occurrence):
    every table and figure rebuilt from the per-example scores into ``out`` (default: in place). Every input is
    checked and every output computed before any is written (all or none: ``files.write_all``)."""
    folder = Path(folder)
    text, outputs = rebuild_outputs(folder)
    out = Path(out) if out is not None else folder
    out.mkdir(parents=True, exist_ok=True)
    files.write_all(out, outputs)
    return text


def build_parser() -> entry.ArgumentParser:
    """The argument parser of ``python -m train.tables``."""
    p = entry.ArgumentParser(prog=PROG, description="Rebuild every table and figure of a contamination run or sweep "
                             "from its per-example scores (no model needed).")
    p.add_argument("--from", dest="src", required=True, metavar="DIR",
                   type=entry.source_dir("contamination", example="results/contamination/lr"),
                   help="a run folder (run.json + examples.jsonl.gz) or a sweep folder of such runs")
    p.add_argument("--out", type=entry.out_dir, metavar="DIR",
                   help="write there instead of in place (the same layout): a new or empty folder, or this "
                        "command's own earlier rebuild of the same --from")
    return p


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    out = args.out if args.out is not None else args.src
    loaded = load_source(args.src)  # every input checked against its manifest: nothing written yet
    with rundir.rebuild_into(out, [args.src], "train.tables"):  # an --out holding anything else: refused now
        text, outputs = rebuild_outputs(args.src, loaded)  # every output computed, then all written together
        files.write_all(out, outputs)
    print(text)
    return 0


def main(argv=None) -> int:
    """Runs the command with ``argv`` (default: sys.argv[1:]); returns the exit status."""
    return entry.run(PROG, _main, argv, resume_hint="run the same command again (a rebuild writes all its files or "
                     "none)")


if __name__ == "__main__":
    sys.exit(main())
