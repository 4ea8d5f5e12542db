"""The contamination study as one report: every sweep's tables rebuilt from its per-example scores, and each of the
paper's claims (Shi et al. 2023, section 6) marked reproduced / not reproduced / not distinguishable with the paired
bootstrap interval behind the verdict::

    python -m train.study --lr results/contamination/lr results/contamination/gemma-lr \\
        --size results/contamination/size --news results/contamination/news \\
        --occurrence results/contamination/occurrence --out results/contamination.md

A sweep option may name several folders (the same sweep on several models): each folder's tables get a heading with
its model, and its claims carry the model's name, so a reader sees which conclusions hold across models.

A claim "A > B" is *reproduced* when the 95% interval of A - B lies above 0, *not reproduced* when it lies below 0
(the opposite holds), *not distinguishable* when it contains 0. The claims and their tests:

- Table 3: Min-K% beats each baseline (PPL, Zlib, Lowercase, Neighbor) on the average over the datasets: paired
  bootstrap of the two methods' scores under the trained model (lr 1e-4 run) on the same examples, the mean of
  the per-dataset AUROCs resampled within each dataset.
- Table 4: the higher learning rate gives a higher Min-K% AUROC on every dataset (and on average): paired bootstrap
  of the two trained models' scores on the same examples, per dataset.
- Figure 5a: outlier contaminants are easier to detect in a larger corpus: the largest background vs the smallest,
  Min-K% average AUROC, paired (the eval examples are the same in every run of the sweep).
- Figure 5b: in-distribution contaminants (2023 news) are harder to detect in a larger corpus: largest vs smallest.
- Figure 5c: members inserted more often are easier to detect: k = max vs k = 1 against the same non-members,
  every dataset pooled after per-dataset rank normalisation (``tables.group_scores``).
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import numpy as np

from mia_jax import entry, files, metrics, rundir
from mia_jax.errors import UserError
from mia_jax.report import with_ci
from train import tables

PROG = "python -m train.study"
KINDS = ("lr", "size", "news", "occurrence")
VERDICT = {"A > B": "reproduced", "B > A": "not reproduced", "not distinguishable": "not distinguishable"}
NA = "n/a"  # the verdict of a claim with no comparison (a class with fewer than metrics.MIN_PER_CLASS examples)


def _claim(name: str, paper: str, comp: dict | str, a: str, b: str) -> dict:
    if isinstance(comp, str):  # the reason there is no comparison
        return {"claim": name, "paper": paper, "a": a, "b": b, "auroc_a": None, "auroc_a_ci": None, "auroc_b": None,
                "auroc_b_ci": None, "diff": None, "ci": None, "verdict": NA, "note": comp}
    c = comp["auroc"]
    return {"claim": name, "paper": paper, "a": a, "b": b, "auroc_a": c["a"], "auroc_a_ci": c["a_ci"],
            "auroc_b": c["b"], "auroc_b_ci": c["b_ci"], "diff": c["diff"], "ci": c["ci"],
            "verdict": VERDICT[c["verdict"]], "n_used": comp["n_used"],
            "n_bootstrap": comp["n_bootstrap"], "seed": comp["seed"]}


def _cfg(run: dict) -> tuple[int, int]:
    score = run["config"]["score"]
    return int(score.get("n_bootstrap", 1000)) or 1000, int(score.get("seed", 0))


def _paired(rows_a, rows_b, model_a, model_b, m_a, m_b, n_bootstrap, seed, dataset=None) -> dict | str:
    """The paired bootstrap of A - B, or the reason it is n/a (a class with fewer than metrics.MIN_PER_CLASS
    examples, in a dataset for the average)."""
    idx = [i for i, r in enumerate(rows_a) if dataset is None or r["dataset"] == dataset]
    lab = np.array([rows_a[i]["label"] for i in idx])
    a = tables._vec([rows_a[i] for i in idx], model_a, m_a)
    b = tables._vec([rows_b[i] for i in idx], model_b, m_b)
    groups = None if dataset is not None else [rows_a[i]["dataset"] for i in idx]
    try:
        return metrics.paired_bootstrap(lab, a, b, groups=groups, n_bootstrap=n_bootstrap, seed=seed)
    except ValueError as e:
        return str(e).replace("n/a: ", "")


def table3_claims(run: dict, tag: str = "") -> list[dict]:
    rows, methods = run["examples"], run["methods"]
    mk = tables.headline(methods, "min_k")
    out = []
    for base, label in (("ppl", "PPL"), ("zlib", "Zlib"), ("lowercase", "Lowercase"), ("neighbor", "Neighbor")):
        if mk is None or base not in methods:
            continue
        comp = _paired(rows, rows, "trained", "trained", mk, base, *_cfg(run))
        out.append(_claim(f"Table 3{tag}: Min-K% > {label} (average over datasets)", "reproduced in the paper", comp,
                          tables.method_name(mk), label))
    return out


def lr_claims(runs: list[tuple[str, dict]], tag: str = "") -> list[dict]:
    by_lr = sorted(runs, key=lambda r: r[1]["config"]["train"]["lr"])
    lo, hi = by_lr[0][1], by_lr[-1][1]
    if len(by_lr) < 2 or not tables._same_examples(lo["examples"], hi["examples"]):
        return []
    mk = tables.headline(hi["methods"], "min_k")
    lr_hi, lr_lo = hi["config"]["train"]["lr"], lo["config"]["train"]["lr"]
    out = []
    for d in [None, *dict.fromkeys(r["dataset"] for r in hi["examples"])]:
        comp = _paired(hi["examples"], lo["examples"], "trained", "trained", mk, mk, *_cfg(hi), dataset=d)
        where = "average" if d is None else tables.DATASET_NAMES.get(d, d)
        out.append(_claim(f"Table 4{tag}: lr {lr_hi:g} > lr {lr_lo:g}, Min-K%, {where}", "every dataset", comp,
                          f"lr {lr_hi:g}", f"lr {lr_lo:g}"))
    return out


def size_claim(runs: list[tuple[str, dict]], figure: str, larger_is_easier: bool, tag: str = "") -> list[dict]:
    by_size = sorted(runs, key=lambda r: r[1]["corpus"]["tokens"]["total"])
    small, large = by_size[0][1], by_size[-1][1]
    if len(by_size) < 2 or not tables._same_examples(small["examples"], large["examples"]):
        return []
    mk = tables.headline(large["methods"], "min_k")
    a, b = (large, small) if larger_is_easier else (small, large)
    comp = _paired(a["examples"], b["examples"], "trained", "trained", mk, mk, *_cfg(large))
    tok = {id(r): r["corpus"]["tokens"]["total"] for r in (small, large)}
    name = (f"{figure}{tag}: Min-K% AUROC, {tok[id(a)]:,} > {tok[id(b)]:,} corpus tokens (average)")
    return [_claim(name, "larger corpus easier" if larger_is_easier else "larger corpus harder", comp,
                   f"{tok[id(a)]:,} tokens", f"{tok[id(b)]:,} tokens")]


def occurrence_claim(run: dict, tag: str = "") -> list[dict]:
    rows, methods = run["examples"], run["methods"]
    mk = tables.headline(methods, "min_k")
    idx, sc = tables.group_scores([{"scores": r["trained"]} for r in rows], rows, [mk], "all")
    occ = np.array([rows[i].get("occurrences", 0) for i in idx])
    lab = np.array([rows[i]["label"] for i in idx])
    ks = sorted(set(occ[lab == 1].tolist()))
    if len(ks) < 2:
        return []
    try:
        comp = metrics.subset_bootstrap(sc[mk], lab, (lab == 1) & (occ == ks[-1]), (lab == 1) & (occ == 1),
                                        n_bootstrap=_cfg(run)[0], seed=_cfg(run)[1])
        comp["n_used"] = int(((lab == 0) | (occ == ks[-1]) | (occ == 1)).sum())
    except ValueError as e:
        comp = str(e).replace("n/a: ", "")
    return [_claim(f"Figure 5c{tag}: Min-K% AUROC, k = {ks[-1]} > k = 1 (pooled after rank normalisation)",
                   "more occurrences easier", comp, f"k={ks[-1]}", "k=1")]


def claims_markdown(claims: list[dict]) -> str:
    header = ["Claim", "A", "B", "AUROC A [95% CI]", "AUROC B [95% CI]", "A - B [95% CI]", "Verdict"]
    rows = []
    for c in claims:
        if c["verdict"] == NA:  # no comparison: n/a with the reason, never bold
            rows.append([c["claim"], c["a"], c["b"], "n/a", "n/a", "n/a", f"n/a ({c['note']})"])
            continue
        rows.append([c["claim"], c["a"], c["b"], with_ci(c["auroc_a"], c["auroc_a_ci"]),
                     with_ci(c["auroc_b"], c["auroc_b_ci"]),
                     f"{c['diff']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}]", f"**{c['verdict']}**"])
    return tables.markdown(header, rows)


def _folders(value) -> list[Path]:
    return [Path(value)] if isinstance(value, (str, Path)) else [Path(f) for f in value or []]


def compute(sweeps: dict[str, Path | list[Path]], header: str = "") -> tuple[str, list[dict], dict]:
    """(the report's markdown, its claims, {sweep folder: {path: content}} of every table and figure rebuilt) from
    the sweep folders ({"lr": DIR or [DIR, ...], ...}; any subset). Every input is checked (``tables.load_source``:
    the manifest, then the fields) and every output computed; nothing is written. Where a kind names several
    folders (one per model), each gets a heading with its model and its claims the model's name."""
    loaded = {}
    for kind in KINDS:  # every folder read and checked before anything is computed
        for folder in _folders(sweeps.get(kind)):
            got = tables.load_source(folder, f"--{kind}")
            if got[0] != kind:
                what = "one run's folder" if got[0] is None else f"a {got[0]} sweep"
                raise UserError(f"--{kind} {folder} is {what}; give the folder of a {kind} sweep "
                                f"(python train/contaminate.py --ablation {kind})")
            loaded[(kind, folder)] = got
    parts, claims, outputs = [], [], {}
    for kind in KINDS:
        folders = _folders(sweeps.get(kind))
        for folder in folders:
            text, outputs[folder] = tables.rebuild_outputs(folder, loaded[(kind, folder)])
            runs = loaded[(kind, folder)][1]
            model = runs[0][1]["config"]["model"]["path"]
            tag = f" ({model})" if len(folders) > 1 else ""
            if tag:
                parts.append(f"# Model {model}: the {kind} sweep (`{folder.as_posix()}`)")
            if kind == "lr":
                main = max(runs, key=lambda r: r[1]["config"]["train"]["lr"])
                parts.append(outputs[folder][f"{main[0]}/table3.md"])
                claims += table3_claims(main[1], tag) + lr_claims(runs, tag)
            elif kind == "size":
                claims += size_claim(runs, "Figure 5a", larger_is_easier=True, tag=tag)
            elif kind == "news":
                claims += size_claim(runs, "Figure 5b", larger_is_easier=False, tag=tag)
            else:
                claims += occurrence_claim(runs[0][1], tag)
            parts.append(text)
    body = ("## The paper's claims\n\nEach claim as a paired bootstrap of A - B on the same examples (95% "
            "interval): reproduced when the interval lies above 0, not reproduced when below, not distinguishable "
            "when it contains 0.\n\n" + claims_markdown(claims) + "\n\n" + "\n\n".join(parts))
    return (header + "\n\n" if header else "") + body, claims, outputs


def _write_sweeps(outputs: dict) -> None:
    """Each sweep's rebuilt tables in place, every folder locked while it is written."""
    with contextlib.ExitStack() as stack:
        for folder in outputs:
            stack.enter_context(rundir.rebuild_into(folder, [folder], "train.study"))
        for folder, outs in outputs.items():
            files.write_all(folder, outs)


def build(sweeps: dict[str, Path | list[Path]], header: str = "") -> tuple[str, list[dict]]:
    """:func:`compute`, then every sweep's tables and figures written in place; returns (markdown, claims)."""
    text, claims, outputs = compute(sweeps, header)
    _write_sweeps(outputs)
    return text, claims


def build_parser() -> entry.ArgumentParser:
    p = entry.ArgumentParser(prog=PROG, description="The contamination study's report: every sweep's tables and the "
                             "paper's claims with verdicts, from per-example scores.")
    for kind in KINDS:
        p.add_argument(f"--{kind}", nargs="+", metavar="DIR",
                       type=entry.source_dir("contamination", example=f"results/contamination/{kind}"),
                       help=f"the {kind} sweep folder (several: the same sweep on several models)")
    p.add_argument("--header", type=entry.input_file, help="a markdown file to put first (set-up, commands, times)")
    p.add_argument("--out", type=entry.out_file,
                   help="write the report here (and <out>.claims.json) instead of stdout")
    return p


def _main(argv) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    sweeps = {k: getattr(args, k) for k in KINDS if getattr(args, k)}
    if not sweeps:
        p.error("give at least one sweep folder")
    if args.header:
        try:
            header = args.header.read_text(encoding="utf-8-sig").strip()
        except UnicodeDecodeError:
            raise UserError(f"--header {args.header} is not UTF-8 text") from None
    else:
        header = ""
    text, claims, outputs = compute(sweeps, header)
    _write_sweeps(outputs)
    if args.out:
        files.write_all(args.out.absolute().parent, {
            args.out.name: text + "\n", args.out.with_suffix(".claims.json").name: json.dumps(claims, indent=2) + "\n"})
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv, resume_hint="run the same command again (each folder's tables are written "
                     "all or none)")


if __name__ == "__main__":
    sys.exit(main())
