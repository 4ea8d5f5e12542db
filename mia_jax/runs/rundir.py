"""Run folders: the one guard of every command that writes results into ``--out`` (``mia-jax eval`` /
``score``, each cell of ``scripts/reproduce_wikimia.py``, ``train/contaminate.py`` and each of its runs).

``claim(path, fingerprint)`` decides whether a folder may be used, and only then writes to it:

1. ``path`` must be a folder or not exist (an existing file is refused).
2. An exclusive lock: ``fcntl.flock`` on the folder itself, so taking it writes nothing; a second process
   is refused with the first one's PID (read from ``.lock``, which the holder writes once the folder is
   its own). The lock dies with its process: a killed run never leaves a stale lock behind.
3. The fingerprint (everything that can change a record) is compared with the one in the folder's
   fingerprint file: the same -> the run is resumed from what is there; different -> refused with the list of
   differences. A non-empty folder without a fingerprint file is refused rather than written into (it holds
   something else).
   ``overwrite`` -> the folder is emptied first, only when it holds a run of this toolkit (a run description that
   ``claim`` wrote, :func:`holds_run`), neither is nor holds any of the run's ``inputs`` (the files and folders
   the command reads) and is not inside another run (a folder above it holding a run description, other than one
   this process claimed: the sub-runs of an audit or a sweep). Anything else is refused untouched
   (:func:`check_replace`); the emptying unlinks links, never follows them.
4. Only then the fingerprint file and ``.lock`` are written. Nothing in the folder changes before step 4 (the
   fingerprint file is the first file a claim writes: a folder interrupted before it is still empty).

While a folder is claimed (in the main thread), Ctrl-C (SIGINT) raises KeyboardInterrupt once and is remembered
(:func:`mia_jax.runs.entry.remember_sigint`): Python drops an exception raised inside a garbage-collection callback
("Exception ignored in ..."), so the scoring and training loops call ``check_interrupted()`` after every batch /
step, which raises it again.

Claims are re-entrant within a process (a contamination run in the sweep's own folder claims it twice, with
two fingerprint files). On several JAX processes process 0 alone makes the folder, locks it and decides (steps 1-4);
every other process waits for its verdict (``processes.broadcast_json``) and touches nothing before it: on a refusal
each raises the same ``UserError``; otherwise it makes its own copy of the folder where the hosts do not share a
disk, and writes only its own files (``records.Sink``'s per-process records).
"""
from __future__ import annotations

import csv
import fcntl
import gzip
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from mia_jax.runs import processes
from mia_jax.runs.entry import check_out, remember_sigint
from mia_jax.errors import UserError
from mia_jax.runs.files import sha256
from mia_jax.runs.processes import broadcast_json, is_main_process

LOCK = ".lock"
FINGERPRINT = "config.json"
HINT = "use another --out, or --overwrite to replace it"
MARK = {"written_by": "mia_jax.runs.rundir"}  # the first entry of every run description (not part of the fingerprint)
_MARK_BYTES = json.dumps(MARK, indent=2)[:-2].encode()  # how a description file begins: '{\n  "written_by": ...'
_HELD: dict[str, int | None] = {}  # resolved path -> the lock's fd (None on processes other than 0)


def diff(old, new, prefix: str = "") -> list[str]:
    """Human-readable differences between two JSON-like dicts: ``["train.lr: 0.001 -> 1e-05", ...]``."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [f"{prefix.rstrip('.') or 'fingerprint'}: {old!r} -> {new!r}"]
    out = []
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {_short(a)} -> {_short(b)}")
    return out


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _lock(path: Path, flag: str = "--out") -> int:
    """The folder ``path`` locked (its fd), or a UserError naming the process holding it and ``flag``, the option
    that chose the folder."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        try:
            pid = (path / LOCK).read_text().strip() or "unknown"
        except OSError:
            pid = "unknown"
        raise UserError(f"{path} is in use by another process (PID {pid}); wait for it to finish, or use "
                        f"another {flag}") from None
    return fd


