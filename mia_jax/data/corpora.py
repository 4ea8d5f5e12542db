"""Text corpora shipped with the package (``files/``): the Pile sample that ``mia-jax freq-table`` counts by default
and that the contamination experiments (train/) take as background text (``bundled:pile_sample.jsonl``)."""
from __future__ import annotations

from pathlib import Path

FILES = Path(__file__).parent / "files"
PILE_SAMPLE = FILES / "pile_sample.jsonl"  # 600 Pile test-split documents (files/LICENSE.md)
