"""Reading an audit-unlearning folder back (``mia-jax audit-unlearning --from DIR``): its unlearning.json,
chunks.csv and probes.jsonl, checked against its manifest.json and strictly, cell by cell; ``rebuild`` runs the
audit's ``analyse`` on them, without the models."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mia_jax.runs import files, rundir
from mia_jax.audits.common import cell_bool, cell_float, cell_int, read_csv_rows
from mia_jax.audits.unlearning import PER_SAMPLE, SIDES, Chunk, UnlearningResult, analyse
from mia_jax.audits.unlearning_report import CHUNKS_COLUMNS, REBUILD_READS
from mia_jax.errors import UserError

_CSV_Q = {"min_k": "min_k_nll", "ppl": "ppl"}  # chunks.csv: the column prefix of each method's q (= -score)
_CSV_INT = ("chunk", "source_text", "chunk_in_text", "word_offset", "n_words")
_CSV_FLOAT = [c for c in CHUNKS_COLUMNS[5:] if not c.endswith(("_flagged", "probed"))]
_CSV_BOOL = ("min_k_flagged", "ppl_flagged", "probed")
_RESULT_KEYS = ("config", "methods", "counts", "notes", "flagged_min_k", "flagged_ppl", "probes", "qa")


def _load_json(path: Path) -> dict:
    """unlearning.json, its config, methods, counts and notes checked."""
    try:
        record = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a JSON file ({e})") from None
    missing = [k for k in ("config", "methods", "counts", "notes") if k not in (record if isinstance(record, dict)
                                                                                 else {})]
    if missing:
        raise UserError(f"{path}: no {', '.join(missing)}: not the unlearning.json of `mia-jax audit-unlearning`")
    if not (isinstance(record["methods"], dict) and set(record["methods"]) == set(_CSV_Q)
            and isinstance(record["counts"], dict) and isinstance(record["config"], dict)):
        raise UserError(f"{path}: its methods, counts or config are not those `mia-jax audit-unlearning` writes")
    return record


def _load_chunks(path: Path, methods: dict) -> tuple[list[Chunk], dict, list[int]]:
    """The chunks (positions only: texts are not in chunks.csv), side -> name -> float64 scores and the chunks
    marked probed; every cell checked (``read_csv_rows``, ``cell_*``)."""
    rows = read_csv_rows(path, CHUNKS_COLUMNS, "mia-jax audit-unlearning")
    chunks, probed = [], []
    q = {f"{_CSV_Q[name]}_{side}": np.full(len(rows), np.nan) for name in methods for side in SIDES}
    for i, (line, row) in enumerate(rows):
        where = f"{path} line {line}"
        ints = [cell_int(row, c, where) for c in _CSV_INT]
        for c in _CSV_FLOAT:
            value = cell_float(row, c, where)
            if c in q:
                q[c][i] = value  # written with repr: exact
        flags = {c: cell_bool(row, c, where) for c in _CSV_BOOL}
        if ints[0] != i:
            raise UserError(f"{where} is chunk {ints[0]}, expected {i} (rows in chunk order, none missing)")
        if flags["probed"]:
            probed.append(i)
        chunks.append(Chunk(*ints[1:], text=""))
    return chunks, {side: {name: -q[f"{_CSV_Q[name]}_{side}"] for name in methods} for side in SIDES}, probed


def _load_probes(path: Path, n_chunks: int) -> list[dict]:
    """probes.jsonl, every probe's chunk (one of ``n_chunks``, once) and per-sample values checked."""
    probes = []
    seen = set()
    for n, p in files.read_jsonl(path):
        missing = [k for k in ("chunk", "prompt", "reference", "samples", "rougeL_per_sample")
                   if k not in (p if isinstance(p, dict) else {})]
        if missing:
            raise UserError(f"{path}: line {n} has no {', '.join(missing)} (written by a mia-jax that did not "
                            "keep per-sample values?); rerun the audit to rebuild from it")
        if not (isinstance(p["chunk"], int) and not isinstance(p["chunk"], bool) and 0 <= p["chunk"] < n_chunks):
            raise UserError(f"{path}: line {n} probes chunk {p['chunk']!r}, not one of the {n_chunks} chunks")
        if p["chunk"] in seen:
            raise UserError(f"{path}: line {n} probes chunk {p['chunk']} a second time")
        seen.add(p["chunk"])
        for kind in PER_SAMPLE:
            values = p.get(f"{kind}_per_sample")
            if values is not None and not (isinstance(values, dict) and all(
                    isinstance(values.get(side), list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                               for x in values[side]) for side in SIDES)):
                raise UserError(f"{path}: line {n}: {kind}_per_sample is not a list of numbers per model")
        probes.append(p)
    return probes


def rebuild(folder: str | Path) -> UnlearningResult:
    """The result of the audit whose outputs are in ``folder``, recomputed without the models by ``analyse`` (the
    code the audit runs): the per-chunk scores from chunks.csv, the story-completion probes with their samples and
    per-sample values from probes.jsonl, and config, methods, counts, notes and the QA per-question values from
    unlearning.json (the rest of it, models and command, in ``meta``). Not redone, only read: scoring, sampling,
    which chunks were probed, ROUGE-L and embeddings of each sample, the counts of chunking, truncation and probing.
    Chunk texts are not in the folder (``Chunk.text`` is ""). Reads only: first every file against the folder's
    manifest.json (``rundir.verify``), then strictly (every cell, and the files against each other); UserError for
    a missing, changed or malformed file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"--from {folder}: no such folder")
    rundir.verify(folder, list(REBUILD_READS))
    paths = {name: folder / name for name in REBUILD_READS}
    record = _load_json(paths["unlearning.json"])
    chunks, scores, probed = _load_chunks(paths["chunks.csv"], record["methods"])
    n = record["counts"].get("chunks")
    if n != len(chunks):
        raise UserError(f"{paths['chunks.csv']} has {len(chunks)} chunks, {paths['unlearning.json']} counts {n}")
    probes = _load_probes(paths["probes.jsonl"], len(chunks))
    in_probes = sorted(p["chunk"] for p in probes)
    if in_probes != probed:
        lost = sorted(set(probed) - set(in_probes))
        extra = sorted(set(in_probes) - set(probed))
        raise UserError(f"{paths['chunks.csv']} marks {len(probed)} chunks probed, {paths['probes.jsonl']} holds "
                        f"{len(in_probes)} probes ("
                        + (f"no probe of chunk {lost[0]}" if lost else f"chunk {extra[0]} is not marked probed")
                        + "); the two files are not of one run")
    if record["counts"].get("probed", len(probes)) != len(probes):
        raise UserError(f"{paths['probes.jsonl']} holds {len(probes)} probes, {paths['unlearning.json']} counts "
                        f"{record['counts']['probed']}")
    qa = record.get("qa")
    if qa is not None:
        keys = [f"{k}_{s}" for k in ("min_k_nll", "answer", "recall") for s in SIDES]
        if not all(all(k in q for k in ("question", "answer", *keys)) for q in qa.get("questions", [])):
            raise UserError(f"{paths['unlearning.json']}: its QA questions lack per-question values "
                            f"({', '.join(keys)}); rerun the audit to rebuild from it")
        qa = qa["questions"]
    res = analyse(chunks, record["methods"], scores, record["counts"], record["config"], record["notes"], probes,
                  qa)
    res.meta = {k: v for k, v in record.items() if k not in _RESULT_KEYS}
    return res
