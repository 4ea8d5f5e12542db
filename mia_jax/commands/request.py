"""The request of ``mia-jax eval`` / ``score``: the parsed command line made once, where the command starts
(:meth:`ScoreRequest.from_args`), into frozen, typed parts by concern, each passed down to the layer that reads it:
:class:`DataRequest` (which texts), :class:`ModelRequest` (which models), :class:`MethodsRequest` (which methods and
their options), :class:`PlanRequest` (how the scoring runs) and :class:`OutputRequest` (where the output goes and
what the report computes). Every field is named after its option's destination; run.json's "config" is the
request read back in the command line's order (:meth:`ScoreRequest.config`).

The other commands' requests (each beside its command) are frozen dataclasses built the same way by
:class:`CommandRequest`; :func:`check_holds` is the check all of them share: every parsed option lands in the request,
as parsed. :class:`AuditRunRequest` is the part both audit commands share."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, get_args, get_origin, get_type_hints

from mia_jax import benchmarks
from mia_jax.methods import resources
from mia_jax.methods.options import MethodOptions, TextFields
from mia_jax.runs.options import Options, frozen

Command = Literal["eval", "score"]
DType = Literal["float32", "bfloat16"]


@dataclass(frozen=True)
class DataRequest:
    """Which texts: ``--data`` (a file, or ``tfds:...``) or ``--benchmark`` (eval) with every benchmark's own options
    (``benchmark_options``), read from ``--data-dir`` with ``--encoding`` / ``--text-field`` / ``--label-field``
    (None: score has none), cut to ``--limit``; a file of more than ``--stream-window`` texts is streamed."""
    data: Path | str | None
    data_dir: Path | None
    encoding: str
    text_field: str | None
    limit: int | None
    stream_window: int
    label_field: str | None = None
    benchmark: str | None = None
    benchmark_options: Options = Options()

    def text_fields(self) -> TextFields:
        """How the data files the methods' options name are read: as these texts."""
        return TextFields(self.text_field, self.label_field, self.encoding)


@dataclass(frozen=True)
class ModelRequest:
    """Which models: ``--model`` (its ``--tokenizer``), ``--ref-model``, ``--neighbor-mlm``, their ``--dtype`` (None
    until :meth:`ScoreRequest.resolved`: the device's default) and ``--allow-download``."""
    model: str
    tokenizer: Path | None
    dtype: DType | None
    allow_download: bool
    ref_model: str | None
    neighbor_mlm: Path | None

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in get_args(DType):
            raise ValueError(f"dtype must be one of {get_args(DType)}, got {self.dtype!r}")


@dataclass(frozen=True)
class MethodsRequest:
    """Which methods: ``--methods`` (a bare min_k etc. expanded by ``--k``), the neighbour generator's
    ``--n-neighbors`` / ``--neighbor-seed``, the --compare pairs (eval) and ``options``: every need's options
    (``resources.method_options``)."""
    methods: tuple[str, ...]
    k: tuple[float, ...]
    n_neighbors: int
    neighbor_seed: int
    options: MethodOptions
    compare: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PlanRequest:
    """How the scoring runs: ``--tokens-per-batch`` (None until :meth:`ScoreRequest.resolved`), ``--batch-size``,
    ``--chunk-size``, ``--mesh``, ``--distributed`` and ``--compilation-cache``."""
    tokens_per_batch: int | None
    batch_size: int
    chunk_size: int | None
    mesh: str | None
    distributed: bool
    compilation_cache: str | None


@dataclass(frozen=True)
class OutputRequest:
    """Where the output goes (``--out``, ``--overwrite``), ``--no-progress``, and the report's bootstrap
    (``--n-bootstrap``, ``--seed``) and blind baseline (``--no-blind``); score has none of the last three: 0, 0 and
    False (no metrics)."""
    out: Path | None
    overwrite: bool
    no_progress: bool
    n_bootstrap: int = 0
    seed: int = 0
    no_blind: bool = False


