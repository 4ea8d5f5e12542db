"""Reproduce Shi et al. (2023)'s WikiMIA evaluation: Table 1 (AUROC), Table 6 (TPR@5%FPR),
Figure 2b (AUROC per text length) and the k sweep of Min-K% / Min-K%++, for any set of models.

Every (model, length, setting) cell is one ``runner.score_dataset`` run into its own folder (so a
killed reproduction resumes); this module runs the cells and rebuilds their rows from ``examples.jsonl.gz``,
:mod:`mia_jax.reproduce_report` draws the tables and plots.
Table 1 / Table 6 average a method's metric over the requested lengths (the paper pools its
lengths into one column per model and setting); with the cells' per-example scores each cell carries a
95% bootstrap interval (resampled within each length) and bold marks the best detector of a column and
every detector the paired bootstrap cannot distinguish from it.

Smaller-Ref: a *mirrored* pair (model A with reference B and model B with reference A) gives two cells that
are one score negated (their AUROCs sum to 1), so it is refused by the script unless asked for, and then
flagged and never bolded (:func:`mirrored_pairs`). When the target's and the reference's tokenizers differ,
the two models are compared per byte of text (each model's total log-likelihood of the text divided by its
UTF-8 length) instead of per token (:func:`ref_per_byte`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax.evaluation import blind, metrics
from mia_jax import data
from mia_jax.runs import files, rundir
from mia_jax.engine import runner
from mia_jax.errors import UserError
from mia_jax.methods.neighbors import SelfNeighbors
from mia_jax.reproduce_report import K_SWEEP, SETTINGS, report_outputs


def methods_for(rows: Sequence[tuple[str, str]]) -> list[str]:
    """The paper rows' methods plus both k sweeps, without duplicates."""
    out = [m for _, m in rows]
    out += [f"{base}@{k:g}" for base in ("min_k", "min_k_pp") for k in K_SWEEP]
    return list(dict.fromkeys(out))


def paraphrased(length: int, para_dir: str | Path | None):
    """The user-supplied paraphrased WikiMIA split ("Para." setting), or None when not given."""
    if para_dir is None:
        return None
    path = Path(para_dir) / f"WikiMIA_length{length}_paraphrased.jsonl"
    return data.load_records(path, "input", "label", name=f"wikimia-{length}-para") if path.exists() else None


def mirrored_pairs(models: Sequence[str], refs: Sequence[str]) -> list[tuple[str, str]]:
    """(model, reference) pairs whose mirror (reference, model) is also among the pairs, or that are a model with
    itself: their Smaller-Ref cells are not independent evidence (the two scores are one score negated)."""
    pairs = list(zip(models, refs))
    return [(m, r) for m, r in pairs if m == r or (r, m) in pairs]


def same_tokenizer(a, b) -> bool:
    """Whether two loaded models read a text as the same tokens (same vocabulary and BOS policy)."""
    try:
        return a.add_bos == b.add_bos and a.tokenizer.get_vocab() == b.tokenizer.get_vocab()
    except AttributeError:
        return False


def _pass_records(path: Path) -> dict[int, dict]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[rec["index"]] = rec
    return out


def ref_per_byte(texts: Sequence[str], main: dict[int, dict], ref: dict[int, dict]) -> np.ndarray:
    """Smaller-Ref per byte: (target's total log-likelihood - reference's) / UTF-8 bytes of the text, from the main
    and ``ref`` pass records ({index: record} with ``n_tokens`` and ``scores.loss`` = the mean log-likelihood of the
    ``n_tokens - 1`` predicted tokens). NaN for a text either model skipped or truncated."""
    out = np.full(len(texts), np.nan)
    for i, text in enumerate(texts):
        a, b = main.get(i), ref.get(i)
        if a is None or b is None or any(r.get("truncated") or r["scores"].get("loss") is None for r in (a, b)):
            continue
        total = [r["scores"]["loss"] * (r["n_tokens"] - 1) for r in (a, b)]
        out[i] = (total[0] - total[1]) / max(1, len(text.encode("utf-8")))
    return out


