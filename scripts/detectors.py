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
(its main pass included). Each group's run folder is resumable: rerun the same command to continue.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from mia_jax import blind, data, files, metrics, models, runner
from mia_jax.errors import UserError
from mia_jax.report import markdown
from mia_jax.scorers import MULTI_PASS, REGISTRY, expand_methods
from mia_jax.scorers import recall as rc

BASELINE = "min_k_pp@0.2"
EXAMPLES = "examples.jsonl.gz"
NEEDS_REF = ("ref",)
BACKWARD = ("gradnorm",)  # pass kinds with a backward pass


def load_eval(args) -> tuple[list[str], list[int], list[str], str]:
    if args.wikimia:
        ds = data.wikimia(args.wikimia)
        return ds.texts, ds.labels, [ds.name] * len(ds), ds.name
    rows = [json.loads(line) for line in Path(args.eval).read_text().splitlines() if line.strip()]
    return [r["text"] for r in rows], [int(r["label"]) for r in rows], [r["dataset"] for r in rows], args.name


def hold_out(labels, groups, per_cell: int, seed: int) -> np.ndarray:
    """Boolean mask of ``per_cell`` texts of each (group, label), seeded (the ReCaLL shots; the --per-cell sample)."""
    rng = np.random.default_rng(seed)
    shot = np.zeros(len(labels), bool)
    for cell in sorted(set(zip(groups, labels))):
        idx = [i for i, c in enumerate(zip(groups, labels)) if c == cell]
        shot[rng.permutation(idx)[:per_cell]] = True
    return shot


def _all_methods() -> list[str]:
    """Every registered method, single- and multi-pass (k = 20% where a method takes k)."""
    return expand_methods(sorted({*REGISTRY, *MULTI_PASS}), [0.2])


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
    """Passes per text and tokens/s of one group's run from its pass files and the runner's counts."""
    tokens, forward = 0, 0
    for name, counts in report.items():
        path = out_dir / "passes" / f"{name}.jsonl"
        recs = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        tokens += sum(r.get("n_tokens", 0) for r in recs if "skip_reason" not in r)
        forward += counts.get("texts", 0) - counts.get("skipped", 0)
    backward = sum(report.get(k, {}).get("texts", 0) for k in BACKWARD)
    return {"methods": methods, "seconds": round(seconds, 1), "texts": n_texts,
            "forward_per_text": round(forward / n_texts, 2), "backward_per_text": round(backward / n_texts, 2),
            "tokens": tokens, "tokens_per_second": round(tokens / seconds, 1) if seconds else None,
            "computed": {k: v.get("computed", 0) for k, v in report.items()}}


