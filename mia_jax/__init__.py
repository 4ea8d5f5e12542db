"""mia_jax: pretraining-data detection (membership inference) for LLMs in JAX.

Public API for use from any JAX code::

    from mia_jax import score                # texts + a model -> {method: scores}, the path of `mia-jax eval`
    from mia_jax import token_stats, token_stats_from_hidden, TokenBatch, score_batch, evaluate
    from mia_jax import device_scores        # the single-pass scores in jax.numpy: inside jit / vmap / grad
    from mia_jax import scores_from_logits   # the same from a causal LM's logits (shift and mask done)

The names are imported on first use (PEP 562), so that ``import mia_jax.cli`` does not load JAX before the
command's guard (:mod:`mia_jax.runs.entry`) is in place: a Ctrl-C while JAX loads is then one line, not a traceback.
"""
import importlib

__version__ = "0.2.0"

_EXPORTS = {  # public name -> the module that defines it
    "TokenStats": "mia_jax.stats", "token_stats": "mia_jax.stats", "token_stats_from_hidden": "mia_jax.stats",
    "TokenBatch": "mia_jax.scorers", "device_scores": "mia_jax.scorers", "expand_methods": "mia_jax.scorers",
    "score_batch": "mia_jax.scorers", "scores_from_logits": "mia_jax.scorers",
    "evaluate": "mia_jax.evaluation.metrics", "score": "mia_jax.api",
}
_MOVED = {  # a module of the flat layout (before the packages) -> where it is now (`mia_jax.metrics` still resolves)
    "augment": "methods.augment", "blind": "evaluation.blind", "bootstrap": "evaluation.bootstrap", "comparisons":
    "evaluation.comparisons", "compilation": "engine.compilation", "dataset_inference":
    "evaluation.dataset_inference", "entry": "runs.entry", "files": "runs.files", "fingerprint": "runs.fingerprint",
    "freq": "methods.freq", "generate": "engine.generate", "group_metrics": "evaluation.group_metrics", "inflight":
    "engine.inflight", "metrics": "evaluation.metrics", "neighbors": "methods.neighbors", "ngram_coverage":
    "methods.ngram_coverage", "passes": "engine.passes", "preemption": "runs.preemption", "pvalue":
    "evaluation.pvalue", "records": "engine.records", "report": "evaluation.report", "resources":
    "methods.resources", "rounding": "evaluation.rounding", "rundir": "runs.rundir", "runner": "engine.runner",
    "samia": "methods.samia", "score_step": "engine.score_step", "sharding": "engine.sharding", "shards":
    "engine.shards", "verdict_log": "evaluation.verdict_log",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    """A public name (imported from its module once) or a submodule (``mia_jax.evaluation`` after ``import
    mia_jax``; a module's name in the flat layout, e.g. ``mia_jax.metrics``, gives the module where it is now)."""
    if name in _MOVED:
        return importlib.import_module(f"{__name__}.{_MOVED[name]}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
