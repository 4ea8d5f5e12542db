"""results/audits.md, the audits' overview, filled in from the committed audit folders (no number in it is typed by
hand): :func:`fields` computes every number the overview states from ``results/audits/`` (the books audits'
``info.json`` / ``books.csv`` / ``snippets.csv``, the unlearning audits' ``chunks.csv`` / ``unlearning.json``, the
windowed runs' ``windows.csv.gz``), and :func:`render` puts them into the template ``results/audits/README.md``
(``{name}`` placeholders; the prose around them says what was run). Every verdict in it is a paired bootstrap with
at least ``comparisons.VERDICT_RESAMPLES`` resamples, Holm-corrected within its paragraph (one family per
paragraph, stated there).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from mia_jax.evaluation import comparisons, pvalue
from mia_jax.audits.concat import read_windows_csv
from mia_jax.evaluation.report import fmt, markdown, with_ci
from mia_jax.evaluation.rounding import diff_ci

NAMES = {"min_k@0.2": "Min-K% (k = 20%)", "ppl": "PPL", "zlib": "Zlib", "lowercase": "Lowercase",
         "loss": "Loss", "min_k_pp@0.2": "Min-K%++ (k = 20%)"}
SHORT = {"min_k@0.2": "Min-K%", "ppl": "PPL", "zlib": "Zlib", "lowercase": "Lowercase", "loss": "Loss",
         "min_k_pp@0.2": "Min-K%++"}
DATASETS = {"boolq": "BoolQ", "imdb": "IMDB", "commonsenseqa": "CommonsenseQA", "truthfulqa": "TruthfulQA"}


def _csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _seen(n_seen: int, n_unseen: int) -> str:
    return f"{n_seen} seen, {n_unseen} unseen"


def _flag_count(books: list[dict], threshold: str) -> str:
    """``13 of 18 (6 seen, 7 unseen)``: the books whose rate at ``threshold`` is above 50%."""
    above = [b for b in books if b[f"rate_{threshold}"] != "" and float(b[f"rate_{threshold}"]) > 0.5]
    seen = sum(b["label"] == "1" for b in above)
    return f"{len(above)} of {len(books)}" + (f" ({_seen(seen, len(above) - seen)})" if above else "")


def _validation(folder: Path) -> tuple[np.ndarray, dict, list]:
    """(labels, {method: scores}, book of each snippet) of a books audit's validation snippets."""
    rows = [r for r in _csv(folder / "snippets.csv") if r["set"] == "validation"]
    info = json.loads((folder / "info.json").read_text())
    methods = info["config"]["methods"]
    return (np.array([int(r["label"]) for r in rows]), {m: np.array([float(r[m]) for r in rows]) for m in methods},
            [r["title"] for r in rows])


def _book_paired(root: Path) -> dict:
    """The validation comparisons of Min-K% with each baseline, trained and control (one Holm family), resampling
    books (cluster bootstrap); and the control's Min-K% vs PPL resampling snippets as independent."""
    out, family = {}, []
    for audit in ("books", "books_control"):
        info = json.loads((root / audit / "info.json").read_text())
        n_boot, seed = comparisons.verdict_resamples(info["config"]["n_bootstrap"]), info["config"]["seed"]
        lab, sc, books = _validation(root / audit)
        for b in ("ppl", "zlib", "lowercase"):
            c = comparisons.paired_bootstrap(lab, sc["min_k@0.2"], sc[b], clusters=books, n_bootstrap=n_boot,
                                             seed=seed)
            out[(audit, b)] = c
            family.append(c)
        if audit == "books_control":
            out["naive"] = comparisons.paired_bootstrap(lab, sc["min_k@0.2"], sc["ppl"], n_bootstrap=n_boot,
                                                        seed=seed)
    out["family"] = comparisons.holm_adjust(family)
    return out


def _verdict(c: dict, a: str, b: str) -> str:
    """``Min-K% > PPL`` / ``PPL > Min-K%`` / ``not distinguishable`` / ``undecided`` from a comparison's AUROC
    verdict."""
    v = c["auroc"]["verdict"]
    return {"A > B": f"{a} > {b}", "B > A": f"{b} > {a}"}.get(v, v)


