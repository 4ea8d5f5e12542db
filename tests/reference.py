"""Plain float64 NumPy references for the token statistics and the scorers."""
import zlib as zlib_mod

import numpy as np


def ref_token_arrays(logits, targets, vocab_size=None):
    """Per-token (log p, mu, sigma, entropy, rank) from full logits, in float64."""
    x = np.asarray(logits, np.float64)
    if vocab_size is not None:
        x = x[..., :vocab_size]
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    logp = x - lse[..., None]
    p = np.exp(logp)
    lp = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    mu = (p * logp).sum(-1)
    sigma = np.sqrt((p * logp**2).sum(-1) - mu**2)
    ent = -mu
    rank = 1 + (x > np.take_along_axis(x, targets[..., None], -1)).sum(-1)
    return lp, mu, sigma, ent, rank


def reference_scores(lp, mu, sigma, ent, rank, text, k):
    """Per-example plain NumPy, written the way the published code reads (sorted lists)."""
    n = len(lp)
    count = max(1, int(round(k * 10**6)) * n // 10**6)
    z = (lp - mu) / sigma
    return {
        "loss": lp.mean(),
        "ppl": -np.exp(-lp.mean()),
        "zlib": lp.mean() / len(zlib_mod.compress(text.encode("utf-8"))),
        f"min_k@{k:g}": np.mean(np.sort(lp)[:count]),
        f"max_k@{k:g}": np.mean(np.sort(lp)[::-1][:count]),
        f"min_k_pp@{k:g}": np.mean(np.sort(z)[:count]),
        "entropy": -ent.mean(),
        "rank": -np.log(rank).mean(),
    }
