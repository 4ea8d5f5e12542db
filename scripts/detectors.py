"""Every registered detector on one benchmark, with what it costs: per-example scores, AUROC / TPR@5%FPR with 95%
bootstrap intervals, the paired bootstrap against Min-K%++ on the same examples, the blind baseline, and a cost
table (forward / backward passes per text, seconds, tokens/s on this machine).

    python scripts/detectors.py --model smollm2 --wikimia 32 --out runs/detectors/wikimia32
    python scripts/detectors.py --model RUN/lr_0.0001/model --eval RUN/lr_0.0001/corpus/eval.jsonl \\
        --ref-model smollm2 --out runs/detectors/contamination      # a contamination run's trained model
    python scripts/detectors.py --from runs/detectors/wikimia32 runs/detectors/contamination --md results/detectors.md

A few texts of each (dataset, label) are held out as the prefix shots of ReCaLL / Con-ReCaLL (`--shots`, seeded)
and every method is evaluated on the rest, so all methods are compared on the same examples and no shot is an
evaluated text. DC-PDD's frequency table is counted with the model's tokenizer on the bundled Pile sample. The
single-pass methods share one forward pass (one group, one time); each multi-pass method is timed alone
(its main pass included).

``--out`` is claimed with the run's description (`config.json`: the model's and the eval data's files by SHA-256,
the evaluated texts, seed, shots, every option that can change a score) and a lock: the same command again resumes
the run, one with other options is refused with the differences (``--overwrite`` replaces the folder), a second
process on the same folder is refused with the first one's PID. Every input is checked before anything is loaded
or written. The run ends by sealing what a rebuild reads (`manifest.json`); ``--from`` checks each folder's files
against it before reading them, and writes ``--md`` only once every section is computed. The run and the command
are here; the report, built from a folder's sealed files alone, is ``detectors_report.py`` beside this file.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from mia_jax.evaluation import blind
from mia_jax import data, models
from mia_jax.data import known
from mia_jax.runs import entry, files, rundir
from mia_jax.engine import runner
from mia_jax.commands import options
from mia_jax.errors import UserError
from mia_jax.evaluation.report import nonfinite_warning
from mia_jax.scorers import MULTI_PASS, REGISTRY
from mia_jax.methods import recall as rc

sys.path.insert(0, str(Path(__file__).resolve().parent))  # detectors_report beside this file
from detectors_report import BASELINE, EXAMPLES, SEALED, all_methods, section, write_report  # noqa: E402

PROG = "python scripts/detectors.py"
RESUME_HINT = "run the same command again to resume"
NEEDS_REF = ("ref",)
BACKWARD = ("gradnorm",)  # pass kinds with a backward pass
EVAL_FIELDS = ("text", "label", "dataset")

# Options left out of the run's fingerprint, and why (every other option is in it).
NOT_IN_FINGERPRINT = {
    "model": "identified by its files' SHA-256 (model_files): a name and a path to the same files agree",
    "ref_model": "identified by its files' SHA-256 (ref_model_files)",
    "wikimia": "chooses the data file (data_files) and the texts (texts_sha256)",
    "mimir": "chooses the data files (data_files) and the texts (texts_sha256)",
    "eval": "the file by resolved path and SHA-256 (data_files), its texts (texts_sha256)",
    "data_dir": "where --eval tfds:... is read: its files by resolved path and SHA-256 (data_files)",
    "src": "--from: a rebuild, not a run",
    "n_bootstrap": "the report only: recomputed from the per-example scores",
    "out": "the folder itself",
    "overwrite": "decides what happens to the folder, not what it holds",
    "md": "where the report goes",
    "header": "the report only",
    "no_progress": "display only",
}


def _eval_rows(path: Path) -> tuple[list[str], list[int], list[str]]:
    """The texts, labels and datasets of an eval JSONL (one {"text", "label", "dataset"} object a line); a
    UserError naming the line for anything else."""
    texts, labels, groups = [], [], []
    for n, row in files.read_jsonl(path, f"--eval {path}"):
        if not isinstance(row, dict):
            raise UserError(f"--eval {path}, line {n}: a JSON {type(row).__name__}, expected an object with "
                            f"{', '.join(EVAL_FIELDS)}")
        missing = [f for f in EVAL_FIELDS if f not in row]
        if missing:
            raise UserError(f"--eval {path}, line {n}: no {', '.join(repr(f) for f in missing)} field (each line "
                            f"needs {', '.join(EVAL_FIELDS)})")
        text, label, group = row["text"], row["label"], row["dataset"]
        if not isinstance(text, str):
            raise UserError(f"--eval {path}, line {n}: 'text' is a {type(text).__name__}, not a string")
        if isinstance(label, str) or not isinstance(label, (int, float)) or label not in (0, 1):
            raise UserError(f"--eval {path}, line {n}: 'label' must be 0 (non-member) or 1 (member), got {label!r}")
        if not isinstance(group, str) or not group:
            raise UserError(f"--eval {path}, line {n}: 'dataset' must be a non-empty string, got {group!r}")
        texts.append(text)
        labels.append(int(label))
        groups.append(group)
    if not texts:
        raise UserError(f"--eval {path} holds no texts (one JSON object a line: {', '.join(EVAL_FIELDS)})")
    return texts, labels, groups


def load_eval(args) -> tuple[list[str], list[int], list[str], str, dict]:
    """texts, labels, datasets, the benchmark's name and its data files (path -> SHA-256)."""
    if args.wikimia:
        ds = data.wikimia(args.wikimia)
        return ds.texts, ds.labels, [ds.name] * len(ds), ds.name, ds.files
    if args.mimir:  # one group per domain: members (Pile train) then non-members (Pile test)
        parts = [known.mimir(domain, root=args.data_dir) for domain in dict.fromkeys(args.mimir)]
        return ([t for ds in parts for t in ds.texts], [y for ds in parts for y in ds.labels],
                [ds.name for ds in parts for _ in ds.texts], f"mimir-{known.MIMIR_SPLIT}",
                {f: h for ds in parts for f, h in ds.files.items()})
    if str(args.eval).startswith("tfds:"):  # a TFDS dataset: its text (or input) and label features, one group
        ds = data.load(args.eval, args.data_dir)
        return ds.texts, ds.labels, [ds.name] * len(ds), ds.name, ds.files
    path = Path(args.eval)
    texts, labels, groups = _eval_rows(path)
    return texts, labels, groups, args.name, {str(path.resolve()): files.sha256(path)}