def _said(c: dict, b: str) -> str:
    """``vs PPL +0.075 [+0.005, +0.165] (Min-K% > PPL, Holm p 0.012)``."""
    a = c["auroc"]
    return (f"vs {SHORT[b]} {diff_ci(a['diff'], a['ci'])} ({_verdict(c, 'Min-K%', SHORT[b])}, "
            f"Holm p {pvalue.p_text(a['p_holm'], comparisons.resamples(c))})")


def book_fields(root: Path) -> dict:
    """The numbers of the overview's section 1 (books audits)."""
    info = {a: json.loads((root / a / "info.json").read_text()) for a in ("books", "books_control")}
    books = {a: _csv(root / a / "books.csv") for a in info}
    val = {a: info[a]["validation_metrics"] for a in info}
    rows = [[NAMES[m], *(with_ci(val[a][m]["auroc"], val[a][m]["auroc_ci"]) for a in info)] for m in val["books"]]
    thr = {a: {t["name"]: t for t in info[a]["thresholds"]} for a in info}
    trows = [[label, *(", ".join([fmt(thr[a][name]["value"]), fmt(thr[a][name]["validation_accuracy"]),
                                  fmt(thr[a][name]["validation_tpr"]), fmt(thr[a][name]["validation_fpr"])])
                       for a in info)]
             for name, label in (("accuracy", "max. validation accuracy (the paper's)"),
                                 ("fpr", "validation FPR <= 0.05"))]
    sep = {a: info[a]["book_separation"] for a in info}

    def book_auroc(a, key):
        r = sep[a][key]
        return (with_ci(r["auroc"], r["auroc_ci"]) if r.get("auroc") is not None
                else f"n/a ({_seen(r['n_members'], r['n_nonmembers'])} books)")
    crows = [["books with rate > 50% (max.-accuracy threshold)", *(_flag_count(books[a], "accuracy") for a in info)],
             ["books with rate > 50% (FPR <= 0.05 threshold)", *(_flag_count(books[a], "fpr") for a in info)]]
    crows += [[f"AUROC of the {what}", *(book_auroc(a, key) for a in info)]
              for key, what in (("rate @ accuracy", "per-book rate, seen vs unseen books (max.-accuracy threshold)"),
                                ("rate @ fpr", "per-book rate (FPR threshold)"),
                                ("mean score", "book's mean Min-K% score"))]
    paired = _book_paired(root)
    counts = info["books"]["counts"]
    ctrl = books["books_control"]
    return {
        "books_validation_table": markdown(["Method", "trained model: AUROC [95% CI]",
                                            "control (never trained): AUROC [95% CI]"], rows).rstrip("\n"),
        "books_validation_snippets": counts["validation_snippets"],
        "books_validation_books": counts["validation_books"],
        "books_paired_trained": "; ".join(_said(paired[("books", b)], b) for b in ("ppl", "zlib", "lowercase")),
        "books_paired_control": "; ".join(_said(paired[("books_control", b)], b) for b in ("ppl", "zlib",
                                                                                             "lowercase")),
        "books_paired_family": paired["family"],
        "books_paired_naive": (f"{diff_ci(paired['naive']['auroc']['diff'], paired['naive']['auroc']['ci'])}: "
                               f"{_verdict(paired['naive'], 'Min-K%', 'PPL')}"),
        "books_threshold_table": markdown(["Threshold", "trained: value, val. accuracy, TPR, FPR",
                                           "control: value, val. accuracy, TPR, FPR"], trows).rstrip("\n"),
        "books_count_table": markdown(["", "trained model", "control"], crows).rstrip("\n"),
        "books_n": len(ctrl), "books_seen": sum(b["label"] == "1" for b in ctrl),
        "books_control_flagged": _flag_count(ctrl, "accuracy").split(" (")[0],
        "books_control_val_accuracy": fmt(thr["books_control"]["accuracy"]["validation_accuracy"]),
    }


def _range(values, digits: int = 3) -> str:
    """``1.093-1.155``: the smallest and the largest of ``values``."""
    v = [float(x) for x in values]
    return f"{fmt(min(v), digits)}-{fmt(max(v), digits)}" if v else "n/a"


