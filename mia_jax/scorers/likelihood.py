"""Likelihood-family scorers: LOSS (Yeom et al. 2018), PPL, Zlib (Carlini et al. 2021), entropy, rank."""
from __future__ import annotations

import zlib as _zlib

import numpy as np

from mia_jax.scorers.base import TokenBatch, register


@register("loss")
def loss(batch: TokenBatch) -> np.ndarray:
    """Mean token log-likelihood (1/n) sum_i log p(x_i | x_<i), i.e. minus the LM loss."""
    return batch.mean(batch.stats.logprob)


@register("ppl")
def ppl(batch: TokenBatch) -> np.ndarray:
    """Minus the perplexity: -exp(-loss)."""
    return -np.exp(-loss(batch))


def zlib_bytes(text: str) -> int:
    """Length in bytes of the zlib-compressed UTF-8 text (default level), as in the published code."""
    return len(_zlib.compress(text.encode("utf-8")))


@register("zlib", needs_text=True)
def zlib(batch: TokenBatch) -> np.ndarray:
    """Mean token log-likelihood divided by the zlib-compressed length of the text in bytes."""
    sizes = np.array([zlib_bytes(t) for t in batch.texts], np.float64)
    return loss(batch) / sizes


@register("entropy")
def entropy(batch: TokenBatch) -> np.ndarray:
    """Minus the mean predictive entropy: a model is more confident on text it was trained on."""
    return -batch.mean(batch.stats.entropy)


@register("rank")
def rank(batch: TokenBatch) -> np.ndarray:
    """Minus the mean log-rank of the target tokens (rank 1 = the most likely token)."""
    return -batch.mean(np.log(batch.stats.rank))
