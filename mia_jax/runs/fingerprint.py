"""What defines a scoring run (``run_fingerprint``), for ``rundir.claim``: a changed input is refused, never
resumed. The texts are identified by one SHA-256 over the texts and labels, computed over the lists here or, for a
corpus read in a window (``mia_jax.data.stream.TextStream.scan``), by the same bytes streamed."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

from mia_jax import __version__


def texts_sha256(texts: Sequence[str], labels: Sequence[int] | None) -> str:
    """The SHA-256 of the texts and their labels (the JSON of ``[texts, labels]``)."""
    blob = json.dumps([list(texts), list(labels) if labels is not None else None], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def run_fingerprint(loaded, texts: Sequence[str] | None, labels: Sequence[int] | None, methods: Sequence[str], *,
                    ref=None, neighbors=None, data_files: dict | None = None,
                    texts_digest: tuple[str, int] | None = None, **options) -> dict:
    """What defines a ``score_dataset`` run, for ``rundir.claim``: the methods, every model file and data file
    by resolved path and SHA-256, the texts and labels themselves (their SHA-256, or ``texts_digest`` = (that
    SHA-256, the number of texts) computed while streaming, with ``texts`` None), the neighbour generator's
    config, the package version and ``options`` (batch size, chunk size, dtype, ...: anything else that can
    change a record)."""
    def resolved(files):
        return {str(Path(p).resolve()): h for p, h in files.items()} if files is not None else None

    digest, n = texts_digest if texts_digest is not None else (texts_sha256(texts, labels), len(texts))
    return {"methods": list(methods), "model_files": resolved(loaded.files),
            "ref_model_files": resolved(ref.files) if ref is not None else None,
            "data_files": resolved(data_files), "texts_sha256": digest, "n_texts": n,
            "neighbors": {"name": neighbors.name, "config": neighbors.config} if neighbors is not None else None,
            **options, "package_version": __version__}
