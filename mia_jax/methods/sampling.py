"""The methods that read sampled continuations, registered from one sampling pass: SaMIA (Kaneko et al. 2024:
``samia``, ``samia_zlib``) and the n-gram coverage attack (Hallinan et al. 2025: ``ngram_coverage``).

The pass (kind ``samia``, the name it had when SaMIA was its only user) draws continuations of each text's prefix
with the KV cache and scores them against the true rest of the text (``mia_jax.methods.samia`` and
``mia_jax.methods.ngram_coverage``: the formulas, the authors' code and where this differs). It runs through
``runner.score_texts``' batching and resumable records like every other pass (``compute``). Each family has its
sampling options (``pass_options["samia"]``, ``pass_options["ngram_coverage"]``; :func:`resolve` fills in the
family's defaults): families requested together with the same sampling options read the same samples (one draw per
distinct set of options in each batch), so ``samia`` and ``samia_zlib`` always share theirs and ``ngram_coverage``
shares them when its options are SaMIA's. Only the requested methods are computed (``wanted``, from the runner).
"""
from __future__ import annotations

import inspect
from typing import Sequence

import numpy as np

from mia_jax.methods import ngram_coverage as ng
from mia_jax.engine import passes
from mia_jax.errors import UserError
from mia_jax.evaluation.metrics import scores_by_method
from mia_jax.scorers.base import register_multi_pass

FAMILIES = {"samia": ("samia", "samia_zlib"), "ngram_coverage": ng.METHODS}
METHODS = tuple(m for ms in FAMILIES.values() for m in ms)  # the folded array's columns, in this order
SAMPLING = ("n_samples", "prefix_ratio", "max_new_tokens", "temperature", "top_k", "top_p", "seed")
SCORING = {"samia": {}, "ngram_coverage": {"min_n": ng.DEFAULT_MIN_N}}  # options that do not change the samples


def _defaults(family: str) -> dict:
    """The family's default sampling options: SaMIA's are ``samia.sample_continuations``' own defaults."""
    if family == "ngram_coverage":
        return dict(ng.DEFAULT_SAMPLING)
    from mia_jax.methods import samia as sm  # ~15 ms (generate, tqdm): not at `import mia_jax`

    return {k: p.default for k, p in inspect.signature(sm.sample_continuations).parameters.items() if k in SAMPLING}


def resolve(family: str, options: dict | None) -> tuple[dict, dict]:
    """(sampling options, scoring options) of a family (``samia`` or ``ngram_coverage``): the given ``options``
    over the family's defaults; an unknown option is a UserError."""
    if family not in FAMILIES:
        raise ValueError(f"unknown sampling family {family!r}; known: {', '.join(FAMILIES)}")
    options = dict(options or {})
    unknown = sorted(set(options) - set(SAMPLING) - set(SCORING[family]))
    if unknown:
        raise UserError(f"unknown {family} option(s) {unknown}; known: {[*SAMPLING, *SCORING[family]]}")
    sampling = {**_defaults(family), **{k: v for k, v in options.items() if k in SAMPLING}}
    scoring = {**SCORING[family], **{k: v for k, v in options.items() if k in SCORING[family]}}
    if family == "ngram_coverage":
        ng.check_min_n(scoring["min_n"])
    return sampling, scoring


def _scores(family: str, drawn, scoring: dict) -> dict[str, np.ndarray]:
    """{method: float64 [N]} of one family from a ``samia.SampleSet``."""
    from mia_jax.methods import samia as sm

    if family == "samia":
        return {"samia": sm.samia_from_samples(drawn.samples, drawn.references),
                "samia_zlib": sm.samia_from_samples(drawn.samples, drawn.references, zlib=True)}
    return {"ngram_coverage": ng.ngram_coverage_from_samples(drawn.samples, drawn.references, **scoring)}


@passes.register_pass("samia")
def sampling_pass(name, loaded, texts, *, resume, samia=None, ngram_coverage=None, wanted=None, **_) -> passes.Pass:
    """Every text's samples scored in batches for the ``wanted`` methods (default: all of :data:`METHODS`); folded
    to a [N, len(METHODS)] array (NaN in the columns of methods not wanted), NaN with the reason where a text has
    no prefix or no continuation to compare with."""
    from mia_jax.methods import samia as sm

    methods = [m for m in METHODS if wanted is None or m in wanted]
    families = [f for f, ms in FAMILIES.items() if set(ms) & set(methods)]
    opts = {f: resolve(f, {"samia": samia, "ngram_coverage": ngram_coverage}[f]) for f in families}
    draws: dict[tuple, list[str]] = {}  # one draw per distinct set of sampling options
    for f in families:
        draws.setdefault(tuple(sorted(opts[f][0].items())), []).append(f)

    def compute(ids, mask, batch_texts):
        out = {}
        for key, fams in draws.items():
            drawn = sm.sample_continuations(loaded, batch_texts, progress=False, label=fams[0], **dict(key))
            for f in fams:
                out.update(_scores(f, drawn, opts[f][1]))
        return {m: out[m] for m in methods}

    def fold(recs):
        values = scores_by_method(recs, methods)
        folded = np.stack([values[m] if m in methods else np.full(len(texts), np.nan) for m in METHODS], 1)
        reasons = {}
        for i, t in enumerate(texts):
            why = recs[i].get("skip_reason") or next(
                (r for f in families if (r := sm.skip_reason(t, opts[f][0]["prefix_ratio"], f))), None)
            if why:
                reasons[i] = f"{name}: {why}"
        return folded, reasons, {}

    return passes.Pass(loaded, list(texts), resume, fold, methods=methods, compute=compute)


def _column(sampled: np.ndarray, method: str):
    return np.asarray(sampled, np.float64)[:, METHODS.index(method)], {}


@register_multi_pass("samia", pass_kind="samia")
def samia(loss: np.ndarray, sampled: np.ndarray, texts: Sequence[str]):
    """SaMIA: mean ROUGE-1 recall of sampled continuations of the text's first half against its second half."""
    return _column(sampled, "samia")


@register_multi_pass("samia_zlib", pass_kind="samia")
def samia_zlib(loss: np.ndarray, sampled: np.ndarray, texts: Sequence[str]):
    """SaMIA*zlib: the same, each sample's ROUGE-1 recall times its zlib-compressed length."""
    return _column(sampled, "samia_zlib")


@register_multi_pass("ngram_coverage", pass_kind="samia")
def ngram_coverage(loss: np.ndarray, sampled: np.ndarray, texts: Sequence[str]):
    """N-gram coverage attack: max over sampled continuations of the share of their words in 3-grams of the suffix."""
    return _column(sampled, "ngram_coverage")