def run_cell(loaded, ds, methods, out_dir: Path, *, n_bootstrap: int, seed: int, pass_counts: dict | None = None,
             examples: dict | None = None, **kwargs) -> list[dict]:
    """Score one dataset with one model in its own run folder (claimed with the cell's fingerprint, so a killed
    reproduction resumes each cell where it stopped and a changed one is refused); long-format rows
    {method, auroc, tpr_at_5pct_fpr, ...}. ``pass_counts`` receives the per-pass counts of ``runner.score_dataset``.
    With a reference model whose tokenizer differs from the target's, ``ref`` is compared per byte
    (:func:`ref_per_byte`; the row says ``"ref_unit": "byte"``). ``examples`` (a dict) receives ``{"labels": [...],
    "methods": [...], "scores": {method: [...]}, "ref_unit"}`` (the blind baseline's scores too; a non-finite score
    is null) for the report's intervals and paired comparisons; the rows are computed from it (:func:`cell_rows`)."""
    options = {k: kwargs[k] for k in ("batch_size", "tokens_per_batch", "chunk_size") if kwargs.get(k) is not None}
    fingerprint = runner.run_fingerprint(loaded, ds.texts, ds.labels, methods, ref=kwargs.get("ref"),
                                         neighbors=kwargs.get("neighbors"), data_files=ds.files, **options)
    with rundir.claim(out_dir, fingerprint, hint="use another --out") as resume:
        records = runner.score_dataset(loaded, ds.texts, methods, labels=ds.labels, out_dir=out_dir, resume=resume,
                                       report=pass_counts, **kwargs)
    scores = metrics.scores_by_method(records, methods)
    ref = kwargs.get("ref")
    per_byte = "ref" in methods and ref is not None and not same_tokenizer(loaded, ref)
    if per_byte:
        scores["ref"] = ref_per_byte(ds.texts, _pass_records(Path(out_dir, "passes", "main.jsonl")),
                                     _pass_records(Path(out_dir, "passes", "ref.jsonl")))
    ref_unit = ("byte" if per_byte else "token") if "ref" in methods else None
    scores[blind.NAME] = blind.blind_bow_scores(ds.texts, ds.labels, seed=seed)
    order = [*methods, blind.NAME]
    cell = {"labels": [int(y) for y in ds.labels], "methods": order, "scores": {m: _plain(scores[m]) for m in order},
            "ref_unit": ref_unit}
    if examples is not None:
        examples.update(cell)
    return cell_rows(cell, n_bootstrap=n_bootstrap, seed=seed)


def _plain(values) -> list:
    return [None if not np.isfinite(x) else float(x) for x in np.asarray(values, float)]


def cell_rows(cell: dict, *, n_bootstrap: int, seed: int) -> list[dict]:
    """A cell's long-format rows (every method of ``cell["methods"]``, the blind baseline last) from its per-example
    scores ``{"labels", "methods", "scores": {method: [...]}, "ref_unit"}``: what :func:`run_cell` returns, and what
    :func:`rebuild` recomputes from a reproduction's ``examples.jsonl.gz`` without any model."""
    rows = []
    for m in cell["methods"]:
        x = np.array([np.nan if v is None else v for v in cell["scores"][m]], np.float64)
        rows.append({"method": m, **metrics.evaluate(cell["labels"], x, n_bootstrap=n_bootstrap, seed=seed)})
        if m == "ref" and cell.get("ref_unit"):
            rows[-1]["ref_unit"] = cell["ref_unit"]
    return rows


EXAMPLES = "examples.jsonl.gz"
# what a --from rebuild reads: the run seals it at its end (rundir.seal), the rebuild verifies it first
REBUILD_READS = [EXAMPLES]
_CELL_KEYS = ("model", "length", "setting", "labels", "methods", "scores", "n_bootstrap", "seed")


def _cell_name(c: dict) -> str:
    return f"{c.get('model')} WikiMIA-{c.get('length')} {c.get('setting')}"


