"""Scorers: pure functions of per-token statistics (+ the text), registered by name.

Every score is oriented *higher = more likely a member*. A method name is a registered base name,
optionally with a fraction: ``min_k@0.2``. ``expand_methods`` turns base names that take a
fraction into one method per requested k, so several k values come out of one forward pass.
Multi-pass methods (``lowercase``, ``ref``, ``neighbor``) have their own registry (``MULTI_PASS``, of
``MultiPassMethod``); ``parse_method`` / ``lookup`` know both, and the runner runs their second pass.
"""
from __future__ import annotations

from mia_jax.scorers.base import (MULTI_PASS, REGISTRY, MultiPassMethod, Scorer, TokenBatch, expand_methods,
                                  is_multi_pass, lookup, parse_method, score_batch)
from mia_jax.scorers import (camia, dcpdd, gradient, likelihood, min_k, multipass, pac,  # noqa: F401 (registers)
                             recall, sampling)
from mia_jax.scorers.likelihood import entropy, loss, ppl, rank, zlib
from mia_jax.scorers.min_k import gap_k, k_count, max_k, min_k_mean, min_k_pp, min_k_pp_mu, min_k_pp_sigma

DEFAULT_METHODS = ("loss", "ppl", "zlib", "min_k", "min_k_pp", "max_k", "entropy", "rank")
DEFAULT_K = (0.2,)

__all__ = [
    "REGISTRY", "MULTI_PASS", "Scorer", "MultiPassMethod", "TokenBatch", "expand_methods", "is_multi_pass", "lookup",
    "parse_method", "score_batch", "DEFAULT_METHODS", "DEFAULT_K",
    "loss", "ppl", "zlib", "entropy", "rank", "k_count", "min_k_mean", "max_k", "min_k_pp", "min_k_pp_mu",
    "min_k_pp_sigma", "gap_k",
]
