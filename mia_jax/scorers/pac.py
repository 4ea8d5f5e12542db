"""PAC, Polarized Augment Calibration (Ye et al., ACL 2024 Findings, "Data Contamination Calibration for Black-box
LLMs"), following the authors' code (github.com/yyy01/PAC, ``attack.py``).

Polarized distance of a text with n scored tokens, their log-probabilities l_1..l_n (natural log, as their
``calculate_probs_others``: ``log_softmax``, despite the name "probs"):

    PD(x) = mean(the k_far highest l_i) - mean(the k_near lowest l_i),
    k_far = max(1, floor(0.05 n)),  k_near = max(1, floor(0.3 n))

(``calculate_Polarized_Distance(prob_list, ratio_local=0.3, ratio_far=0.05)``: the "far" region is the 5% most
likely tokens, the "near"/local one the 30% least likely; the counts are fractions of the text's tokens.)

    PAC(x) = PD(x) - mean_j PD(x~_j)

over N = 5 random-swap augmentations x~_j (``mia_jax.augment``). Their evaluation is
``roc_auc_score(labels, -PAC)``: a *lower* PAC means member (a member's least likely tokens are less unlikely, so
its PD is small, and swapping its words widens the gap). This project orients every score higher = member, so:

* ``polarized`` (single pass) = -PD(x) = mean(k_near lowest) - mean(k_far highest);
* ``pac`` = polarized(x) - mean_j polarized(x~_j) = -PAC(x): the same ranking (and AUROC) as theirs.

1 + N forwards per text: the main pass, then the ``augment`` pass (``passes.neighbor_pass`` over the augmentations,
cached in ``out_dir/neighbors/`` under the augmenter's config; identical augmentations dropped and counted).
Differences from their code: the counts use the exact ``k_count`` (theirs ``int(n * ratio)``, see
``scorers.min_k``); which tokens are scored (a first token without BOS) follows this project's per-model policy
(theirs reads ``tokenizer.encode(text)`` and scores every token after the first); augmentations are seeded per
text (see ``mia_jax.augment``).
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from mia_jax import passes
from mia_jax.augment import DEFAULT_ALPHA, DEFAULT_N, EdaAugmenter
from mia_jax.scorers.base import register, register_multi_pass
from mia_jax.scorers.min_k import lowest_k_mean
from mia_jax.scorers.reduce import floating

FAR = 0.05  # ratio_far: the most likely tokens
NEAR = 0.3  # ratio_local: the least likely tokens


@register("polarized")
def polarized(logprob, mask, *, near: float = NEAR, far: float = FAR) -> jax.Array:
    """-PD (PAC's polarized distance, negated so higher = member): mean of the 30% least likely token log-probs
    minus mean of the 5% most likely.

    score = mean(the max(1, floor(near n)) lowest l_i) - mean(the max(1, floor(far n)) highest l_i) (module
    docstring: Ye et al. 2024 and their ``calculate_Polarized_Distance``, here negated).

    >>> import jax.numpy as jnp
    >>> logprob = jnp.array([[-4.0, -3.0, -2.0, -1.0, -0.5, -0.5, -0.5, -0.5, -0.5, -0.25]])
    >>> print(polarized(logprob, jnp.ones((1, 10), bool)))  # mean(-4, -3, -2) - (-0.25)
    [-2.75]
    """
    return lowest_k_mean(logprob, mask, near) + lowest_k_mean(-floating(logprob), mask, far)


@register_multi_pass("pac", pass_kind="augment", pass_method="polarized")
def pac(main: np.ndarray, augmented: np.ndarray, texts: Sequence[str]):
    """PAC (Ye et al. 2024): polarized(text) - mean polarized(its random-swap augmentations), = -PAC as published."""
    augmented = np.asarray(augmented, np.float64)
    scores = np.asarray(main, np.float64) - augmented
    reasons = {int(i): "pac: no augmentation could be scored" for i in np.flatnonzero(np.isnan(augmented))}
    return scores, reasons


_RENAMED = {"n_neighbors": "n_augmentations", "n_identical_neighbors": "n_identical_augmentations"}


@passes.register_pass("augment")
def augment_pass(name: str, loaded, texts: Sequence[str], *, resume: bool, method: str = "polarized", out_dir=None,
                 out_path=None, augmenter=None, augment_n: int = DEFAULT_N, augment_alpha: float = DEFAULT_ALPHA,
                 augment_seed: int = 0, **_) -> passes.Pass:
    """The target model on every text's random-swap augmentations (``augmenter``, default
    ``EdaAugmenter(augment_n, augment_alpha, augment_seed)``): ``passes.neighbor_pass`` with the augmenter in
    place of the neighbour generator (the ``neighbors`` option, the ``neighbor`` method's, is not used). Folded:
    per text the mean ``method`` score of its augmentations; counts ``n_augmentations`` (scored) and
    ``n_identical_augmentations`` (dropped), apart from the ``neighbor`` method's."""
    gen = augmenter if augmenter is not None else EdaAugmenter(augment_n, augment_alpha, augment_seed)
    inner = passes.neighbor_pass(name, loaded, texts, neighbors=gen, out_dir=out_dir, out_path=out_path,
                                 resume=resume, method=method)
    fold = inner.fold

    def renamed(recs):
        values, reasons, counts = fold(recs)
        reasons = {i: r.replace("(no word could be replaced)", "(no two different words to swap)")
                   .replace("neighbours", "augmentations") for i, r in reasons.items()}
        return values, reasons, {_RENAMED.get(k, k): v for k, v in counts.items()}

    inner.fold = renamed
    return inner
