"""File helpers shared by data, models and outputs: content hashes, atomic JSONL writes, gzipped JSONL."""
from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import os
import zlib
from pathlib import Path
from typing import Iterable, Iterator

from mia_jax.errors import UserError


def sha256(path: str | os.PathLike, block: int = 1 << 24) -> str:
    """Hex SHA-256 of a file's bytes (recorded for every model and data file a run reads)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    """Write one JSON object per line atomically (a temporary file of this process's own + rename). A failed write
    removes its temporary; a successful one removes those an earlier, killed process left for the same file (only the
    run folder's holder writes there)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
        os.replace(tmp, path)
    except BaseException:  # disk full, Ctrl-C: no temporary left behind
        tmp.unlink(missing_ok=True)
        raise
    for stale in path.parent.glob(f"{glob.escape(path.name)}.*.tmp"):  # of a process killed mid-write
        stale.unlink(missing_ok=True)


def write_jsonl_gz(path: str | os.PathLike, records: Iterable[dict]) -> None:
    """``records`` as gzip-compressed JSONL (keys sorted), byte-identical for the same records: no file name or time
    in the gzip header (the per-example files committed beside results tables)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        for rec in records:
            gz.write((json.dumps(rec, sort_keys=True) + "\n").encode("utf-8"))
    Path(path).write_bytes(buf.getvalue())


def read_jsonl_gz(path: str | os.PathLike) -> list[dict]:
    """The records of a gzipped JSONL file at ``path`` (blank lines skipped)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_all(folder: str | os.PathLike, outputs: dict[str, str | bytes]) -> None:
    """Write several files (paths relative to ``folder``) so that a failure leaves none of them changed: every file
    goes to a temporary of this process first, then all are renamed into place."""
    folder = Path(folder)
    tmps = []
    try:
        for name, content in outputs.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmps.append((tmp, path))
            if isinstance(content, bytes):
                tmp.write_bytes(content)
            else:
                tmp.write_text(content, encoding="utf-8")
    except BaseException:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in tmps:
        os.replace(tmp, path)


def read_jsonl(path: str | os.PathLike, label: str | None = None) -> Iterator[tuple[int, object]]:
    """(line number, value) of each non-empty line of a JSONL file (``.gz``: gzip-compressed), read strictly for
    the files a command or a rebuild reads: text that is not UTF-8 (a byte-order mark is dropped), a cut or damaged
    gzip stream, or a line that is not JSON is a ``UserError`` naming the file (``label``, default its path) and
    the line. The caller checks each value's shape."""
    name = label or str(path)
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as e:
                    raise UserError(f"{name} line {n}: not valid JSON ({e.msg} at column {e.colno}); the file is "
                                    "cut or damaged") from None
                yield n, value
    except UnicodeDecodeError as e:
        raise UserError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise UserError(f"{name}: a cut or damaged gzip file ({e})") from None
