"""Likelihood-family scorers: LOSS (Yeom et al. 2018), PPL, Zlib (Carlini et al. 2021), entropy, rank.

Each is a mean over a text's scored tokens (``mask``) of one per-token statistic (``stats.token_stats``); NaN for a
text without scored tokens.
"""
from __future__ import annotations

import zlib as _zlib

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from mia_jax.scorers.base import register
from mia_jax.scorers.reduce import floating, masked_mean, real


@register("loss")
def loss(logprob: ArrayLike, mask: ArrayLike) -> jax.Array:
    """Mean token log-likelihood (1/n) sum_i log p(x_i | x_<i), i.e. minus the LM loss.

    The LOSS attack (Yeom et al. 2018, *Privacy Risk in Machine Learning*), as in the Min-K% paper's baselines
    (swj0419/detect-pretrain-code: ``-loss``).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob = jnp.array([[-1.0, -2.0, -3.0], [-0.5, 7.0, 7.0]])
    >>> print(loss(logprob, jnp.array([[1, 1, 1], [1, 0, 0]], bool)))
    [-2.  -0.5]
    """
    return masked_mean(logprob, mask)


@register("ppl")
def ppl(logprob: ArrayLike, mask: ArrayLike) -> jax.Array:
    """Minus the perplexity: -exp(-loss), loss the mean token log-likelihood (the Min-K% paper's PPL baseline).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> round(float(ppl(jnp.array([[-1.0, -3.0]]), jnp.ones((1, 2), bool))[0]), 4)  # -exp(2)
    -7.3891
    """
    return -jnp.exp(-loss(logprob, mask))


def zlib_bytes(text: str) -> int:
    """Length in bytes of the zlib-compressed UTF-8 text (default level), as in the published code (host).

    Args:
        text: one text.

    Returns:
        The compressed length in bytes (``zlib``'s ``zlib_bytes``, one per text).
    """
    return len(_zlib.compress(text.encode("utf-8")))


@register("zlib")
def zlib(logprob: ArrayLike, mask: ArrayLike, *, zlib_bytes: ArrayLike) -> jax.Array:
    """Mean token log-likelihood divided by the zlib-compressed length of the text in bytes.

    score = loss / zlib_bytes (Carlini et al. 2021, *Extracting Training Data from Large Language Models*;
    swj0419/detect-pretrain-code, ``src/run.py``: the log perplexity over ``zlib_entropy``, the same ranking with the
    opposite sign).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        zlib_bytes: int or float [...] ([B] for [B, T] statistics) each text's ``scorers.zlib_bytes(text)``.

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> print(zlib(jnp.array([[-1.0, -3.0]]), jnp.ones((1, 2), bool), zlib_bytes=jnp.array([8])))
    [-0.25]
    """
    return loss(logprob, mask) / floating(zlib_bytes)


@register("entropy")
def entropy(entropy: ArrayLike, mask: ArrayLike) -> jax.Array:
    """Minus the mean predictive entropy: a model is more confident on text it was trained on.

    score = -(1/n) sum_i H(p(. | x_<i)), H = -sum_v p_v log p_v (``stats.token_stats``' ``entropy``): the
    entropy baseline of the machine-text detection literature (e.g. DetectGPT's, Mitchell et al. 2023), used here
    as a membership score.

    Args:
        entropy: float [..., T] each token's predictive entropy in nats (``TokenStats.entropy``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> print(entropy(jnp.array([[2.0, 1.0, 5.0]]), jnp.array([[1, 1, 0]], bool)))
    [-1.5]
    """
    return -masked_mean(entropy, mask)


@register("rank")
def rank(rank: ArrayLike, mask: ArrayLike) -> jax.Array:
    """Minus the mean log-rank of the target tokens (rank 1 = the most likely token).

    score = -(1/n) sum_i log rank_i, rank_i = 1 + #{v != x_i : logit_v > logit_{x_i}} (``stats.token_stats``):
    the log-rank baseline of the machine-text detection literature (e.g. DetectGPT's, Mitchell et al. 2023), used
    here as a membership score.

    Args:
        rank: int or float [..., T] each target token's rank, 1 = the most likely (``TokenStats.rank``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> print(rank(jnp.array([[1, 1, 0]]), jnp.array([[1, 1, 0]], bool)))  # padding may hold rank 0
    [-0.]
    """
    return -masked_mean(jnp.log(real(rank, mask, 1.0)), mask)
