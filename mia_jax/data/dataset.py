"""The record model every reader of :mod:`mia_jax.data` shares: a loaded :class:`Dataset`, the text fields looked
for, the labels' rule, and the TFDS datasets this project builds. The file readers (:mod:`mia_jax.data`) and the TFDS
reader (:mod:`mia_jax.data.tfds_source`) both build on it, so neither imports the other for it."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mia_jax.errors import UserError

# the TFDS datasets `mia-jax datasets build` makes (mia_jax.data.builders.BUILDERS), named here so that the CLI lists
# them without importing tensorflow-datasets
TFDS_DATASETS = ("wikimia", "mimir", "contamination")


@dataclass
class Dataset:
    """A loaded dataset: its ``texts``, ``labels`` (1 member, 0 non-member; None when unlabeled), ``name``, the
    ``files`` read (path -> SHA-256), the ``extra`` fields asked for and the ``text_field`` read."""
    texts: list[str]
    labels: list[int] | None  # 1 = member, 0 = non-member; None for unlabeled data
    name: str
    files: dict[str, str] = field(default_factory=dict)  # path -> sha256
    extra: dict[str, list] = field(default_factory=dict)  # other fields asked for: {field: [value or None per row]}
    text_field: str | None = None  # the field the texts were read from, where one was

    def __len__(self) -> int:
        return len(self.texts)


def label_of(value, path: Path, where: int) -> int:
    """A row's label ``value`` as 0 (non-member) or 1 (member): 0/1 as a number, a bool or a string; anything else is
    a UserError naming ``path`` and row ``where``."""
    if isinstance(value, str) and value.strip() in ("0", "1"):
        return int(value)
    if isinstance(value, (bool, int, float)) and value in (0, 1):
        return int(value)
    raise UserError(f"{path}: row {where} has label {value!r}; labels must be 0 (non-member) or 1 (member)")


# the text fields looked for when none is named (--text-field left out): a corpus's `text`, WikiMIA's `input`
TEXT_FIELDS = ("text", "input")


def default_text_field(fields, where: str, kind: str = "field") -> str:
    """The one of :data:`TEXT_FIELDS` among ``fields`` (a file's first object's fields, or a dataset's features:
    ``kind``); both or neither: a UserError that starts with ``where`` (e.g. "FILE: row 1")."""
    fields = list(fields)
    found = [f for f in TEXT_FIELDS if f in fields]
    if len(found) != 1:
        has = f"both a 'text' and an 'input' {kind}" if found else f"neither a 'text' nor an 'input' {kind}"
        raise UserError(f"{where} has {has} ({kind}s: {', '.join(map(str, fields))}); choose the {kind} with "
                        "--text-field")
    return found[0]
