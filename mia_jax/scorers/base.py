"""The method registries (single-pass scorers, multi-pass methods) and the per-batch container scorers read from."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from mia_jax.errors import UserError
from mia_jax.stats import TokenStats


@dataclass
class TokenBatch:
    """Per-token statistics of a batch on the host, as float64 ``[B, T]`` arrays, and the mask.

    ``mask[b, t]`` is True where position t holds a real predicted token of example b; ``ids[b, t]`` is that
    token's id (the target, int64 ``[B, T]``; None when the caller has none). ``resources`` holds what a scorer
    needs besides the model (``Scorer.resources`` names them, e.g. ``freq_table``). Sorted views are computed once
    and shared by every k of a method.
    """

    stats: TokenStats
    mask: np.ndarray
    texts: Sequence[str] | None = None
    ids: np.ndarray | None = None
    resources: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.stats = TokenStats(*(np.asarray(x, np.float64) for x in self.stats))
        self.mask = np.asarray(self.mask, bool)
        if self.mask.shape != self.stats.logprob.shape:
            raise ValueError(f"mask shape {self.mask.shape} != statistics shape {self.stats.logprob.shape}")
        if self.ids is not None:
            self.ids = np.asarray(self.ids, np.int64)
            if self.ids.shape != self.mask.shape:
                raise ValueError(f"ids shape {self.ids.shape} != mask shape {self.mask.shape}")

    @cached_property
    def n(self) -> np.ndarray:
        return self.mask.sum(-1)

    def mean(self, values: np.ndarray) -> np.ndarray:
        """Mean over the real tokens of each row (NaN for a row without tokens)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.mask, values, 0.0).sum(-1) / self.n

    @cached_property
    def zscore(self) -> np.ndarray:
        """Min-K%++ token score (log p - mu) / sigma."""
        s = self.stats
        return (s.logprob - s.mu) / np.sqrt(s.var)

    def ascending(self, name: str) -> np.ndarray:
        """Row-wise ascending sort of a token quantity, padding pushed to the end (+inf)."""
        key = f"_sorted_{name}"
        if key not in self.__dict__:
            s = self.stats
            derived = {"zscore": lambda: self.zscore, "mu_calibrated": lambda: s.logprob - s.mu,
                       "sigma_calibrated": lambda: s.logprob / np.sqrt(s.var)}
            values = derived[name]() if name in derived else getattr(s, name)
            self.__dict__[key] = np.sort(np.where(self.mask, values, np.inf), axis=-1)
        return self.__dict__[key]


@dataclass(frozen=True)
class Scorer:
    """A single-pass method: a pure function of one batch's token statistics (+ the texts, the target ids, named
    resources), ``fn(batch[, k])``."""

    name: str
    fn: Callable[..., np.ndarray]
    takes_k: bool = False
    needs_text: bool = False
    doc: str = ""
    needs_ids: bool = False
    resources: tuple[str, ...] = ()


@dataclass(frozen=True)
class MultiPassMethod:
    """A method that needs a second pass of the scoring path (``mia_jax.passes`` says what each ``pass_kind``
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


REGISTRY: dict[str, Scorer] = {}  # single-pass scorers
MULTI_PASS: dict[str, MultiPassMethod] = {}  # multi-pass methods (run by runner.score_dataset)


def _first_line(fn) -> str:
    return (fn.__doc__ or "").strip().splitlines()[0]


def register(name: str, *, takes_k: bool = False, needs_text: bool = False, needs_ids: bool = False,
             resources: tuple[str, ...] = ()):
    """Register a single-pass scorer ``fn(batch)`` (``fn(batch, k)`` with ``takes_k``) under ``name``; it reads
    ``batch.texts`` / ``batch.ids`` / ``batch.resources[r]`` when it says it needs them."""
    def deco(fn):
        _check_unique(name, MULTI_PASS)
        REGISTRY[name] = Scorer(name, fn, takes_k, needs_text, _first_line(fn), needs_ids, tuple(resources))
        return fn

    return deco


def register_multi_pass(name: str, *, pass_kind: str | tuple[str, ...], pass_method: str = "loss"):
    """Register a multi-pass method: ``combine(main, other, texts)`` after a ``pass_kind`` second pass, both the
    ``pass_method`` score per text."""
    def deco(combine):
        _check_unique(name, REGISTRY)
        MULTI_PASS[name] = MultiPassMethod(name, pass_kind, combine, _first_line(combine), pass_method)
        return combine

    return deco


RESOURCE_HINTS: dict[str, str] = {}  # resource name -> how to make it (the message of a missing resource)


def check_resources(methods: Sequence[str], resources: Mapping[str, Any] | None) -> None:
    """Refuse, before any scoring, a method whose resource (``Scorer.resources``) was not given."""
    for method in methods:
        scorer, _ = parse_method(method)
        for r in getattr(scorer, "resources", ()):
            if not resources or resources.get(r) is None:
                raise UserError(f"method {method!r} needs a {r}: {RESOURCE_HINTS.get(r, 'none was given')}")


def _check_unique(name: str, other: dict) -> None:
    """One name, one method: a single-pass scorer and a multi-pass method never share a name."""
    if name in other:
        raise ValueError(f"method {name!r} is already registered as a {type(other[name]).__name__}")


def lookup(name: str) -> Scorer | MultiPassMethod | None:
    """The single-pass scorer or multi-pass method registered under a base name (no ``@k``), or None."""
    return REGISTRY.get(name) or MULTI_PASS.get(name)


def _known() -> str:
    return ", ".join(f"{n}@K" if lookup(n).takes_k else n for n in sorted({*REGISTRY, *MULTI_PASS}))


def parse_method(method: str) -> tuple[Scorer | MultiPassMethod, float | None]:
    """``"min_k@0.2"`` -> (the min_k scorer, 0.2); ``"lowercase"`` -> (its MultiPassMethod, None); unknown names
    raise a UserError listing the known ones."""
    base, _, k_text = method.partition("@")
    scorer = lookup(base)
    if scorer is None:
        raise UserError(f"unknown method {method!r}; known methods: {_known()}")
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
    if not 0.0 < k <= 1.0:
        raise UserError(f"fraction in {method!r} must be in (0, 1], got {k}")
    return scorer, k


def expand_methods(methods: Sequence[str], ks: Sequence[float]) -> list[str]:
    """Validate method names; a bare name that takes a fraction becomes one method per k."""
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
    """Whether a (valid) method name needs a second pass (``runner.score_dataset``)."""
    return isinstance(parse_method(method)[0], MultiPassMethod)


def score_batch(batch: TokenBatch, methods: Sequence[str]) -> dict[str, np.ndarray]:
    """All requested methods for one batch: {method: float64 [B]} (NaN for rows without tokens)."""
    out = {}
    for method in methods:
        scorer, k = parse_method(method)
        if isinstance(scorer, MultiPassMethod):
            raise ValueError(f"{method!r} needs a second pass: use runner.score_dataset")
        if scorer.needs_text and batch.texts is None:
            raise ValueError(f"method {method!r} needs the texts")
        if scorer.needs_ids and batch.ids is None:
            raise ValueError(f"method {method!r} needs the token ids")
        out[method] = np.asarray(scorer.fn(batch, k) if scorer.takes_k else scorer.fn(batch), np.float64)
    return out