def check_cells(cells: list, where: str) -> None:
    """Refuse a per-example file that is not one reproduction's (``UserError`` naming the cell): every line a cell
    with its fields; exactly one line per (model, length, setting); as many scores of every method as labels
    (0 or 1); no example twice in a cell (same label and the same score under every method); one ``n_bootstrap`` and
    ``seed`` for all."""
    if not cells:
        raise UserError(f"{where} holds no cell")
    seen = {}
    for line, c in enumerate(cells, 1):
        if not isinstance(c, dict) or any(k not in c for k in _CELL_KEYS):
            missing = [k for k in _CELL_KEYS if not isinstance(c, dict) or k not in c]
            raise UserError(f"{where} line {line}: not a cell of a reproduction (missing {', '.join(missing)})")
        name = _cell_name(c)
        labels, methods, scores = c["labels"], c["methods"], c["scores"]
        if not (isinstance(c["model"], str) and isinstance(c["length"], int) and c["setting"] in SETTINGS):
            raise UserError(f"{where} line {line}: cell {name}: model, length or setting is not a reproduction's")
        key = (c["model"], c["length"], c["setting"])
        if key in seen:
            raise UserError(f"{where}: cell {name} appears twice (lines {seen[key]} and {line}): a rebuild would pool "
                            "it twice; use the file the run wrote")
        seen[key] = line
        if not isinstance(labels, list) or not labels or any(y not in (0, 1) or isinstance(y, bool) for y in labels):
            raise UserError(f"{where}: cell {name}: labels must be a non-empty list of 0 and 1")
        if (not isinstance(methods, list) or not methods or len(set(map(str, methods))) != len(methods)
                or not isinstance(scores, dict) or any(m not in scores for m in methods)):
            raise UserError(f"{where}: cell {name}: methods must be distinct names, each with its scores")
        for m in methods:
            v = scores[m]
            if not isinstance(v, list) or len(v) != len(labels):
                raise UserError(f"{where}: cell {name}: {m} has {len(v) if isinstance(v, list) else 'no list of'} "
                                f"scores for {len(labels)} labels")
            if any(x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))) for x in v):
                raise UserError(f"{where}: cell {name}: {m} holds a score that is not a number or null")
        rows = {}
        for i, y in enumerate(labels):
            row = (y, *(scores[m][i] for m in methods))
            if any(x is not None for x in row[1:]):
                if row in rows:
                    raise UserError(f"{where}: cell {name}: examples {rows[row]} and {i} are the same example (same "
                                    "label and the same score under every method); use the file the run wrote")
                rows[row] = i
        for k in ("n_bootstrap", "seed"):
            if isinstance(c[k], bool) or not isinstance(c[k], int) or c[k] < 0:
                raise UserError(f"{where}: cell {name}: {k} must be a whole number >= 0, got {c[k]!r}")
            if c[k] != cells[0][k]:
                raise UserError(f"{where}: cell {name} has {k} {c[k]}, the first cell {cells[0][k]}: not one run")


def read_examples(src: Path) -> list[dict]:
    """The cells of a reproduction's ``examples.jsonl.gz``, checked against the folder's ``manifest.json``
    (``rundir.verify``: byte for byte as the run wrote it) and for content (:func:`check_cells`)."""
    rundir.verify(src, REBUILD_READS)
    path = Path(src) / EXAMPLES
    cells = [cell for _, cell in files.read_jsonl(path)]
    check_cells(cells, str(path))
    return cells


def rebuild_outputs(src: Path, cells: list[dict] | None = None) -> tuple[str, dict[str, str | bytes]]:
    """Every table and plot of a reproduction from its ``examples.jsonl.gz`` alone (one line per cell: model,
    length, setting, labels, methods, per-example scores of every method, ref_unit, mirrored, n_bootstrap, seed),
    computed in memory: the cells' rows by :func:`cell_rows`, then :func:`report_outputs`, so the outputs equal those
    of the run that wrote it. Returns (the tables' markdown, {file name: content}); nothing is written. ``cells``:
    those :func:`read_examples` already read from ``src``."""
    cells = read_examples(Path(src)) if cells is None else cells
    results, examples = [], {}
    for c in cells:
        key = (c["model"], c["length"], c["setting"])
        examples[key] = {k: c.get(k) for k in ("labels", "methods", "scores", "ref_unit")}
        results += [dict(r, model=key[0], length=key[1], setting=key[2])
                    for r in cell_rows(c, n_bootstrap=c["n_bootstrap"], seed=c["seed"])]
    mirrored = sorted({c["model"] for c in cells if c.get("mirrored")})
    return report_outputs(results, examples=examples, mirrored=mirrored, n_bootstrap=max(1, cells[0]["n_bootstrap"]),
                          seed=cells[0]["seed"])


def neighbor_kwargs(loaded, n: int, seed: int) -> dict:
    """The paper's Neighbor baseline with the target model proposing the word replacements."""
    return {"neighbors": SelfNeighbors(loaded, n=n, seed=seed)}
