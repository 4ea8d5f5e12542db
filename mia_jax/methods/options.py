"""The options of the methods' needs (:data:`mia_jax.methods.resources.NEEDS`) as a need's builder receives them:
:class:`MethodOptions`, one frozen mapping of every need's option read as ``options.<dest>``, and
:class:`TextFields`, how the data files those options name are read."""
from __future__ import annotations

from dataclasses import dataclass

from mia_jax.runs.options import Options


@dataclass(frozen=True)
class TextFields:
    """How the data files a need reads (``--recall-shots``) are read: as the evaluated data (``--text-field``,
    ``--label-field``: None where the command has none, ``--encoding``)."""
    text_field: str | None = None
    label_field: str | None = None
    encoding: str = "utf-8"


class MethodOptions(Options):
    """Every need's options (``resources.option_dests``, declared by the needs' ``add_arguments``; nothing else of the
    command line), frozen, read as ``options.<dest>``; ``fields``: how the data files they name are read."""

    __slots__ = ("fields",)

    def __init__(self, values=(), fields: TextFields = TextFields()) -> None:
        super().__init__(values)
        if "fields" in self:
            raise ValueError("a need's option may not have the destination 'fields' (MethodOptions.fields)")
        object.__setattr__(self, "fields", fields)

    def __hash__(self) -> int:
        return hash((super().__hash__(), self.fields))

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other) and self.fields == other.fields

    def __reduce__(self):
        return type(self), (dict(self), self.fields)

    def with_values(self, **values) -> MethodOptions:
        return type(self)({**self, **values}, self.fields)