def unlearning_fields(root: Path) -> dict:
    """The numbers of the overview's section 2 (unlearning audits: chunks flagged, ratio ranges, story completion
    on the flagged chunks)."""
    out = {}
    for audit, tag in (("unlearning", "u"), ("unlearning_control", "c")):
        chunks = _csv(root / audit / "chunks.csv")
        for m in ("min_k", "ppl"):
            flagged = sum(r[f"{m}_flagged"] == "True" for r in chunks)
            out[f"{tag}_{m}_flagged"] = f"{flagged} of {len(chunks)}"
            out[f"{tag}_{m}_ratios"] = _range(r[f"{m}_ratio"] for r in chunks)
            out[f"{tag}_{m}_ratios_short"] = _range((r[f"{m}_ratio"] for r in chunks), 2 if m == "min_k" else 1)
        probed = [r for r in chunks if r["probed"] == "True"]
        out[f"{tag}_probed"] = len(probed)
        for stat in ("mean", "max"):
            for model in ("original", "unlearned"):
                out[f"{tag}_rouge_{stat}_{model}"] = _range(r[f"rougeL_{stat}_{model}"] for r in probed)
    return out


def _window_rows(run: Path, data: Path) -> dict:
    """{(text, window): (dataset, label, {method: score})} of a windowed run's labeled windows."""
    groups = [json.loads(line)["dataset"] for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = read_windows_csv(run)
    methods = rows[0][4:-1] if rows[0][-1] == "window_text" else rows[0][4:]
    out = {}
    for r in rows[1:]:
        if r[3] != "":
            out[(int(r[0]), int(r[1]))] = (groups[int(r[0])], int(r[3]),
                                           {m: float(v) for m, v in zip(methods, r[4: 4 + len(methods)])})
    return out


def window_paired(root: Path, seed: int = 0) -> tuple[dict, int]:
    """({(dataset, method): paired bootstrap of trained - base on the same windows, resampling whole records}, the
    family's size) for Loss and Min-K% on the contamination windows; one Holm family."""
    data = root / "concat" / "contam.jsonl"
    trained, base = (_window_rows(root / "concat" / run, data) for run in ("contam-trained", "contam-base"))
    keys = sorted(trained)
    out = {}
    for d in dict.fromkeys(trained[k][0] for k in keys):
        sel = [k for k in keys if trained[k][0] == d]
        lab = np.array([trained[k][1] for k in sel])
        for m in ("loss", "min_k@0.2"):
            out[(d, m)] = comparisons.paired_bootstrap(
                lab, np.array([trained[k][2][m] for k in sel]), np.array([base[k][2][m] for k in sel]),
                clusters=[k[0] for k in sel], n_bootstrap=comparisons.VERDICT_RESAMPLES, seed=seed)
    return out, comparisons.holm_adjust(list(out.values()))


def _window_cell(rep: dict, m: str) -> str:
    r = rep.get("metrics", {}).get(m)
    return "n/a" if r is None else with_ci(r["auroc"], r["auroc_ci"])


def window_fields(root: Path, reps: dict) -> dict:
    """The numbers of the overview's section 3 (windowed runs): ``reps`` {"contam-trained" | "contam-base": the
    per-dataset ``concat.window_metrics`` of the run}; the WikiMIA-concat run's own report from its run.json."""
    wiki = json.loads((root / "concat" / "wikimia" / "run.json").read_text())["windows"]
    rows = [[NAMES[m], _window_cell(wiki, m)] for m in wiki["metrics"] if m != "blind_bow"]
    rows.append(["**blind bag-of-words (no model; a text's windows in one fold)**",
                 "**" + _window_cell(wiki, "blind_bow").replace(" [", "** [", 1)])
    tr, ba = reps["contam-trained"], reps["contam-base"]
    order = [d for d in DATASETS if d in tr] + [d for d in tr if d not in DATASETS]
    drows = [[f"{DATASETS.get(d, d)} ({tr[d]['n_labeled']:,} windows)",
              *(_window_cell(rep[d], m) for m in ("loss", "min_k@0.2", "min_k_pp@0.2") for rep in (tr, ba)),
              fmt(tr[d]["metrics"]["blind_bow"]["auroc"])] for d in order]
    header = ["Dataset", *(f"{SHORT[m]}, {w}" for m in ("loss", "min_k@0.2", "min_k_pp@0.2")
                           for w in ("trained", "base")), "blind"]
    paired, family = window_paired(root)
    said = []
    for d in order:
        parts = [f"{SHORT[m]} {diff_ci(c['auroc']['diff'], c['auroc']['ci'])} ({_verdict(c, 'trained', 'base')})"
                 for (dd, m), c in paired.items() if dd == d]
        said.append(f"{DATASETS.get(d, d)}: " + ", ".join(parts))
    base_loss = [ba[d]["metrics"]["loss"]["auroc"] for d in ba]
    return {"wiki_texts": len(wiki["first_flagged"]), "wiki_windows": f"{wiki['n_windows']:,}",
            "wiki_labeled": f"{wiki['n_labeled']:,}",
            "wiki_table": markdown(["Method", "window AUROC [95% CI]"], rows).rstrip("\n"),
            "windows_table": markdown(header, drows).rstrip("\n"),
            "base_loss_range": f"{fmt(min(base_loss), 2)}-{fmt(max(base_loss), 2)}",
            "blind_csqa": fmt(tr["commonsenseqa"]["metrics"]["blind_bow"]["auroc"], 2),
            "blind_tqa": fmt(tr["truthfulqa"]["metrics"]["blind_bow"]["auroc"], 2),
            "windows_paired": "; ".join(said), "windows_family": family}


def setup_fields(root: Path) -> dict:
    """The set-up's counts, from the books audit's ``snippets.csv`` / ``info.json``, the unlearning audit's
    ``unlearning.json`` and the windowed contamination run's ``run.json``: books in all, per domain, trained on,
    validation books per domain and label, audited books per label, snippets per book and their words, the forget
    set's texts and chunks, the story-completion prompt and samples, the concatenated records."""
    snips = _csv(root / "books" / "snippets.csv")
    books = {(r["set"], r["title"], r["label"]) for r in snips}
    domains = {t.rsplit("-", 1)[0] for _, t, _ in books}
    info = json.loads((root / "books" / "info.json").read_text())
    unl = json.loads((root / "unlearning" / "unlearning.json").read_text())

    def per_domain(sel) -> str:  # the count per domain when every domain has the same, else each one's
        n = sorted({sum(1 for b in books if sel(b) and b[1].rsplit("-", 1)[0] == d) for d in domains})
        return "/".join(map(str, n))

    return {"books_total": len(books), "books_domains": len(domains), "books_per_domain": per_domain(lambda b: True),
            "books_trained": sum(b[2] == "1" for b in books),
            "books_val_per_domain": per_domain(lambda b: b[0] == "validation" and b[2] == "1"),
            "books_val_unseen_per_domain": per_domain(lambda b: b[0] == "validation" and b[2] == "0"),
            "books_unseen": sum(b[0] == "audit" and b[2] == "0" for b in books),
            "books_snippets_per_book": len(snips) // len(books),
            "books_snippet_words": info["config"]["snippet_words"],
            "u_texts": unl["counts"]["texts"], "u_chunks": unl["counts"]["chunks"],
            "u_chunk_words": unl["config"]["chunk_words"], "u_prompt_words": unl["config"]["prompt_words"],
            "u_samples": unl["config"]["n_samples"],
            "concat_records": json.loads((root / "concat" / "contam-trained" / "run.json").read_text())["data"]["n"]}


def render(template: str, root: Path, reps: dict) -> str:
    """The overview: ``template`` (the text of results/audits/README.md) with every ``{name}`` filled in from the
    audit folders under ``root`` (:func:`setup_fields`, :func:`book_fields`, :func:`unlearning_fields`,
    :func:`window_fields`)."""
    fields = {**setup_fields(root), **book_fields(root), **unlearning_fields(root), **window_fields(root, reps)}
    return template.format(**fields)
