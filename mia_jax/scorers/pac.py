"""PAC, Polarized Augment Calibration (Ye et al., ACL 2024 Findings, "Data Contamination Calibration for Black-box
LLMs"), following the authors' code (github.com/yyy01/PAC, ``attack.py``).

Polarized distance of a text with n scored tokens, their log-probabilities l_1..l_n (natural log, as their
``calculate_probs_others``: ``log_softmax``, despite the name "probs"):

    PD(x) = mean(the k_far highest l_i) - mean(the k_near lowest l_i),
    k_far = max(1, floor(0.05 n)),  k_near = max(1, floor(0.3 n))

(``calculate_Polarized_Distance(prob_list, ratio_local=0.3, ratio_far=0.05)``: the "far" region is the 5% most
likely tokens, the "near"/local one the 30% least likely; the counts are fractions of the text's tokens.)

    PAC(x) = PD(x) - mean_j PD(x~_j)

over N = 5 random-swap augmentations x~_j (``mia_jax.methods.augment``). Their evaluation is
``roc_auc_score(labels, -PAC)``: a *lower* PAC means member (a member's least likely tokens are less unlikely, so
its PD is small, and swapping its words widens the gap). This project orients every score higher = member, so:

* ``polarized`` (single pass) = -PD(x) = mean(k_near lowest) - mean(k_far highest);
* ``pac`` = polarized(x) - mean_j polarized(x~_j) = -PAC(x): the same ranking (and AUROC) as theirs.

1 + N forwards per text: the main pass, then the ``augment`` pass (``passes.neighbor_pass`` over the augmentations,
cached in ``out_dir/neighbors/`` under the augmenter's config; identical augmentations dropped and counted).
Differences from their code: the counts use the exact ``k_count`` (theirs ``int(n * ratio)``, see
``scorers.min_k``); which tokens are scored (a first token without BOS) follows this project's per-model policy
(theirs reads ``tokenizer.encode(text)`` and scores every token after the first); augmentations are seeded per
text (see ``mia_jax.methods.augment``).
"""
from __future__ import annotations


import jax
from jax.typing import ArrayLike

from mia_jax.scorers.base import register
from mia_jax.scorers.min_k import lowest_k_mean
from mia_jax.scorers.reduce import floating

FAR = 0.05  # ratio_far: the most likely tokens
NEAR = 0.3  # ratio_local: the least likely tokens


@register("polarized")
def polarized(logprob: ArrayLike, mask: ArrayLike, *, near: float = NEAR, far: float = FAR) -> jax.Array:
    """-PD (PAC's polarized distance, negated so higher = member): mean of the 30% least likely token log-probs
    minus mean of the 5% most likely.

    score = mean(the max(1, floor(near n)) lowest l_i) - mean(the max(1, floor(far n)) highest l_i) (module
    docstring: Ye et al. 2024 and their ``calculate_Polarized_Distance``, here negated).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        near: the fraction of the least likely tokens (``ratio_local``).
        far: the fraction of the most likely tokens (``ratio_far``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob = jnp.array([[-4.0, -3.0, -2.0, -1.0, -0.5, -0.5, -0.5, -0.5, -0.5, -0.25]])
    >>> print(polarized(logprob, jnp.ones((1, 10), bool)))  # mean(-4, -3, -2) - (-0.25)
    [-2.75]
    """
    return lowest_k_mean(logprob, mask, near) + lowest_k_mean(-floating(logprob), mask, far)
