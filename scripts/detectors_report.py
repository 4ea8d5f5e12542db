"""The report of ``scripts/detectors.py``, from a run folder's sealed files alone (what ``--from`` rebuilds): per
method AUROC / TPR@5%FPR / TPR@1%FPR with 95% bootstrap intervals (the mean over datasets, resampled within each,
where a run has several), the paired bootstrap against Min-K%++ on the same examples (Holm-corrected over the
table), the blind baseline, the cost table and dataset inference per dataset; ``--header``'s template fields;
writing ``--md``.
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np

from mia_jax.evaluation import comparisons, metrics, pvalue, rounding
from mia_jax.runs import files, rundir
from mia_jax.errors import UserError
from mia_jax.evaluation.report import markdown, nonfinite_warning, with_ci
from mia_jax.scorers import MULTI_PASS, REGISTRY, expand_methods

BASELINE = "min_k_pp@0.2"
EXAMPLES = "examples.jsonl.gz"
SEALED = ["info.json", "cost.json", EXAMPLES]  # what a --from rebuild reads


def all_methods() -> list[str]:
    """Every registered method, single- and multi-pass (k = 20% where a method takes k)."""
    return expand_methods(sorted({*REGISTRY, *MULTI_PASS}), [0.2])



def _vec(rows, m):
    return np.array([np.nan if r["scores"].get(m) is None else r["scores"][m] for r in rows], np.float64)


def _ci(x, ci) -> str:
    return "n/a" if x is None or not np.isfinite(x) else with_ci(x, ci)


def _model_label(info) -> str:
    """The model's name, or for a folder named like the generic "model" its parent folder too (contam-lr4/model)."""
    paths = [Path(f) for f in info.get("model_files") or {}]
    if info["model"] == "model" and paths and paths[0].parent.name == "model":
        return f"{paths[0].parent.parent.name}/{info['model']}"
    return info["model"]


def _is_score(x) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))


def _damaged(folder: Path, name: str, what: str) -> UserError:
    return UserError(f"--from {folder}: {name} is damaged ({what}); rebuild from an intact copy of the folder")


def read_run(folder: Path) -> tuple[dict, dict, list[dict]]:
    """info.json, cost.json and the per-example rows of a run folder, checked against its manifest.json and for
    the fields the report reads (a UserError naming the file otherwise)."""
    rundir.verify(folder, SEALED)
    loaded = {}
    for name in ("info.json", "cost.json"):
        try:
            loaded[name] = json.loads((folder / name).read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise _damaged(folder, name, f"not valid JSON: {e}") from None
        if not isinstance(loaded[name], dict):
            raise _damaged(folder, name, "not a JSON object")
    info, cost = loaded["info.json"], loaded["cost.json"]
    keys = {"name": str, "model": str, "n_evaluated": int, "n_shots_held_out": int, "shots_per_prefix": int,
            "seed": int, "methods": list, "command": str}
    for key, kind in keys.items():
        if not isinstance(info.get(key), kind):
            raise _damaged(folder, "info.json", f"no {kind.__name__} {key!r}")
    if not all(isinstance(m, str) for m in info["methods"]) or BASELINE not in info["methods"]:
        raise _damaged(folder, "info.json", f"'methods' is not a list of method names with {BASELINE}")
    for group, c in cost.items():
        if not (isinstance(c, dict) and isinstance(c.get("methods"), list) and all(
                isinstance(c.get(k), (int, float)) for k in ("forward_per_text", "backward_per_text", "seconds",
                                                              "tokens")) and _is_score(c.get("tokens_per_second"))):
            raise _damaged(folder, "cost.json", f"group {group!r} lacks its methods, passes, seconds or tokens")
    try:
        rows = files.read_jsonl_gz(folder / EXAMPLES)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError) as e:
        raise _damaged(folder, EXAMPLES, f"{type(e).__name__}: {e}") from None
    for n, r in enumerate(rows, 1):
        ok = (isinstance(r, dict) and r.get("label") in (0, 1) and isinstance(r.get("dataset"), str)
              and _is_score(r.get("blind")) and isinstance(r.get("scores"), dict)
              and all(_is_score(r["scores"].get(m)) for m in info["methods"]))
        if not ok:
            raise _damaged(folder, EXAMPLES, f"row {n} lacks its label, dataset, blind score or a method's score")
    if len(rows) != info["n_evaluated"]:
        raise _damaged(folder, EXAMPLES, f"{len(rows)} rows where info.json records {info['n_evaluated']}")
    return info, cost, rows