def hold_out(labels, groups, per_cell: int, seed: int) -> np.ndarray:
    """Boolean mask of ``per_cell`` texts of each (group, label), seeded (the ReCaLL shots; the --per-cell sample)."""
    rng = np.random.default_rng(seed)
    shot = np.zeros(len(labels), bool)
    for cell in sorted(set(zip(groups, labels))):
        idx = [i for i, c in enumerate(zip(groups, labels)) if c == cell]
        shot[rng.permutation(idx)[:per_cell]] = True
    return shot


def _check_cells(labels, groups, shots: int, where: str) -> None:
    """Every dataset has members and non-members, and more of each than the shots held out of them."""
    for group in sorted(set(groups)):
        for label, what in ((1, "members (label 1)"), (0, "non-members (label 0)")):
            n = sum(1 for g, y in zip(groups, labels) if g == group and y == label)
            if n == 0:
                raise UserError(f"{where}: dataset {group!r} has no {what}; every dataset needs both")
            if n <= shots:
                raise UserError(f"{where}: dataset {group!r} has {n} {what}, and --shots {shots} holds that many "
                                "out as ReCaLL shots, leaving none to evaluate; lower --shots")


def method_groups(methods: list[str]) -> list[tuple[str, list[str]]]:
    """The single-pass methods (one shared pass), then the multi-pass methods grouped by the passes they read
    (gradnorm_l1/l2/linf: one gradient pass; samia / samia_zlib: one sampling pass)."""
    single = [m for m in methods if m.split("@")[0] in REGISTRY]
    groups: dict[tuple, list[str]] = {}
    for m in methods:
        if m in MULTI_PASS:
            groups.setdefault(MULTI_PASS[m].kinds, []).append(m)
    return [("single-pass", single)] + [("+".join(ms), ms) for ms in groups.values()]