def run(args) -> Path:
    from mia_jax import freq

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    texts, labels, groups, name = load_eval(args)
    shot = hold_out(labels, groups, args.shots, args.seed)
    ev = [i for i in range(len(texts)) if not shot[i]]
    if args.per_cell:  # a stratified sample of the rest: N of each (dataset, label), seeded; shots as without it
        sub = hold_out([labels[i] for i in ev], [groups[i] for i in ev], args.per_cell, args.seed + 1)
        ev = [i for i, keep in zip(ev, sub) if keep]
    e_texts, e_labels, e_groups = [texts[i] for i in ev], [labels[i] for i in ev], [groups[i] for i in ev]
    from mia_jax import neighbors as nb

    loaded = models.load(args.model)
    ref = models.load(args.ref_model) if args.ref_model else None
    gen = nb.SelfNeighbors(loaded, n=args.n_neighbors, seed=0, batch_size=args.batch_size)
    table_path = out / "freq_table.npz"
    if not table_path.exists():
        corpus = data.load_records(freq.default_corpus(), "text", None)
        freq.FreqTable.from_texts(loaded.tokenizer, corpus.texts, name=loaded.name,
                                  corpus_files=corpus.files).save(table_path)
    resources = {"freq_table": freq.for_model(table_path, loaded)}
    prefixes = rc.prefix_shots([texts[i] for i in np.flatnonzero(shot)], [labels[i] for i in np.flatnonzero(shot)],
                               e_texts, n_shots=args.n_shots, seed=args.seed)
    methods = [m for m in _all_methods() if m not in args.skip and (ref is not None or m not in NEEDS_REF)]
    cost_path = out / "cost.json"
    cost = json.loads(cost_path.read_text()) if cost_path.exists() else {}
    records: dict[str, dict] = {}
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
        print(f"{group}: {seconds:.1f} s", file=sys.stderr, flush=True)
    blind_scores = blind.blind_bow_scores(e_texts, e_labels, seed=args.seed)
    rows = [{"index": ev[j], "label": e_labels[j], "dataset": e_groups[j],
             "text_sha256": hashlib.sha256(e_texts[j].encode("utf-8")).hexdigest(), "blind": float(blind_scores[j]),
             "scores": {m: records[m][j] for m in methods}} for j in range(len(ev))]
    files.write_jsonl_gz(out / EXAMPLES, rows)
    info = {"name": name, "model": loaded.name, "model_files": loaded.files, "ref_model": ref.name if ref else None,
            "n_texts": len(texts), "n_evaluated": len(ev), "n_shots_held_out": int(shot.sum()),
            "per_cell": args.per_cell,
            "shots_per_prefix": args.n_shots, "seed": args.seed,
            "n_neighbors": args.n_neighbors, "samia_samples": args.samia_samples, "methods": methods,
            "command": " ".join(sys.argv),
            "recall_prefixes": rc.prefix_digest(prefixes)}
    (out / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


# ----------------------------------------------------------------------------- the report, from the files alone


def _vec(rows, m):
    return np.array([np.nan if r["scores"].get(m) is None else r["scores"][m] for r in rows], np.float64)


def _ci(x, ci) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{x:.3f}"


def _model_label(info) -> str:
    """The model's name, or for a folder named like the generic "model" its parent folder too (contam-lr4/model)."""
    paths = [Path(f) for f in info.get("model_files") or {}]
    if info["model"] == "model" and paths and paths[0].parent.name == "model":
        return f"{paths[0].parent.parent.name}/{info['model']}"
    return info["model"]


def section(folder: Path, n_bootstrap: int = 1000) -> str:
    info = json.loads((folder / "info.json").read_text())
    cost = json.loads((folder / "cost.json").read_text())
    rows = files.read_jsonl_gz(folder / EXAMPLES)
    labels = np.array([r["label"] for r in rows])
    groups = [r["dataset"] for r in rows]
    several = len(set(groups)) > 1
    seed = info["seed"]
    table = []
    for m in [*info["methods"], "blind"]:
        v = np.array([r["blind"] for r in rows]) if m == "blind" else _vec(rows, m)
        try:
            if several:
                res = metrics.evaluate_mean(labels, v, groups, n_bootstrap=n_bootstrap, seed=seed)
            else:
                res = metrics.evaluate(labels, v, n_bootstrap=n_bootstrap, seed=seed)
        except ValueError as e:  # e.g. every text skipped (Lowercase on lower-case texts): a row saying so
            table.append([m, f"n/a ({e})", "n/a", "n/a", str(int(np.isnan(v).sum()))])
            continue
        if m == "blind" or m == BASELINE:
            vs = "—"
        else:
            try:
                c = metrics.paired_bootstrap(labels, v, _vec(rows, BASELINE), groups=groups if several else None,
                                             n_bootstrap=n_bootstrap, seed=seed)["auroc"]
                vs = f"{c['diff']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}] {c['verdict'].replace('A', m)}"
                vs = vs.replace("B", "Min-K%++")
            except ValueError as e:
                vs = f"n/a ({e})"
        name = "Blind BoW (no model)" if m == "blind" else m + (" (oracle)" if m == "ref" else "")
        table.append([name, _ci(res["auroc"], res.get("auroc_ci")),
                      _ci(res["tpr_at_5pct_fpr"], res.get("tpr_at_5pct_fpr_ci")), vs, str(res.get("n_nan", 0))])
    avg = " (mean over datasets, resampled within each)" if several else ""
    text = [f"## {info['name']}" + (" (sample)" if info.get("per_cell") else "") + f": {_model_label(info)}\n",
            f"{info['n_evaluated']} texts evaluated"
            + (f" (a seeded sample of {info['per_cell']} per dataset and label)" if info.get("per_cell") else "")
            + f" ({info['n_shots_held_out']} held out as ReCaLL shots, {info['shots_per_prefix']} per prefix"
            + (f"; Neighbor with {info.get('n_neighbors', 10)} neighbours" if "neighbor" in info["methods"] else "")
            + (f"; SaMIA with {info.get('samia_samples', 10)} sampled continuations per text"
               if "samia" in info["methods"] else "")
            + f"). Not run: {', '.join(m for m in _all_methods() if m not in info['methods']) or 'none'}. "
            f"AUROC and TPR@5%FPR{avg} with 95% bootstrap intervals; the last "
            f"column is the paired bootstrap of the method minus Min-K%++ (k=20%) on the same examples.\n",
            markdown(["Method", "AUROC [95% CI]", "TPR@5%FPR [95% CI]", "vs Min-K%++ (AUROC)", "NaN"], table),
            "\nCost on this machine (each group timed alone, its main pass included, compilation included; the "
            "single-pass methods share one pass, methods reading the same passes are one group):\n",
            markdown(["Methods", "Forward / text", "Backward / text", "Seconds", "Tokens", "Tokens/s"],
                     [[", ".join(c["methods"]), f"{c['forward_per_text']:g}",
                       f"{c['backward_per_text']:g}", f"{c['seconds']:.1f}", str(c["tokens"]),
                       f"{c['tokens_per_second']:.0f}"] for g, c in cost.items()]),
            di_section(rows, info["methods"], seed),
            f"\nRebuild: `python scripts/detectors.py --from {folder}`; made by `{info['command']}`.\n"]
    return "\n".join(text)


def di_section(rows, methods, seed: int) -> str:
    """Dataset inference (Maini et al. 2024) per dataset from the per-example scores: the members against the
    non-members of the same dataset, and two random halves of the non-members against each other (the test must not
    reject there). Features: every single-pass method of the run (one forward pass); split seed ``seed``."""
    from mia_jax.dataset_inference import dataset_inference

    feats = [m for m in methods if m.split("@")[0] in REGISTRY]
    table = []
    for group in sorted({r["dataset"] for r in rows}):
        g = [r for r in rows if r["dataset"] == group]
        x = np.stack([_vec(g, m) for m in feats], 1)
        y = np.array([r["label"] for r in g])
        mem, non = x[y == 1], x[y == 0]
        half = np.random.default_rng(seed).permutation(len(non))
        a, b = non[half[: len(non) // 2]], non[half[len(non) // 2:]]
        for what, s, v in (("members vs non-members", mem, non), ("non-members vs non-members", a, b)):
            try:
                res = dataset_inference(s, v, feats, seed=seed)
            except UserError as e:
                table.append([group, what, f"{len(s)} / {len(v)}", "n/a", "n/a", str(e)])
                continue
            verdict = "rejects (p < 0.05)" if res.p_value < 0.05 else "does not reject"
            table.append([group, what, f"{res.n_suspect} / {res.n_validation}", f"{res.t_statistic:.2f}",
                          f"{res.p_value:.3g}", verdict])
    return "\n".join([
        f"\nDataset inference (Maini et al. 2024; `mia_jax.dataset_inference`): a logistic regression on the "
        f"{len(feats)} single-pass scores fitted on half of each set, one-sided Welch t-test on the held-out halves "
        f"(seed {seed}, chosen before the run). The second row of each dataset splits its non-members in two random "
        "halves: a valid test does not reject there.\n",
        markdown(["Dataset", "Suspect vs validation", "Held-out texts", "t", "p-value", "At 0.05"], table)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--ref-model", help="reference model for 'ref' (left out without one)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--wikimia", type=int, help="WikiMIA length")
    src.add_argument("--eval", help="a contamination run's corpus/eval.jsonl (text, label, dataset)")
    src.add_argument("--from", dest="src", nargs="+", type=Path, help="rebuild the report from these folders")
    ap.add_argument("--name", default="contamination", help="the benchmark's name with --eval")
    ap.add_argument("--shots", type=int, default=5, help="texts held out per (dataset, label) as ReCaLL shots")
    ap.add_argument("--n-shots", type=int, default=5, help="shots per ReCaLL prefix")
    ap.add_argument("--skip", nargs="*", default=[], help="methods to leave out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-neighbors", type=int, default=10, help="neighbours per text of 'neighbor' (default 10)")
    ap.add_argument("--samia-samples", type=int, default=10, help="sampled continuations per text of SaMIA (10)")
    ap.add_argument("--per-cell", type=int, help="evaluate only N texts of each (dataset, label), a seeded sample "
                                                 "(the shots are held out first, as without it)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--n-bootstrap", type=int, default=1000)
    ap.add_argument("--out", help="output folder")
    ap.add_argument("--md", type=Path, help="with --from: write the report there")
    ap.add_argument("--header", type=Path, help="with --from: a markdown file put before the sections")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.src:
        text = "\n".join(section(f, args.n_bootstrap) for f in args.src)
        if args.header:
            text = args.header.read_text(encoding="utf-8").rstrip() + "\n\n" + text
        if args.md:
            args.md.write_text(text)
        print(text)
        return 0
    if not args.out or not (args.wikimia or args.eval):
        ap.error("give --wikimia N or --eval FILE, and --out DIR (or --from DIR ...)")
    print(section(run(args), args.n_bootstrap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