def _na(res: dict) -> str:
    """The cell of a metric that was not computed: n/a with the reason (metrics' note)."""
    note = (res.get("note") or "no AUROC").replace("n/a: ", "")
    return f"n/a ({note})"


def section(folder: Path, n_bootstrap: int = 1000) -> str:
    info, cost, rows = read_run(folder)
    labels = np.array([r["label"] for r in rows])
    groups = [r["dataset"] for r in rows]
    several = len(set(groups)) > 1
    seed = info["seed"]
    table, family = [], []  # family: the paired comparisons of the table (Holm-corrected together)
    for m in [*info["methods"], "blind"]:
        v = (np.array([np.nan if r["blind"] is None else r["blind"] for r in rows], np.float64) if m == "blind"
             else _vec(rows, m))
        name = "Blind BoW (no model)" if m == "blind" else m + (" (oracle)" if m == "ref" else "")
        try:
            if several:
                res = comparisons.evaluate_mean(labels, v, groups, n_bootstrap=n_bootstrap, seed=seed)
            else:
                res = metrics.evaluate(labels, v, n_bootstrap=n_bootstrap, seed=seed)
        except ValueError as e:  # e.g. every text skipped (Lowercase on lower-case texts): a row saying so
            table.append([m, f"n/a ({e})", "n/a", "n/a", "n/a", str(int(np.isnan(v).sum()))])
            continue
        n_nan = str(res.get("n_nan", int(np.isnan(v).sum())))
        if res.get("auroc") is None:  # too few examples of a class (metrics.MIN_PER_CLASS), or one class left
            table.append([name, _na(res), "n/a", "n/a", "n/a", n_nan])
            continue
        if m == "blind" or m == BASELINE:
            vs = "—"
        else:
            try:
                vs = comparisons.paired_bootstrap(labels, v, _vec(rows, BASELINE), groups=groups if several else None,
                                                  n_bootstrap=comparisons.verdict_resamples(n_bootstrap), seed=seed)
                family.append((m, vs))
            except ValueError as e:
                vs = f"n/a ({str(e).replace('n/a: ', '')})"
        low = comparisons.evaluate_mean(labels, v, groups, n_bootstrap=n_bootstrap, seed=seed, fpr=0.01)
        table.append([name, _ci(res["auroc"], res.get("auroc_ci")),
                      _ci(res["tpr_at_5pct_fpr"], res.get("tpr_at_5pct_fpr_ci")),
                      _ci(low["tpr_at_1pct_fpr"], low.get("tpr_at_1pct_fpr_ci")), vs, n_nan])
    comparisons.holm_adjust([c for _, c in family])
    for row in table:  # the comparison cells, once the family is corrected
        if isinstance(row[4], dict):
            c, m = row[4]["auroc"], next(m for m, c in family if c is row[4])
            row[4] = (f"{rounding.diff_ci(c['diff'], c['ci'])} {c['verdict'].replace('A', m).replace('B', 'Min-K%++')}"
                      f" (Holm p {pvalue.p_text(c['p_holm'], comparisons.resamples(row[4]))})")
    avg = " (mean over datasets, resampled within each)" if several else ""
    tps = lambda c: "n/a" if c["tokens_per_second"] is None else f"{c['tokens_per_second']:.0f}"  # noqa: E731
    text = [f"## {info['name']}" + (" (sample)" if info.get("per_cell") else "") + f": {_model_label(info)}"
            f" (`{folder.name}`)\n",  # the folder: several runs may share a benchmark and a model
            f"{info['n_evaluated']} texts evaluated"
            + (f" (a seeded sample of {info['per_cell']} per dataset and label)" if info.get("per_cell") else "")
            + f" ({info['n_shots_held_out']} held out as ReCaLL shots, {info['shots_per_prefix']} per prefix"
            + (f"; Neighbor with {info.get('n_neighbors', 10)} neighbours" if "neighbor" in info["methods"] else "")
            + (f"; SaMIA with {info.get('samia_samples', 10)} sampled continuations per text"
               if "samia" in info["methods"] else "")
            + f"). Not run: {', '.join(m for m in all_methods() if m not in info['methods']) or 'none'}. "
            f"AUROC, TPR@5%FPR and TPR@1%FPR{avg} with 95% bootstrap intervals (the largest TPR at a threshold that "
            f"passes at most 1% of the non-members: with fewer than 100 of them, members scored above every "
            f"non-member); "
            f"the last "
            f"column is the paired bootstrap of the method minus Min-K%++ (k=20%) on the same examples.\n\n"
            + comparisons.family_note(len(family), "each method against Min-K%++") + "\n",
            markdown(["Method", "AUROC [95% CI]", "TPR@5%FPR [95% CI]", "TPR@1%FPR [95% CI]", "vs Min-K%++ (AUROC)",
                      "NaN"], table),
            *([f"\n{nonfinite_warning(info['nonfinite_logits'])}\n"] if info.get("nonfinite_logits") else []),
            "\nCost on this machine (each group timed alone, its main pass included, compilation included; the "
            "single-pass methods share one pass, methods reading the same passes are one group):\n",
            markdown(["Methods", "Forward / text", "Backward / text", "Seconds", "Tokens", "Tokens/s"],
                     [[", ".join(map(str, c["methods"])), f"{c['forward_per_text']:g}",
                       f"{c['backward_per_text']:g}", f"{c['seconds']:.1f}", str(c["tokens"]),
                       tps(c)] for g, c in cost.items()]),
            di_section(rows, info["methods"], seed),
            f"\nRebuild: `python scripts/detectors.py --from {folder}`; made by `{info['command']}`.\n"]
    return "\n".join(text)