def cost_of(out_dir: Path, n_texts: int, seconds: float, report: dict, methods: list[str]) -> dict:
    """Passes per text and tokens/s of one group's run from its pass files and the runner's counts (a pass record's
    ``extra_forwards``: the forwards it ran beyond its text's, e.g. infilling's changed texts)."""
    tokens, forward = 0, 0
    for name, counts in report.items():
        path = out_dir / "passes" / f"{name}.jsonl"
        recs = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        tokens += sum(r.get("n_tokens", 0) for r in recs if "skip_reason" not in r)
        forward += counts.get("texts", 0) - counts.get("skipped", 0)
        # a pass that reads more texts than its own (infilling's changed texts) counts them per record
        forward += sum((r.get("scores") or {}).get("extra_forwards") or 0 for r in recs if "skip_reason" not in r)
    backward = sum(report.get(k, {}).get("texts", 0) for k in BACKWARD)
    return {"methods": methods, "seconds": round(seconds, 1), "texts": n_texts,
            "forward_per_text": round(forward / n_texts, 2), "backward_per_text": round(backward / n_texts, 2),
            "tokens": tokens, "tokens_per_second": round(tokens / seconds, 1) if seconds else None,
            "computed": {k: v.get("computed", 0) for k, v in report.items()}}


def _check_skip(skip: list[str]) -> None:
    known = all_methods()
    for m in skip:
        if m not in known:
            raise UserError(f"--skip {m}: not a method of this benchmark; the methods are {', '.join(known)}")
    if BASELINE in skip:
        raise UserError(f"--skip {BASELINE}: every method is compared with it; it cannot be left out")


def _score_groups(args, out: Path, loaded, ref, gen, methods, e_texts, e_labels, prefixes) -> tuple[dict, set, Path]:
    """Each group of ``method_groups(methods)`` scored into ``out/runs/GROUP`` (resumed from its pass files), timed
    into ``cost.json`` only when it ran whole; returns the scores by method and text, the evaluated texts whose logits
    were NaN or infinite (in any group's passes) and the path of ``cost.json`` (absent when no group was timed)."""
    from mia_jax.methods import freq

    table_path = out / "freq_table.npz"
    if not table_path.exists():
        corpus = data.load_records(freq.default_corpus(), "text", None)
        freq.FreqTable.from_texts(loaded.tokenizer, corpus.texts, name=loaded.name,
                                  corpus_files=corpus.files).save(table_path)
    resources = {"freq_table": freq.for_model(table_path, loaded)}
    cost_path = out / "cost.json"
    cost = json.loads(cost_path.read_text()) if cost_path.exists() else {}
    records: dict[str, dict] = {}
    broken: set[int] = set()
    for group, ms in method_groups(methods):
        folder = out / "runs" / group
        report: dict = {}
        t0 = time.perf_counter()
        recs = runner.score_dataset(loaded, e_texts, ms, ref=ref, neighbors=gen, labels=e_labels, out_dir=folder,
                                    resume=True,
                                    batch_size=args.batch_size, progress=not args.no_progress, report=report,
                                    resources=resources, pass_options={"recall_prefixes": prefixes,
                                                  "samia": {"n_samples": args.samia_samples}})
        seconds = time.perf_counter() - t0
        if group not in cost or any(c.get("computed") for c in report.values()):  # timed only when it ran whole
            if all(c.get("reused", 0) == 0 for c in report.values()):
                cost[group] = cost_of(folder, len(e_texts), seconds, report, ms)
                cost_path.write_text(json.dumps(cost, indent=2) + "\n")
        for m in ms:
            records[m] = {i: r["scores"][m] for i, r in enumerate(recs)}
        broken.update(runner.nonfinite_texts(recs))
        print(f"{group}: {seconds:.1f} s", file=sys.stderr, flush=True)
        entry.check_interrupted()
    return records, broken, cost_path


