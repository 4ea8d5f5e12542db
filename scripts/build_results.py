"""Every committed file under results/ rebuilt from the committed per-example files, by one command::

    python scripts/build_results.py            # rebuild results/ in place
    python scripts/build_results.py --check    # rebuild a copy, compare with the committed files byte for byte
    python scripts/build_results.py --seeds 5  # every verdict re-tested under 5 other bootstrap seeds

No model is needed and nothing is typed by hand: each step runs the command documented for its part (in this
process, from the repository's root, with the relative paths the tables record):

- the contamination study and every sweep's tables: ``python -m train.study --lr results/contamination/lr
  results/contamination/gemma-lr --size ... --news ... --occurrence ... --traps ... (each ablation of
  train/ablations.py whose folder exists) --header results/contamination/README.md --out
  results/contamination.md`` (which rebuilds each sweep in place, as ``python -m train.tables --from`` would);
- the WikiMIA reproduction: ``python scripts/reproduce_wikimia.py --from results/wikimia_reproduction --out
  results/wikimia_reproduction``;
- the audits: ``mia-jax audit-books --from results/audits/books --out results/audits/books`` (and books_control),
  ``mia-jax audit-unlearning --from ...`` (unlearning, unlearning_control), ``mia-jax window-metrics
  results/audits/concat/<run> --data results/audits/concat/contam.jsonl`` (its table into ``<run>.windows.md``), and
  ``results/audits.md`` from its template ``results/audits/README.md`` (``mia_jax.audits.overview_report``);
- the detectors: ``python scripts/detectors.py --from`` every folder of ``DETECTORS`` below ``--header
  results/detectors/README.md --md results/detectors.md`` (the command printed at the top of that README).

``--seeds N`` runs the same steps in a temporary copy while recording every Holm family of comparisons
(:mod:`mia_jax.evaluation.verdict_log`), recomputes each family under N other bootstrap seeds (each comparison at its
first count of resamples, more near the threshold, as in the build) and prints every verdict that changes with the seed;
it exits 1 if any does.

``--check`` runs the same steps in a temporary copy of results/ and compares every file with the committed one; the
only differences allowed are the records of the rebuild itself (the ``rebuilt`` key of the audits' info.json /
unlearning.json, hence their entry in the folder's manifest.json). It prints each file that differs and exits 1
if any does (0 when every file is the same).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import shutil
import sys
import tempfile
from pathlib import Path

from mia_jax.evaluation import comparisons, verdict_log
from mia_jax.runs import entry, files
from mia_jax.audits import overview_report
from mia_jax.audits.concat import window_metrics, window_metrics_markdown
from mia_jax.cli import main as cli_main
from train import study
from train.ablations import ABLATIONS

PROG = "python scripts/build_results.py"
REPO = Path(__file__).resolve().parents[1]
CONTAMINATION = "results/contamination"
# every ablation's committed sweep (results/contamination/NAME, when that folder exists), in the registry's order;
# the same sweep on other models beside it
OTHER_MODELS = {"lr": ["gemma-lr"]}
SWEEPS = {kind: [kind, *OTHER_MODELS.get(kind, [])] for kind in ABLATIONS}
DETECTORS = ["results/detectors/wikimia32", "results/detectors/wikimia32-2025", "results/detectors/wikimia32-gemma",
             "results/detectors/wikimia32-gemma-2025", "results/detectors/mimir-smollm2",
             "results/detectors/mimir-smollm2-2025", "results/detectors/mimir-smollm2-infilling",
             "results/detectors/mimir-gemma", "results/detectors/mimir-gemma-2025",
             "results/detectors/mimir-gemma-ngram", "results/detectors/mimir-gemma-infilling",
             "results/detectors/mimir-gemma-infilling-40", "results/detectors/contamination",
             "results/detectors/contamination-sample"]
AUDITS = [("audit-books", "books"), ("audit-books", "books_control"), ("audit-unlearning", "unlearning"),
          ("audit-unlearning", "unlearning_control")]
META = {"info.json", "unlearning.json"}  # an audit's record of itself: equal but for its "rebuilt" key
WINDOW_RUNS = ("contam-trained", "contam-base")


def _script_main(name: str):
    """``main`` of scripts/NAME.py (loaded as a module, not run as a program)."""
    return runpy.run_path(str(REPO / "scripts" / f"{name}.py"), run_name=f"_script_{name}")["main"]


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} exited with status {status}")


def study_argv() -> list[str]:
    """The arguments of ``python -m train.study`` over every committed sweep (the traps sweep when present)."""
    argv = []
    for kind, names in SWEEPS.items():
        folders = [f"{CONTAMINATION}/{n}" for n in names if Path(CONTAMINATION, n).is_dir()]
        if folders:
            argv += [f"--{kind}", *folders]
    return argv + ["--header", f"{CONTAMINATION}/README.md", "--out", "results/contamination.md"]


def _contamination() -> None:
    _check(study.main(study_argv()), "train.study")


def _wikimia() -> None:
    src = "results/wikimia_reproduction"
    _check(_script_main("reproduce_wikimia")(["--from", src, "--out", src]), "reproduce_wikimia")


def _audits() -> None:
    for command, audit in AUDITS:
        src = f"results/audits/{audit}"
        _check(cli_main([command, "--from", src, "--out", src]), command)


def _detectors() -> None:
    _check(_script_main("detectors")(["--from", *DETECTORS, "--header", "results/detectors/README.md",
                                      "--md", "results/detectors.md"]), "detectors")


def _windows_and_overview() -> None:
    concat = Path("results/audits/concat")
    reps = {run: window_metrics(concat / run, concat / "contam.jsonl") for run in WINDOW_RUNS}
    outputs = {f"{run}.windows.md": window_metrics_markdown(rep) + "\n" for run, rep in reps.items()}
    template = Path("results/audits/README.md").read_text(encoding="utf-8")
    overview = overview_report.render(template, Path("results/audits"), reps)
    files.write_all(concat, outputs)
    files.write_all(Path("results"), {"audits.md": overview})


STEPS = {"contamination study (train.study)": _contamination, "WikiMIA reproduction": _wikimia,
         "audits (--from)": _audits, "detectors": _detectors, "audits.md and window-metrics": _windows_and_overview}


def build(logs: dict | None = None) -> None:
    """Every step, in place, in the current folder (a repository root, or a copy holding its results/); with
    ``logs`` ({}), each step's verdicts recorded there (:mod:`mia_jax.evaluation.verdict_log`) under its name."""
    for name, step in STEPS.items():
        with contextlib.redirect_stdout(io.StringIO()), \
                (verdict_log.recording() if logs is not None else contextlib.nullcontext()) as log:
            step()
        if logs is not None:
            logs[name] = log


