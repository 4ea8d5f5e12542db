"""Scorers: one pure ``jax.numpy`` formula per single-pass method, registered by name, and the methods' registry.

Every score is oriented *higher = more likely a member*. Each single-pass scorer is a typed function of per-token
arrays with keyword-only options, in the style of optax's losses, e.g. ``min_k(logprob, mask, *, k=0.2)``,
``min_k_pp(logprob, mu, var, mask, *, k=0.2)``, ``zlib(logprob, mask, *, zlib_bytes)``, ``dc_pdd(logprob, ids,
mask, *, freq)``: each name here is that function (the family modules are ``scorers.likelihood``, ``scorers.min_k``
(reach it as ``sys.modules["mia_jax.scorers.min_k"]`` or ``from mia_jax.scorers.min_k import ...``: the attribute
``scorers.min_k`` is the function), ``scorers.pac``, ``scorers.camia``, ``scorers.dcpdd``, ``scorers.acmia``,
``scorers.tagtab``).

A method name is a registered base name, optionally with a fraction: ``min_k@0.2``. ``device_scores(stats, mask,
methods)`` computes methods by name (inside jit / vmap / grad), ``scores_from_logits`` from logits, ``score_batch``
on the host. ``expand_methods`` turns base names that take a fraction into one method per requested k, so several
k values come out of one forward pass. Multi-pass methods (``lowercase``, ``ref``, ``neighbor``, ...) have their own
registry here (``MULTI_PASS``, of ``MultiPassMethod``), filled by the package :mod:`mia_jax.methods` (their passes and
combine functions; importing it registers them, as ``mia_jax.score`` and every command do); ``parse_method`` /
``lookup`` know both, and the runner runs their second pass. This package imports nothing of ``mia_jax`` but
``stats``, ``checks`` and ``errors``.
"""
from __future__ import annotations

from mia_jax.scorers.base import (MULTI_PASS, REGISTRY, RESOURCES, MultiPassMethod, Requirements, Resource, Scorer,
                                  TokenBatch, check_resources, expand_methods, is_multi_pass, known_methods, lookup,
                                  parse_method, requirements, temperature_resource)
from mia_jax.scorers import acmia, camia, dcpdd, likelihood, pac, tagtab  # noqa: F401 (importing registers)
from mia_jax.scorers import min_k as _min_k_module  # noqa: F401 (registers; the name min_k is the function below)
from mia_jax.scorers.dispatch import (LOGIT_METHODS, check_ids, device_scores, pack_token_resources, resource_arrays,
                                      score_batch, scores_from_logits, token_resources)
from mia_jax.scorers.reduce import masked_mean
from mia_jax.scorers.likelihood import entropy, loss, ppl, rank, zlib, zlib_bytes
from mia_jax.scorers.min_k import (gap_k, k_count, lowest_k_mean, max_k, min_k, min_k_pp, min_k_pp_mu,
                                  min_k_pp_sigma)
from mia_jax.scorers.pac import polarized
from mia_jax.scorers.camia import (camia_calibrated, camia_count_1, camia_count_2, camia_count_3, camia_count_pre,
                                   camia_ll_tail, camia_loss_200, camia_loss_300, camia_slope)
from mia_jax.scorers.dcpdd import dc_pdd, first_occurrence
from mia_jax.scorers.acmia import acmia_ac, acmia_derivac, acmia_normac
from mia_jax.scorers.tagtab import tag_tab

DEFAULT_METHODS = ("loss", "ppl", "zlib", "min_k", "min_k_pp", "max_k", "entropy", "rank")
DEFAULT_K = (0.2,)

__all__ = [
    "REGISTRY", "MULTI_PASS", "RESOURCES", "Scorer", "MultiPassMethod", "Resource", "Requirements", "TokenBatch",
    "check_resources", "expand_methods", "is_multi_pass", "known_methods", "lookup", "parse_method", "requirements",
    "DEFAULT_METHODS", "DEFAULT_K",
    "LOGIT_METHODS", "device_scores", "scores_from_logits", "resource_arrays", "check_ids", "score_batch",
    "k_count", "lowest_k_mean", "masked_mean", "first_occurrence", "zlib_bytes",
    "loss", "ppl", "zlib", "entropy", "rank", "min_k", "max_k", "min_k_pp", "min_k_pp_mu", "min_k_pp_sigma", "gap_k",
    "polarized", "camia_slope", "camia_count_1", "camia_count_2", "camia_count_3", "camia_count_pre",
    "camia_loss_200", "camia_loss_300", "camia_ll_tail", "camia_calibrated", "dc_pdd",
    "acmia_ac", "acmia_derivac", "acmia_normac", "temperature_resource", "tag_tab", "token_resources",
    "pack_token_resources",
]