def run(args, command: str) -> Path:
    """Score every method into ``args.out`` (validated and claimed first); returns the folder."""
    from mia_jax.methods import neighbors as nb

    _check_skip(args.skip)
    models.resolve_model(args.model)  # a missing model: one line before any data is read
    if args.ref_model:
        models.resolve_model(args.ref_model)
    texts, labels, groups, name, data_files = load_eval(args)
    _check_cells(labels, groups, args.shots, f"--eval {args.eval}" if args.eval else name)
    shot = hold_out(labels, groups, args.shots, args.seed)
    ev = [i for i in range(len(texts)) if not shot[i]]
    if args.per_cell:  # a stratified sample of the rest: N of each (dataset, label), seeded; shots as without it
        sub = hold_out([labels[i] for i in ev], [groups[i] for i in ev], args.per_cell, args.seed + 1)
        ev = [i for i, keep in zip(ev, sub) if keep]
    e_texts, e_labels, e_groups = [texts[i] for i in ev], [labels[i] for i in ev], [groups[i] for i in ev]
    prefixes = rc.prefix_shots([texts[i] for i in np.flatnonzero(shot)], [labels[i] for i in np.flatnonzero(shot)],
                               e_texts, n_shots=args.n_shots, seed=args.seed)
    out = entry.check_out(args.out)

    loaded = models.load(args.model)
    ref = models.load(args.ref_model) if args.ref_model else None
    gen = nb.SelfNeighbors(loaded, n=args.n_neighbors, seed=0, batch_size=args.batch_size)
    methods = [m for m in all_methods() if m not in args.skip and (ref is not None or m not in NEEDS_REF)]
    # everything that can change a score or info.json (see NOT_IN_FINGERPRINT for the rest); --batch-size sets the
    # rows per step of the gradient pass and of the neighbour generation: other shapes, other float rounding
    fingerprint = runner.run_fingerprint(
        loaded, e_texts, e_labels, methods, ref=ref, neighbors=gen, data_files=data_files,
        name=name, datasets_sha256=hashlib.sha256(json.dumps(e_groups).encode("utf-8")).hexdigest(),
        seed=args.seed, shots=args.shots, n_shots=args.n_shots, per_cell=args.per_cell,
        skip=sorted(args.skip), n_neighbors=args.n_neighbors, samia_samples=args.samia_samples,
        batch_size=args.batch_size, tokens_per_batch=runner.default_tokens_per_batch(), dtype=loaded.dtype,
        recall_prefixes=rc.prefix_digest(prefixes))
    with rundir.claim(out, fingerprint, overwrite=args.overwrite, inputs=[args.model, args.ref_model, args.eval,
                      args.header, *data_files, loaded.source, *loaded.files, *(ref.files if ref else ())]) as resume:
        if resume:
            print(f"resuming the run in {out}", file=sys.stderr, flush=True)
        records, broken, cost_path = _score_groups(args, out, loaded, ref, gen, methods, e_texts, e_labels, prefixes)
        blind_scores = blind.blind_bow_scores(e_texts, e_labels, seed=args.seed)
        rows = [{"index": ev[j], "label": e_labels[j], "dataset": e_groups[j],
                 "text_sha256": hashlib.sha256(e_texts[j].encode("utf-8")).hexdigest(),
                 "blind": float(blind_scores[j]), "scores": {m: records[m][j] for m in methods}}
                for j in range(len(ev))]
        files.write_jsonl_gz(out / EXAMPLES, rows)
        info = {"name": name, "model": loaded.name, "model_files": loaded.files,
                "ref_model": ref.name if ref else None,
                "n_texts": len(texts), "n_evaluated": len(ev), "n_shots_held_out": int(shot.sum()),
                "per_cell": args.per_cell,
                "shots_per_prefix": args.n_shots, "seed": args.seed,
                "n_neighbors": args.n_neighbors, "samia_samples": args.samia_samples, "methods": methods,
                "command": command,
                "recall_prefixes": rc.prefix_digest(prefixes)}
        if broken:  # only then: the committed runs' info.json stay as they were
            info["nonfinite_logits"] = sorted(broken)
            print(nonfinite_warning(info["nonfinite_logits"]), file=sys.stderr, flush=True)
        (out / "info.json").write_text(json.dumps(info, indent=2) + "\n")
        if not cost_path.exists():  # no group to time (all reused from an earlier run that had none): still sealed
            cost_path.write_text(json.dumps({}, indent=2) + "\n")
        rundir.seal(out, SEALED)
    return out


