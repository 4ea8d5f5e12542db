"""Reading a ``--from`` folder of the contamination experiments (one run, or a sweep of runs): every file a rebuild
reads checked against the folder's manifest.json (``rundir.verify``), then every field the tables read (a
``UserError`` names the file, and the line of examples.jsonl.gz)."""
from __future__ import annotations

import json
from pathlib import Path

from mia_jax.runs import files, rundir
from mia_jax.errors import UserError
from train import ablations
from train.records import EXAMPLES, RUN, RUN_FILES, by_dataset


def _neither() -> str:
    return (f"neither a run folder ({RUN} and {EXAMPLES}) nor a sweep folder (sub-folders {ablations.folders_named()} "
            "holding them)")


def source_runs(folder: Path, flag: str = "--from") -> tuple[str | None, list[str]]:
    """(sweep kind or None for one run, [sub-folder names, "" for the run itself]) of a ``--from`` folder, after
    checking every file a rebuild reads against the folder's manifest.json (``rundir.verify``: the files the run
    wrote, unchanged). A sweep's runs are those its manifest records and those on disk: one missing or added is an
    error."""
    folder = Path(folder)
    if (folder / EXAMPLES).exists() or (folder / RUN).exists():
        rundir.verify(folder, list(RUN_FILES), flag)
        return None, [""]
    on_disk = {p.name for p in folder.iterdir() if p.is_dir() and ((p / EXAMPLES).exists() or (p / RUN).exists())}
    if not on_disk and not (folder / rundir.MANIFEST).is_file():
        raise UserError(f"{flag} {folder}: {_neither()}")
    entries = rundir.verify(folder, [], flag)
    recorded = {n.split("/", 1)[0] for n in entries if "/" in n and n.split("/", 1)[1] in RUN_FILES}
    subs = sorted(on_disk | recorded)
    kind = ablations.sweep_kind(folder, entries, subs)
    if not subs or kind is None:
        raise UserError(f"{flag} {folder}: {_neither()}; found {', '.join(subs) or 'no run'}")
    own = [rundir.FINGERPRINT] if rundir.FINGERPRINT in entries else []  # the sweep's record of its kind
    rundir.verify(folder, own + [f"{s}/{f}" for s in subs for f in RUN_FILES], flag)
    for s in subs:  # and each run's own record (the same files: a damaged one is refused, not passed over)
        rundir.verify(folder / s, list(RUN_FILES), flag)
    return kind, subs


def _get(obj, path: str, kind, where: str):
    """``obj[a][b]...`` for the dotted ``path``, checked to be of ``kind``; UserError naming ``where`` otherwise."""
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            raise UserError(f"{where} lacks {path} (not the run.json of a contamination run)")
        obj = obj[part]
    if not isinstance(obj, kind) or isinstance(obj, bool):
        raise UserError(f"{where}: {path} is {obj!r:.60}, not the {getattr(kind, '__name__', 'value')} a run writes")
    return obj


_NUMBER = (int, float)


def _check_row(row, where: str) -> None:
    if not isinstance(row, dict):
        raise UserError(f"{where}: not a JSON object")
    for key in ("dataset", "label", "text_sha256", "trained", "base"):
        if key not in row:
            raise UserError(f"{where}: no {key!r} field (a record of {EXAMPLES} has dataset, label, text_sha256, "
                            "blind, trained, base)")
    if not isinstance(row["dataset"], str) or row["label"] not in (0, 1) or isinstance(row["label"], bool):
        raise UserError(f"{where}: dataset must be a string and label 0 or 1, got {row['dataset']!r:.40}, "
                        f"{row['label']!r:.20}")
    for model in ("trained", "base"):
        scores = row[model]
        if not isinstance(scores, dict) or not all(
                v is None or (isinstance(v, _NUMBER) and not isinstance(v, bool)) for v in scores.values()):
            raise UserError(f"{where}: {model!r} must map each method to a number or null")
    b = row.get("blind")
    if not (b is None or (isinstance(b, _NUMBER) and not isinstance(b, bool))):
        raise UserError(f"{where}: 'blind' must be a number or null, got {b!r:.40}")
    if "occurrences" in row and (not isinstance(row["occurrences"], int) or isinstance(row["occurrences"], bool)):
        raise UserError(f"{where}: 'occurrences' must be a whole number, got {row['occurrences']!r:.20}")


def load_run(folder: Path, kind: str | None = None) -> dict:
    """A run's ``run.json`` with its example rows under ``examples``, every field the tables read checked (a
    ``UserError`` names the file, and the line of examples.jsonl.gz). Call after :func:`source_runs` (verified)."""
    folder = Path(folder)
    path = folder / RUN
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(info, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(info).__name__}")
    methods = _get(info, "methods", list, str(path))
    if not methods or not all(isinstance(m, str) for m in methods):
        raise UserError(f"{path}: methods must be a non-empty list of method names")
    _get(info, "config.score.n_bootstrap", int, str(path))
    _get(info, "config.score.seed", int, str(path))
    _get(info, "config.corpus", dict, str(path))
    _get(info, "config.model.path", str, str(path))
    ablation = ablations.ABLATIONS.get(kind)  # None: one run
    for key, typ in ablation.fields if ablation else ():
        _get(info, key, typ, str(path))
    ex = folder / EXAMPLES
    rows = []
    for n, row in files.read_jsonl(ex):
        _check_row(row, f"{ex} line {n}")
        rows.append(row)
    if not rows:
        raise UserError(f"{ex} holds no example")
    for d, idx in by_dataset(rows).items():
        n_members = sum(rows[i]["label"] for i in idx)
        if n_members in (0, len(idx)):
            raise UserError(f"{ex}: dataset {d} has one class only ({n_members} members, {len(idx) - n_members} "
                            "non-members): not the eval set of a contamination run")
    if info["config"]["corpus"].get("occurrence") in ("poisson", "buckets") or (ablation and ablation.occurrences):
        missing = next((i for i, r in enumerate(rows) if "occurrences" not in r), None)
        if missing is not None:
            raise UserError(f"{ex}: record {missing + 1} has no 'occurrences' (needed for Figure 5c)")
    return dict(info, examples=rows)


def load_source(folder: Path, flag: str = "--from") -> tuple[str | None, list[tuple[str, dict]]]:
    """(sweep kind or None, [(sub-folder name, :func:`load_run`)]) of a ``--from`` folder, verified and checked."""
    kind, subs = source_runs(folder, flag)
    return kind, [(s, load_run(Path(folder) / s if s else Path(folder), kind)) for s in subs]