@dataclass(frozen=True)
class ScoreRequest:
    """One ``eval`` (``command`` "eval": labeled texts, metrics) or ``score`` run as asked; ``order``: the command
    line's destinations in the parser's order (run.json's "config")."""
    command: Command
    data: DataRequest
    model: ModelRequest
    methods: MethodsRequest
    plan: PlanRequest
    output: OutputRequest
    order: tuple[str, ...]

    @property
    def labeled(self) -> bool:
        return self.command == "eval"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ScoreRequest:
        """The request of the parsed ``args`` of ``eval`` or ``score``; every option lands in exactly one part."""
        given = dict(vars(args))
        labeled = given["command"] == "eval"

        def part(kind, **extra):
            names = [f.name for f in fields(kind) if f.name in given and f.name not in extra]
            return kind(**{n: frozen(given[n]) for n in names}, **extra)

        data = part(DataRequest, benchmark_options=Options.of(given, benchmarks.option_dests() if labeled else ()))
        request = cls(command=given["command"], data=data, model=part(ModelRequest),
                      methods=part(MethodsRequest, options=resources.method_options(given, data.text_fields())),
                      plan=part(PlanRequest), output=part(OutputRequest), order=tuple(given))
        check_holds(given, request._given())
        return request

    def resolved(self, *, dtype: str, tokens_per_batch: int) -> ScoreRequest:
        """This request with the device's defaults filled in where ``--dtype`` / ``--tokens-per-batch`` were not
        given."""
        return replace(self, model=replace(self.model, dtype=self.model.dtype or dtype),
                       plan=replace(self.plan, tokens_per_batch=self.plan.tokens_per_batch or tokens_per_batch))

    def _given(self) -> dict[str, Any]:
        """{option destination: value} of every option the request holds (``order`` itself is none)."""
        return {d: v for d, v in held_options(self).items() if d in self.order}

    def config(self) -> dict[str, Any]:
        """run.json's "config": every option's value (lists as lists) in the command line's order."""
        held = self._given()
        return {d: _plain(held[d]) for d in self.order}


def check_holds(given: Mapping[str, Any], held: Mapping[str, Any], exact: bool = False) -> None:
    """RuntimeError naming every parsed option (``given``: ``vars(namespace)``) that a request (``held``: {option
    destination: value}) does not hold as parsed (lists as tuples); ``exact``: also every value it holds that is no
    parsed option."""
    lost = sorted(d for d in given if d not in held or not _same(held[d], frozen(given[d])))
    if lost:
        raise RuntimeError(f"the request does not hold these options as parsed: {', '.join(lost)}")
    extra = sorted(d for d in held if d not in given) if exact else []
    if extra:
        raise RuntimeError(f"the request holds values that are no option of the command: {', '.join(extra)}")


def build(kind: type, given: Mapping[str, Any]) -> Any:
    """The frozen dataclass ``kind`` with each field the option of its name in ``given`` (lists as tuples); a field
    typed as a dataclass is built the same way from ``given`` (a part of the request), a field typed Literal is
    checked to be one of its choices (ValueError)."""
    hints = get_type_hints(kind)
    values = {}
    for f in fields(kind):
        hint = hints[f.name]
        if isinstance(hint, type) and is_dataclass(hint):
            values[f.name] = build(hint, given)
            continue
        values[f.name] = value = frozen(given[f.name])
        if get_origin(hint) is Literal and value not in get_args(hint):
            raise ValueError(f"{f.name} must be one of {get_args(hint)}, got {value!r}")
    return kind(**values)


def held_options(request: Any) -> dict[str, Any]:
    """{option destination: value} of every option the dataclass ``request`` holds, its parts' (dataclass fields)
    and its registries' (``Options`` fields: a benchmark's, the methods') too; RuntimeError for two of the same
    destination."""
    held: dict[str, Any] = {}
    for f in fields(request):
        value = getattr(request, f.name)
        own = value.items() if isinstance(value, Options) else [(f.name, value)]
        for d, v in (held_options(value).items() if is_dataclass(value) else own):
            if d in held:
                raise RuntimeError(f"two options of the request have the destination {d!r}")
            held[d] = v
    return held


class CommandRequest:
    """Base of a command's request: a frozen dataclass whose fields are the command's options by destination, or
    parts (frozen dataclasses) grouping them by concern. ``COMMAND``: the subcommand (``vars(args)["command"]``)."""
    COMMAND: ClassVar[str]

    @classmethod
    def from_args(cls, args: argparse.Namespace):
        """The request of the parsed ``args`` of the command: every option lands in exactly one field, and every
        field is an option (RuntimeError otherwise: a parser and a request out of step)."""
        given = dict(vars(args))
        command = given.pop("command", cls.COMMAND)
        if command != cls.COMMAND:
            raise ValueError(f"{cls.__name__} of a {command!r} command line")
        request = build(cls, given)
        check_holds(given, held_options(request), exact=True)
        return request

    def options(self) -> dict[str, Any]:
        """{option destination: value} of every option, lists as lists (as argparse gave them): what a fingerprint
        records."""
        return {d: _plain(v) for d, v in held_options(self).items()}


@dataclass(frozen=True)
class AuditRunRequest:
    """What both audit commands share (:func:`mia_jax.commands.audit_options.model_options`): how their models are
    loaded (``--dtype``, ``--allow-download``) and scored (``--batch-size``, ``--chunk-size``), and how their scoring
    runs are kept (``--overwrite``, ``--no-progress``)."""
    dtype: DType
    batch_size: int
    chunk_size: int | None
    allow_download: bool
    overwrite: bool
    no_progress: bool


def _same(a: Any, b: Any) -> bool:
    return a is b or a == b


def _plain(value: Any) -> Any:
    """``value`` with its tuples as lists (nested too): as argparse gave it."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value
