"""File helpers shared by data, models and outputs: content hashes and atomic JSONL writes."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable


def sha256(path: str | os.PathLike, block: int = 1 << 24) -> str:
    """Hex SHA-256 of a file's bytes (recorded for every model and data file a run reads)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    """Write one JSON object per line atomically (a temporary file of this process's own + rename)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
    os.replace(tmp, path)
