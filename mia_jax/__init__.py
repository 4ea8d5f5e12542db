"""mia_jax: pretraining-data detection (membership inference) for LLMs in JAX.

Public API for use from any JAX code::

    from mia_jax import score                # texts + a model -> {method: scores}, the path of `mia-jax eval`
    from mia_jax import token_stats, token_stats_from_hidden, TokenBatch, score_batch, evaluate
    from mia_jax import device_scores        # the single-pass scores in jax.numpy: inside jit / vmap / grad
    from mia_jax import scores_from_logits   # the same from a causal LM's logits (shift and mask done)

The names are imported on first use (PEP 562), so that ``import mia_jax.cli`` does not load JAX before the
command's guard (:mod:`mia_jax.entry`) is in place: a Ctrl-C while JAX loads is then one line, not a traceback.
"""
import importlib

__version__ = "0.2.0"

_EXPORTS = {  # public name -> the module that defines it
    "TokenStats": "mia_jax.stats", "token_stats": "mia_jax.stats", "token_stats_from_hidden": "mia_jax.stats",
    "TokenBatch": "mia_jax.scorers", "device_scores": "mia_jax.scorers", "expand_methods": "mia_jax.scorers",
    "score_batch": "mia_jax.scorers", "scores_from_logits": "mia_jax.scorers",
    "evaluate": "mia_jax.metrics", "score": "mia_jax.api",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    """A public name (imported from its module once) or a submodule (``mia_jax.metrics`` after ``import mia_jax``)."""
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