def seed_audit(log: dict, offsets: range) -> tuple[int, list[str], list[str]]:
    """Every Holm family of ``log`` recomputed with each seed offset (each comparison redone at its first count of
    resamples with the seed + offset, then Holm over the family again, resampling more near the threshold as the
    build does): (verdicts, [a line per verdict that changes under some offset: another verdict stated], [a line per
    verdict undecided under some seeds but not others, which no seed contradicts: ``comparisons.consistent``])."""
    cache: dict = {}
    done, n, changed, undecided = set(), 0, [], []
    for key, alpha, comps in log["families"]:
        ident = (key, tuple(id(c) for c in comps))
        if ident in done:  # a family corrected twice (idempotent) is one family
            continue
        done.add(ident)
        again = []
        for k in offsets:
            for c in comps:
                if (id(c), k) not in cache:  # a comparison in two families (AUROC and TPR) is redone once
                    cache[(id(c), k)] = c.redo(c["n_bootstrap"], c["seed"] + k)
            new = [cache[(id(c), k)] for c in comps]
            comparisons.holm_adjust(new, key, alpha)
            again.append([c[key]["verdict"] for c in new])
        for i, c in enumerate(comps):
            n += 1
            seen = [c[key]["verdict"], *(v[i] for v in again)]
            line = (f"{seen[0]} -> {', '.join(seen[1:])} (a family of {len(comps)}): "
                    + comparisons.describe(c, "A", "B", key=key, label=key))
            if any(not comparisons.consistent(v, w) for v in seen for w in seen):
                changed.append(line)
            elif len(set(seen)) > 1:
                undecided.append(line)
    return n, changed, undecided


def build_in(folder: Path, logs: dict | None = None) -> None:
    """Every step (:func:`build`, recording into ``logs`` when given) run with ``folder`` (holding a results/) as
    the working folder, which is restored after."""
    here = Path.cwd()
    os.chdir(folder)
    try:
        build(logs)
    finally:
        os.chdir(here)


