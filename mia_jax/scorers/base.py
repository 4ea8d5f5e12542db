"""The method registries (single-pass scorers, multi-pass methods), the resources a scorer may read, and the host
container of one batch's statistics."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, NamedTuple, Sequence

import numpy as np

from mia_jax import checks
from mia_jax.errors import UserError
from mia_jax.stats import TemperedStats, TokenStats

# what a formula's positional parameters may be named: the fields of ``TokenStats``, those of ``TemperedStats`` (the
# statistics at the temperatures of the resource it reads as ``temperatures``), the mask of the scored tokens, and
# the target token ids; ``device_scores`` passes each by name
ARRAYS = (*TokenStats._fields, *TemperedStats._fields, "mask", "ids")
TEMPERATURES = "temperatures"  # the keyword of the resource whose array holds the kernel's temperatures


@dataclass
class TokenBatch:
    """One batch on the host, for ``score_batch``: per-token statistics ``[B, T]``, the mask of the scored tokens,
    the texts (``zlib`` reads their compressed length), the target ids (``[B, T]``, None when the caller has none),
    the resources (``Scorer.resources`` names them, e.g. ``freq_table``) and the tempered statistics ``[B, T, K]``
    (``stats.token_stats(..., temperatures=)``; None when no method reads them). A container only: the formulas are
    the registered ``jax.numpy`` functions."""

    stats: TokenStats
    mask: np.ndarray
    texts: Sequence[str] | None = None
    ids: np.ndarray | None = None
    resources: Mapping[str, Any] = field(default_factory=dict)
    tempered: TemperedStats | None = None

    def __post_init__(self):
        self.stats = TokenStats(*(np.asarray(x) for x in self.stats))
        if self.tempered is not None:
            self.tempered = TemperedStats(*(np.asarray(x) for x in self.tempered))
        self.mask = np.asarray(self.mask, bool)
        if self.mask.shape != self.stats.logprob.shape:
            raise UserError(f"mask shape {self.mask.shape} != statistics shape {self.stats.logprob.shape}")
        if self.ids is not None:
            self.ids = np.asarray(self.ids, np.int64)
            if self.ids.shape != self.mask.shape:
                raise UserError(f"ids shape {self.ids.shape} != mask shape {self.mask.shape}")


@dataclass(frozen=True)
class Scorer:
    """A single-pass method: one pure ``jax.numpy`` formula of per-token arrays, ``fn(*arrays, **keywords) -> [B]``.

    ``arrays``: its positional parameters, by name (``ARRAYS``: a ``TokenStats`` field, ``mask`` or ``ids``);
    ``takes_k``: it takes the fraction ``k=`` (the method name's ``@k``); ``needs_text``: it takes ``zlib_bytes=``,
    each text's zlib-compressed length (from the texts: ``scorers.zlib_bytes``); ``needs_ids``: it reads the target
    token ids; ``resources``: the resources it reads (``RESOURCES``), each passed as the keyword
    ``resource_keywords[i]``. All of it is read from ``fn``'s signature by ``register``."""

    name: str
    fn: Callable[..., Any]
    takes_k: bool = False
    needs_text: bool = False
    doc: str = ""
    needs_ids: bool = False
    resources: tuple[str, ...] = ()
    arrays: tuple[str, ...] = ("logprob", "mask")
    resource_keywords: tuple[str, ...] = ()

    @property
    def temperature_resource(self) -> str | None:
        """The resource whose array is the temperatures of the ``TemperedStats`` this formula reads (its keyword
        ``temperatures``), or None when it reads none."""
        if not set(self.arrays) & set(TemperedStats._fields):
            return None
        return self.resources[self.resource_keywords.index(TEMPERATURES)]


@dataclass(frozen=True)
class MultiPassMethod:
    """A method that needs a second pass of the scoring path (``mia_jax.engine.passes`` says what each ``pass_kind``
    reads: ``lowercase`` the lowercased texts, ``ref`` the texts with a reference model, ``neighbor`` every text's
    neighbours, ...). ``combine(main, other, texts)`` -> (scores [N], {row: why its score is NaN}), from the
    ``pass_method`` score (a single-pass method, default ``loss``: the mean log-likelihood) of each text on the
    main pass and folded from the second pass (several second passes: ``pass_kind`` a tuple, ``combine(main,
    *others, texts)``)."""

    name: str
    pass_kind: str | tuple[str, ...]
    combine: Callable[..., tuple[np.ndarray, dict[int, str]]]
    doc: str = ""
    pass_method: str = "loss"
    takes_k: ClassVar[bool] = False

    @property
    def kinds(self) -> tuple[str, ...]:
        """The second passes, in the order ``combine(main, *others, texts)`` receives them."""
        return (self.pass_kind,) if isinstance(self.pass_kind, str) else tuple(self.pass_kind)


@dataclass(frozen=True)
class Resource:
    """What a scorer reads besides the model, by name. ``hint``: how to make one (the message when it is missing);
    ``to_array(value)``: what a caller holds (e.g. a ``FreqTable``) -> the validated array the formula reads
    (UserError when it cannot be); ``check_ids(ids, mask, array)``: a host check of concrete target ids against the
    array (UserError), or None; ``default``: the value taken when a caller gives none (None: it must be given);
    ``per_token(value, tokenizer, texts)``: for a resource with one value per token of each text, made on the host
    from the text (Tag&Tab's keywords), each text's array over its tokens as the tokenizer encodes it (special
    tokens included; the runner packs ``[1:]`` beside the statistics), and ``to_array`` then takes such an array of
    the statistics' shape (None: one array for every text, e.g. a frequency table)."""

    name: str
    hint: str
    to_array: Callable[[Any], np.ndarray]
    check_ids: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None
    default: Any = None
    per_token: Callable[[Any, Any, Sequence[str]], list[np.ndarray]] | None = None


REGISTRY: dict[str, Scorer] = {}  # single-pass scorers
MULTI_PASS: dict[str, MultiPassMethod] = {}  # multi-pass methods (run by runner.score_dataset)
RESOURCES: dict[str, Resource] = {}  # resource name -> how to make it, turn it into an array and check ids with it


def _first_line(fn, name: str) -> str:
    """The first line of ``fn``'s docstring: what ``--methods``' help says of method ``name`` (none: UserError)."""
    doc = (fn.__doc__ or "").strip()
    if not doc:
        raise UserError(f"method {name!r}: {getattr(fn, '__name__', fn)!r} has no docstring; give it one (its first "
                        "line is what the help and the reports say of the method)")
    return doc.splitlines()[0]


def register(name: str, *, resources: Mapping[str, str] | Sequence[str] = ()):
    """Register a single-pass formula under ``name``. What it reads comes from its signature: positional parameters
    named from ``ARRAYS``; keyword-only ``k`` (the method takes a fraction), ``zlib_bytes`` (each text's compressed
    length) and one keyword per resource (``resources``: {resource name: keyword}, or names that are their own
    keywords); any other keyword-only parameter keeps its default. A formula reading ``TemperedStats`` fields takes
    the array of their temperatures as the resource keyword ``temperatures`` (the kernel computes them there).

    Args:
        name: the method's name (a new one: UserError for a name already registered).
        resources: the resources the formula reads.

    Returns:
        A decorator registering the formula (which it returns unchanged); a signature it cannot read: UserError.
    """
    keywords = dict(resources) if isinstance(resources, Mapping) else {r: r for r in resources}

    def deco(fn):
        _check_unique(name)
        doc = _first_line(fn, name)
        params = inspect.signature(fn).parameters.values()
        arrays = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
        options = {p.name: p for p in params if p.kind is p.KEYWORD_ONLY}
        unknown = [a for a in arrays if a not in ARRAYS]
        given = ("k", "zlib_bytes", *keywords.values())  # what device_scores passes
        unset = [o for o, p in options.items() if p.default is p.empty and o not in given]
        tempered = bool(set(arrays) & set(TemperedStats._fields)) and TEMPERATURES not in keywords.values()
        if unknown or unset or not set(keywords.values()) <= set(options) or tempered:
            raise UserError(f"scorer {name!r}: positional parameters must be among {ARRAYS} (got {unknown}), other "
                             f"keyword-only ones need a default (got {unset}), resources {keywords} need keywords, "
                             f"tempered statistics the resource keyword {TEMPERATURES!r}")
        REGISTRY[name] = Scorer(name, fn, "k" in options, "zlib_bytes" in options, doc, "ids" in arrays,
                                tuple(keywords), arrays, tuple(keywords.values()))
        return fn

    return deco


def register_multi_pass(name: str, *, pass_kind: str | tuple[str, ...], pass_method: str = "loss"):
    """Register a multi-pass method: ``combine(main, other, texts)`` after a ``pass_kind`` second pass, both the
    ``pass_method`` score per text.

    Args:
        name: the method's name (a new one).
        pass_kind: the second pass (``MultiPassMethod.pass_kind``), or several.
        pass_method: the single-pass score each pass gives per text.

    Returns:
        A decorator registering ``combine`` (which it returns unchanged).
    """
    def deco(combine):
        _check_unique(name)
        MULTI_PASS[name] = MultiPassMethod(name, pass_kind, combine, _first_line(combine, name), pass_method)
        return combine

    return deco


def check_resources(methods: Sequence[str], resources: Mapping[str, Any] | None) -> None:
    """Refuse, before any scoring, a method whose resource (``Scorer.resources``) was not given.

    Args:
        methods: method names (``min_k@0.2``).
        resources: {resource name: value}, or None; a resource with a default may be left out.
    """
    for method in methods:
        scorer, _ = parse_method(method)
        for r in getattr(scorer, "resources", ()):
            if (not resources or resources.get(r) is None) and (r not in RESOURCES or RESOURCES[r].default is None):
                hint = RESOURCES[r].hint if r in RESOURCES else "none was given"
                raise UserError(f"method {method!r} needs a {r}: {hint}")


class Requirements(NamedTuple):
    """What ``device_scores`` needs besides the statistics and the mask for some methods."""

    ids: bool  # ids=: the target token ids
    zlib_bytes: bool  # zlib_bytes=: each text's zlib-compressed length
    resources: tuple[str, ...]  # resources={name: array} (``resource_arrays``)


def requirements(methods: Sequence[str]) -> Requirements:
    """Which of ``ids=``, ``zlib_bytes=`` and ``resources=`` the single-pass ``methods`` need (a multi-pass or
    unknown method: UserError).

    Args:
        methods: single-pass method names, a tuple or a list (not one string; at least one).

    Returns:
        The ``Requirements``.
    """
    if isinstance(methods, str):
        raise UserError(f"methods is a tuple or list of names, got the string {methods!r}")
    if not methods:
        raise UserError("methods is empty: name at least one method, e.g. ['loss', 'min_k@0.2']")
    scorers = [single_pass(m)[0] for m in methods]
    return Requirements(any(s.needs_ids for s in scorers), any(s.needs_text for s in scorers),
                        tuple(dict.fromkeys(r for s in scorers for r in s.resources)))


def temperature_resource(methods: Sequence[str]) -> str | None:
    """The resource holding the kernel's temperatures for the single-pass ``methods`` (``Scorer.temperature_resource``),
    None when none reads tempered statistics; methods asking for different ones: UserError (one set per pass).

    Args:
        methods: single-pass method names.

    Returns:
        The resource's name, or None.
    """
    names = {single_pass(m)[0].temperature_resource for m in methods} - {None}
    if len(names) > 1:
        raise UserError(f"methods {list(methods)} read tempered statistics at the temperatures of different resources "
                        f"({', '.join(sorted(names))}); score them in separate passes")
    return names.pop() if names else None


def _check_unique(name: str) -> None:
    """One name, one method: a name already registered (a built-in scorer or multi-pass method, or one's own) is
    refused, never silently replaced (UserError); so is a name that cannot be written in ``--methods``."""
    if not isinstance(name, str) or not name or "@" in name or "," in name or name != name.strip():
        raise UserError(f"a method's name is a non-empty string without '@', ',' or surrounding spaces, got {name!r}")
    if name in REGISTRY or name in MULTI_PASS:
        kind = type(REGISTRY.get(name) or MULTI_PASS.get(name)).__name__
        raise UserError(f"method {name!r} is already registered (a {kind}); register yours under another name")


def lookup(name: str) -> Scorer | MultiPassMethod | None:
    """The single-pass scorer or multi-pass method registered under a base name (no ``@k``), or None.

    Args:
        name: a base name (``min_k``).

    Returns:
        Its ``Scorer`` or ``MultiPassMethod``; None when no method has that name.
    """
    return REGISTRY.get(name) or MULTI_PASS.get(name)


def known_methods() -> str:
    """Every registered method's name, sorted, ``name@K`` for one that takes a fraction (the help and errors list
    them).

    Returns:
        The names joined by ", ".
    """
    return ", ".join(f"{n}@K" if lookup(n).takes_k else n for n in sorted({*REGISTRY, *MULTI_PASS}))


def parse_method(method: str) -> tuple[Scorer | MultiPassMethod, float | None]:
    """``"min_k@0.2"`` -> (the min_k scorer, 0.2); ``"lowercase"`` -> (its MultiPassMethod, None); unknown names
    raise a UserError listing the known ones.

    Args:
        method: a method name, with ``@k`` when it takes a fraction (then required).

    Returns:
        (its ``Scorer`` or ``MultiPassMethod``, the fraction k, or None for a method without one).
    """
    if not isinstance(method, str):
        raise UserError(f"a method is a name such as 'min_k@0.2', got {method!r}")
    base, _, k_text = method.partition("@")
    scorer = lookup(base)
    if scorer is None:
        unregistered = "" if MULTI_PASS else (" (the multi-pass methods, e.g. lowercase, ref, neighbor, register when "
                                              "mia_jax.methods is imported, as mia_jax.score and every command do)")
        raise UserError(f"unknown method {method!r}; known methods: {known_methods()}{unregistered}")
    if not scorer.takes_k:
        if k_text:
            raise UserError(f"method {base!r} takes no fraction, got {method!r}")
        return scorer, None
    if not k_text:
        raise UserError(f"method {base!r} needs a fraction, e.g. {base}@0.2")
    try:
        k = float(k_text)
    except ValueError:
        raise UserError(f"bad fraction in {method!r}: {k_text!r} is not a number") from None
    return scorer, checks.fraction(k, f"the fraction in {method!r}")


def single_pass(method: str) -> tuple[Scorer, float | None]:
    """``parse_method`` for a method that must be single-pass: a multi-pass one is a UserError.

    Args:
        method: a single-pass method name.

    Returns:
        (its ``Scorer``, the fraction k or None).
    """
    scorer, k = parse_method(method)
    if isinstance(scorer, MultiPassMethod):
        raise UserError(f"{method!r} needs a second pass: use runner.score_dataset")
    return scorer, k


def expand_methods(methods: Sequence[str], ks: Sequence[float]) -> list[str]:
    """Validate method names; a bare name that takes a fraction becomes one method per k. No method at all, or a
    name that is not a string: UserError.

    Args:
        methods: method names, bare (``min_k``) or with a fraction (``min_k@0.2``).
        ks: the fractions of a bare name that takes one.

    Returns:
        The method names, each once, in order (``min_k@0.2``, ...).
    """
    methods = list(methods)
    if not methods:
        raise UserError("methods is empty: name at least one method, e.g. ['loss', 'min_k@0.2']")
    out: list[str] = []
    for method in methods:
        scorer = lookup(method)
        names = [f"{method}@{k:g}" for k in ks] if scorer is not None and scorer.takes_k else [method]
        for name in names:
            parse_method(name)
            if name not in out:
                out.append(name)
    return out


def is_multi_pass(method: str) -> bool:
    """Whether a (valid) method name needs a second pass (``runner.score_dataset``).

    Args:
        method: a method name (unknown: UserError).

    Returns:
        True for a multi-pass method.
    """
    return isinstance(parse_method(method)[0], MultiPassMethod)