# ----------------------------------------------------------------------------- the command


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="a model folder, a .gguf file or a packaged name (smollm2)")
    ap.add_argument("--ref-model", help="reference model for 'ref' (left out without one)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--wikimia", type=entry.positive_int, help="WikiMIA length (32, 64, 128 or 256)")
    src.add_argument("--eval", type=data.data_input,
                     help="a contamination run's corpus/eval.jsonl (text, label, dataset), or a labeled TFDS dataset "
                          "tfds:NAME[/CONFIG][:SPLIT] built in --data-dir (text or input, label)")
    src.add_argument("--mimir", nargs="+", metavar="DOMAIN", choices=known.MIMIR_DOMAINS,
                     help=f"MIMIR's {known.MIMIR_SPLIT} split of these Pile domains (one dataset each), read from "
                          "--data-dir")
    options.data_dir(ap)
    src.add_argument("--from", dest="src", nargs="+",
                     type=entry.source_dir("detectors", example="results/detectors/wikimia32"),
                     help="rebuild the report from these folders")
    ap.add_argument("--name", default="contamination", help="the benchmark's name with --eval")
    ap.add_argument("--shots", type=entry.positive_int, default=5,
                    help="texts held out per (dataset, label) as ReCaLL shots")
    ap.add_argument("--n-shots", type=entry.positive_int, default=5, help="shots per ReCaLL prefix")
    ap.add_argument("--skip", nargs="*", default=[], help="methods to leave out")
    ap.add_argument("--seed", type=entry.nonneg_int, default=0)
    ap.add_argument("--n-neighbors", type=entry.positive_int, default=10,
                    help="neighbours per text of 'neighbor' (default 10)")
    ap.add_argument("--samia-samples", type=entry.positive_int, default=10,
                    help="sampled continuations per text of SaMIA (10)")
    ap.add_argument("--per-cell", type=entry.positive_int,
                    help="evaluate only N texts of each (dataset, label), a seeded sample (the shots are held out "
                         "first, as without it)")
    ap.add_argument("--batch-size", type=entry.positive_int, default=8)
    ap.add_argument("--n-bootstrap", type=entry.positive_int, default=1000)
    ap.add_argument("--out", type=entry.out_dir, help="output folder (the same command again resumes the run)")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the run in --out when it holds one with other options instead of refusing it (never "
                         "a folder holding an input, one inside a run or a folder of anything else)")
    ap.add_argument("--md", type=entry.out_file, help="also write the report there (once all of it is computed)")
    ap.add_argument("--header", type=entry.input_file, help="a markdown file put before the sections")
    ap.add_argument("--no-progress", action="store_true")
    return ap



def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.src:
        if args.out:
            raise UserError("--out goes with a run (--wikimia, --mimir or --eval), not with --from; use --md for the "
                            "report")
        text = "\n".join(section(f, args.n_bootstrap) for f in args.src)  # all computed before anything is written
        write_report(args, text)
        return 0
    if not args.out or not (args.wikimia or args.eval or args.mimir):
        raise UserError("give --wikimia N, --mimir DOMAIN ... or --eval FILE, and --out DIR (or --from DIR ...)")
    command = " ".join(["scripts/detectors.py", *(sys.argv[1:] if argv is None else argv)])
    out = run(args, command)
    write_report(args, section(out, args.n_bootstrap))
    return 0


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv, resume_hint=RESUME_HINT)


if __name__ == "__main__":
    sys.exit(main())