def holds_run(folder: str | os.PathLike) -> str | None:
    """The name of the run description (a ``*.json`` file that :func:`claim` wrote, beginning with :data:`MARK`)
    directly in ``folder``, else None: a folder holding one holds a run of this toolkit (an unreadable folder or file
    holds none)."""
    try:
        found = sorted(p for p in Path(folder).iterdir() if p.suffix == ".json" and not p.is_symlink() and p.is_file())
    except OSError:
        return None
    return next((p.name for p in found if _marked(p)), None)


def _marked(path: Path, cut: bool = False) -> bool:
    """Whether the file ``path`` begins as a run description that ``claim`` wrote (with :data:`MARK`); ``cut``: or
    is the beginning of one (empty, or cut inside the mark: a write killed at its start)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_MARK_BYTES))
    except OSError:
        return False
    return head == _MARK_BYTES or (cut and _MARK_BYTES.startswith(head))


def _contents(path: Path, file: str) -> tuple[list[str], list[Path]]:
    """(names of what ``path`` holds, the leftovers of an interrupted claim in it): the leftovers, set apart, are
    the lock and a run description ``file`` that a claim was killed while writing (``<file>.<pid>.tmp``, the first
    file a claim writes): a folder holding nothing else counts as empty."""
    names, leftovers = [], []
    for p in sorted(path.iterdir()):
        if p.name == LOCK or (p.name.startswith(f"{file}.") and p.name.endswith(".tmp") and not p.is_symlink()
                              and p.is_file() and _marked(p, cut=True)):
            leftovers.append(p)
        else:
            names.append(p.name)
    return names, leftovers


def _within(item: Path, folder: Path) -> bool:
    """Whether ``item`` is ``folder`` or lies under it, compared both as given and with links resolved (an input
    reached through a link into the folder, or by a path through it that a link leads elsewhere, counts)."""
    return any(i == f or f in i.parents for f in {folder.absolute(), folder.resolve()}
               for i in {item.absolute(), item.resolve()})


def check_replace(path: str | os.PathLike, inputs=()) -> None:
    """Refuse (a one-line ``UserError``, nothing touched) to empty the non-empty folder ``path`` for ``--overwrite``
    unless it holds a run of this toolkit (:func:`holds_run`), neither is nor holds any of the run's ``inputs``
    (paths; None and paths that do not exist are left out) and no folder above it holds a run other than one this
    process holds (an audit's or a sweep's own sub-runs)."""
    path = Path(path)
    for item in inputs:
        if item is not None and os.path.lexists(item) and _within(Path(item), path):
            how = "is" if Path(item).resolve() == path.resolve() else "holds"
            raise UserError(f"--overwrite: {path} {how} {item}, an input of this run, which emptying it would "
                            "delete; nothing was removed: give another --out")
    for parent in path.resolve().parents:
        found = None if str(parent) in _HELD else holds_run(parent)
        if found:
            raise UserError(f"--overwrite: {path} is inside the run in {parent} ({found}), whose files emptying it "
                            "would delete; nothing was removed: give another --out")
    if not holds_run(path):
        found = sorted(p.name for p in path.iterdir() if p.name != LOCK)
        raise UserError(f"--overwrite: {path} holds no run of mia_jax (no run description written by it; found "
                        f"{', '.join(found[:5])}{' ...' if len(found) > 5 else ''}) and --overwrite replaces only a "
                        "run; nothing was removed: give another --out, or remove the folder yourself")


def _empty(path: Path) -> None:
    """Remove everything in ``path`` but the lock: links are unlinked, never followed (``shutil.rmtree`` does not
    follow the links inside a folder either)."""
    for child in path.iterdir():
        if child.name == LOCK:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


@contextmanager
def claim(path: str | os.PathLike, fingerprint: dict | None = None, *, overwrite: bool = False, inputs=(),
          file: str = FINGERPRINT, hint: str = HINT, flag: str = "--out") -> Iterator[bool]:
    """Hold ``path`` for a run; yields True when it holds an earlier (possibly unfinished) run of the same
    fingerprint to resume. ``fingerprint=None``: lock only (a folder of sub-runs, each claimed on its own).
    ``flag``: the option that chose the folder, named when another process holds it.
    ``overwrite``: empty the folder first, refused (:func:`check_replace`) unless it holds a run and none of
    ``inputs`` (every file and folder the command reads; None and names that are no path are skipped)."""
    path = check_out(path)
    key = str(path.resolve())
    if key in _HELD:  # re-entrant: the outer claim already holds the lock
        yield _decide(path, fingerprint, overwrite, inputs, file, hint, writer=_HELD[key] is not None, fresh=False)
        return
    main, fd = is_main_process(), None
    try:
        verdict: dict = {}
        if main:
            try:
                path.mkdir(parents=True, exist_ok=True)
                fd = _lock(path, flag)
                verdict["resume"] = _decide(path, fingerprint, overwrite, inputs, file, hint, writer=True,
                                            fresh=True)
                (path / LOCK).write_text(f"{os.getpid()}\n")
            except UserError as e:
                verdict["error"] = str(e)
        verdict = broadcast_json(verdict)  # the others wait for process 0's verdict before touching the folder
        if "error" in verdict:
            raise UserError(verdict["error"])
        if not main:
            path.mkdir(parents=True, exist_ok=True)  # one disk per host: this host's copy of the folder
        _HELD[key] = fd
        with remember_sigint():
            yield verdict["resume"]
    finally:
        _HELD.pop(key, None)
        if fd is not None:
            (path / LOCK).unlink(missing_ok=True)
            os.close(fd)  # releases the lock


def _decide(path: Path, fingerprint: dict | None, overwrite: bool, inputs, file: str, hint: str, writer: bool,
            fresh: bool) -> bool:
    """``writer``: this process writes (process 0); ``fresh``: the outermost claim of the folder in this process."""
    fp_path = path / file
    if not writer and (overwrite or not fp_path.exists()):
        return False  # process 0 empties / checks / writes the folder; the others only compare what is there
    if fingerprint is not None:
        fingerprint = json.loads(json.dumps(fingerprint))  # the form it takes on disk (tuples -> lists, ...)
    if overwrite and writer and fresh and _contents(path, file)[0]:
        check_replace(path, inputs)
        _empty(path)
    if fp_path.exists():
        try:
            old = json.loads(fp_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise UserError(f"{fp_path} is not valid JSON (the folder's run description is damaged); {hint}") from None
        if isinstance(old, dict):
            old = {k: v for k, v in old.items() if k not in MARK}  # the mark is no part of the fingerprint
        if fingerprint is None or old == fingerprint:
            return True
        changes = diff(old, fingerprint)
        more = f" and {len(changes) - 8} more" if len(changes) > 8 else ""
        raise UserError(f"{path} holds a different run (differs in: {'; '.join(changes[:8])}{more}); {hint}")
    if fingerprint is not None:
        others, leftovers = _contents(path, file)
        if others and fresh:
            raise UserError(f"{path} is not empty and holds no run description ({file}): found "
                            f"{', '.join(others[:5])}{' ...' if len(others) > 5 else ''}; refusing to write into it: "
                            "give another --out (a new or empty folder)")
        if writer:
            tmp = fp_path.with_name(f"{file}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**MARK, **fingerprint}, indent=2) + "\n")
            os.replace(tmp, fp_path)
            for p in leftovers:  # an interrupted claim's description: this one replaces it
                if p.name != LOCK:
                    p.unlink(missing_ok=True)
    return False


# ----------------------------------------------------------------------------- what a run wrote, for its rebuilds

MANIFEST = "manifest.json"
REBUILD = "rebuild.json"
_NOT_SEALED = {LOCK, MANIFEST, REBUILD}


def rows(path: Path) -> int | None:
    """Rows of a data file as its reader sees them: non-empty lines of .jsonl / .jsonl.gz, records of a .csv (header
    excluded); None for other files."""
    name = path.name
    if name.endswith(".jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return sum(1 for line in fh if line.strip())
    if name.endswith(".jsonl"):
        with open(path, encoding="utf-8") as fh:
            return sum(1 for line in fh if line.strip())
    if name.endswith(".csv"):
        with open(path, newline="", encoding="utf-8-sig") as fh:
            return max(sum(1 for _ in csv.reader(fh)) - 1, 0)
    return None


def seal(folder: str | os.PathLike, names: list[str] | None = None) -> dict:
    """Record the SHA-256, size and row count of the files a run wrote (``names``, relative to ``folder``; default:
    every file in it but the lock, fingerprint-free bookkeeping and temporaries) in ``folder/manifest.json``, at the
    end of the run: every ``--from`` rebuild checks its inputs against it (``verify``)."""
    folder = Path(folder)
    if names is None:
        names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                       if p.is_file() and p.name not in _NOT_SEALED and not p.name.endswith(".tmp"))
    entries = {}
    for name in names:
        path = folder / name
        try:
            count = rows(path)
        except (OSError, EOFError, ValueError, UnicodeDecodeError):  # not readable as its kind: hash and size only
            count = None
        entries[name] = {"sha256": sha256(path), "bytes": path.stat().st_size, "rows": count}
    tmp = folder / f"{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"files": entries}, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder / MANIFEST)
    return entries


def verify(folder: str | os.PathLike, names: list[str], flag: str = "--from") -> dict:
    """Check that each of ``names`` (the files a rebuild reads) is in ``folder``, byte for byte as the run wrote it
    (``seal``); a ``UserError`` names the first file that is missing, changed, cut or not recorded."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise UserError(f"{flag} {folder}: no {MANIFEST} (the record of what the run wrote, made at its end): the run "
                        "did not finish, or the folder was made by another program or an older mia_jax; rerun it")
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["files"]
        assert isinstance(entries, dict) and all(isinstance(e, dict) and "sha256" in e for e in entries.values())
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AssertionError):
        raise UserError(f"{flag} {folder}: {MANIFEST} is damaged (not the JSON a run writes); use an intact copy of "
                        "the folder") from None
    for name in names:
        if name not in entries:
            raise UserError(f"{flag} {folder}: {name} is not among the files the run recorded in {MANIFEST}")
        file = folder / name
        if not file.is_file():
            raise UserError(f"{flag} {folder}: {name} is missing (the run wrote it; {MANIFEST} records it)")
        want = entries[name]
        if file.stat().st_size != want.get("bytes", file.stat().st_size) or sha256(file) != want["sha256"]:
            try:
                got = rows(file)
            except (OSError, ValueError, UnicodeDecodeError, EOFError):
                got = None
            detail = (f"{got} rows where the run wrote {want['rows']}" if want.get("rows") is not None and got is not
                      None and got != want["rows"] else "its bytes differ from what the run wrote")
            raise UserError(f"{flag} {folder}: {name} was changed or cut after the run ({detail}); rebuild from an "
                            "intact copy")
    return entries


@contextmanager
def rebuild_into(out: str | os.PathLike, sources: list[str | os.PathLike], kind: str) -> Iterator[bool]:
    """Hold ``out`` for a rebuild of ``sources``; yields True for a rebuild in place (``out`` is the one source:
    the caller validates every input and computes every output before writing any, ``files.write_all``). Any other
    ``out`` must be empty, new, or this rebuild's own earlier output of the same sources (their manifests
    unchanged): a folder holding anything else (another run, another rebuild) is refused untouched."""
    out = check_out(out)
    srcs = [Path(s) for s in sources]
    if len(srcs) == 1 and out.exists() and out.resolve() == srcs[0].resolve():
        with claim(out, None):
            yield True
        return
    if any(out.resolve() == s.resolve() or s.resolve() in out.resolve().parents for s in srcs):
        raise UserError(f"--out {out} is inside a --from folder; give a folder of its own")
    fingerprint = {"rebuild": kind, "from": {str(s): sha256(s / MANIFEST) if (s / MANIFEST).is_file() else None
                                             for s in srcs}}
    with claim(out, fingerprint, file=REBUILD, hint="give an empty or new --out"):
        yield False