def seeds_report(n_seeds: int) -> tuple[str, int]:
    """The build run in a temporary copy while recording, then every table's verdicts re-tested under ``n_seeds``
    other seeds: (a markdown report, not a committed file; the number of verdicts that change with the seed)."""
    logs: dict = {}
    with tempfile.TemporaryDirectory(prefix="build_results_") as tmp:
        shutil.copytree(REPO / "results", Path(tmp) / "results")
        build_in(Path(tmp), logs)
    lines = [f"# Verdicts of every committed table under {n_seeds} other bootstrap seeds\n"]
    n_changed = 0
    for name, log in logs.items():
        n, changed, undecided = seed_audit(log, range(1, n_seeds + 1))
        n_changed += len(changed)
        lines.append(f"- {name}: {n - len(changed)} of {n} verdicts the same under every other seed"
                     + "".join(f"\n  - changes: {line}" for line in changed)
                     + (f"; {len(undecided)} of them undecided under some seeds only (no seed states another "
                        "verdict)" if undecided else "")
                     + "".join(f"\n  - undecided under some seeds: {line}" for line in undecided))
    return "\n".join(lines) + "\n", n_changed


def _without(data: bytes, key: str) -> dict:
    obj = json.loads(data)
    obj.pop(key, None)
    return obj


def _same(rel: Path, new: bytes, old: bytes) -> bool:
    """Whether a rebuilt file equals the committed one (an audit's record of itself but for its rebuild record)."""
    if new == old:
        return True
    if rel.name in META:
        return _without(new, "rebuilt") == _without(old, "rebuilt")
    if rel.name == "manifest.json" and rel.parent.parent.name == "audits":
        new_files, old_files = (json.loads(d)["files"] for d in (new, old))
        return ({k: v for k, v in new_files.items() if k not in META} ==
                {k: v for k, v in old_files.items() if k not in META} and set(new_files) == set(old_files))
    return False


def differences(rebuilt: Path, committed: Path) -> list[str]:
    """The files under ``rebuilt`` and ``committed`` (two results/ folders) that differ, or that one lacks."""
    a = {p.relative_to(rebuilt) for p in rebuilt.rglob("*") if p.is_file()}
    b = {p.relative_to(committed) for p in committed.rglob("*") if p.is_file()}
    out = [f"{rel}: only in the rebuild" for rel in sorted(a - b)]
    out += [f"{rel}: not rebuilt" for rel in sorted(b - a)]
    out += [f"{rel}: differs" for rel in sorted(a & b)
            if not _same(rel, (rebuilt / rel).read_bytes(), (committed / rel).read_bytes())]
    return out


def check() -> list[str]:
    """Every step run in a temporary copy of results/; the files that differ from the committed ones."""
    with tempfile.TemporaryDirectory(prefix="build_results_") as tmp:
        shutil.copytree(REPO / "results", Path(tmp) / "results")
        build_in(Path(tmp))
        return differences(Path(tmp) / "results", REPO / "results")


def build_parser() -> entry.ArgumentParser:
    """The parser of ``python scripts/build_results.py``: --seeds N, --check."""
    p = entry.ArgumentParser(prog=PROG, description="Rebuild every committed file under results/ from the committed "
                             "per-example files (no model needed), or check that the committed ones are so.")
    p.add_argument("--seeds", type=entry.positive_int, metavar="N",
                   help="instead: rebuild a temporary copy, re-test every table's verdicts (each Holm family) under "
                        "N other bootstrap seeds and print which change (exit 1 if any does; nothing under results/ "
                        "is written)")
    p.add_argument("--check", action="store_true",
                   help="rebuild a temporary copy and compare it with the committed files byte for byte "
                        "(exit 1 when a file differs); nothing under results/ is written")
    return p


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.seeds:
        text, n_changed = seeds_report(args.seeds)
        print(text)
        print(f"{n_changed} verdict(s) change with the seed" if n_changed else
              f"no verdict changes under {args.seeds} other seeds", file=sys.stderr)
        return 1 if n_changed else 0
    if args.check:
        diff = check()
        for line in diff:
            print(line)
        print(f"{len(diff)} file(s) differ" if diff else "every file under results/ rebuilds byte for byte",
              file=sys.stderr)
        return 1 if diff else 0
    build_in(REPO)
    print("rebuilt results/", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    """Runs the command with ``argv`` (default: sys.argv[1:]); returns the exit status."""
    return entry.run(PROG, _main, argv, resume_hint="run the same command again (each step writes all its files or "
                     "none)")


if __name__ == "__main__":
    sys.exit(main())