def di_section(rows, methods, seed: int) -> str:
    """Dataset inference (Maini et al. 2024) per dataset from the per-example scores: the members against the
    non-members of the same dataset, and two random halves of the non-members against each other (the test must not
    reject there). Features: every single-pass method of the run (one forward pass); split seed ``seed``."""
    from mia_jax.evaluation.dataset_inference import dataset_inference

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
        f"\nDataset inference (Maini et al. 2024; `mia_jax.evaluation.dataset_inference`): a logistic regression on "
        f"the {len(feats)} single-pass scores fitted on half of each set, one-sided Welch t-test on the held-out "
        f"halves (seed {seed}, chosen before the run). The second row of each dataset splits its non-members in two "
        "random halves: a valid test does not reject there.\n",
        markdown(["Dataset", "Suspect vs validation", "Held-out texts", "t", "p-value", "At 0.05"], table)])


def header_fields(srcs) -> dict:
    """What a --header may name as ``{run[FOLDER][name]}`` (FOLDER: a --from folder's name): every key of its
    info.json (n_evaluated, n_shots_held_out, shots_per_prefix, per_cell, ...), ``single_pass`` (how many methods
    share the single forward pass) and ``GROUP_s`` (each cost.json group's seconds, e.g. ``lowercase_s``)."""
    out = {}
    for folder in srcs or []:
        cost = json.loads((Path(folder) / "cost.json").read_text(encoding="utf-8"))
        out[Path(folder).name] = {**json.loads((Path(folder) / "info.json").read_text(encoding="utf-8")),
                                  "single_pass": len(cost["single-pass"]["methods"]),
                                  **{f"{g.replace('-', '_')}_s": f"{c['seconds']:.0f}" for g, c in cost.items()}}
    return {"run": out}


def write_report(args, text: str) -> None:
    if args.header:
        try:
            head = args.header.read_text(encoding="utf-8").format_map(header_fields(args.src))
        except UnicodeDecodeError:
            raise UserError(f"--header {args.header} is not UTF-8 text") from None
        except KeyError as e:
            raise UserError(f"--header names {{{e.args[0]}}}, which the --from folders do not record") from None
        except (ValueError, IndexError, AttributeError) as e:
            raise UserError(f"--header is not a template ({e}); write a brace as {{{{ or }}}}") from None
        text = head.rstrip() + "\n\n" + text
    if args.md:
        files.write_all(args.md.absolute().parent, {args.md.name: text})
    print(text)
