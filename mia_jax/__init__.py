"""mia_jax: pretraining-data detection (membership inference) for LLMs in JAX.

Public API for use from any JAX code::

    from mia_jax import score                # texts + a model -> {method: scores}, the path of `mia-jax eval`
    from mia_jax import token_stats, token_stats_from_hidden, TokenBatch, score_batch, evaluate
    from mia_jax import device_scores        # the single-pass scores in jax.numpy: inside jit / vmap / grad
    from mia_jax import scores_from_logits   # the same from a causal LM's logits (shift and mask done)
"""
__version__ = "0.2.0"

from mia_jax.stats import TokenStats, token_stats, token_stats_from_hidden  # noqa: E402
from mia_jax.scorers import TokenBatch, device_scores, expand_methods, score_batch, scores_from_logits  # noqa: E402
from mia_jax.metrics import evaluate  # noqa: E402
from mia_jax.api import score  # noqa: E402

__all__ = ["TokenStats", "token_stats", "token_stats_from_hidden", "TokenBatch", "expand_methods", "score_batch",
           "device_scores", "scores_from_logits", "evaluate", "score", "__version__"]
