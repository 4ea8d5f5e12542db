"""EDA-style text augmentation for PAC (Ye et al., ACL 2024 Findings, "Data Contamination Calibration for Black-box
LLMs"): the "adjacent samples" whose polarized distance calibrates a text's (``mia_jax.scorers.pac``).

The authors' code (github.com/yyy01/PAC, ``src/eda.py``, adapted from Wei & Zou's eda_nlp) uses **random swap
only** - no synonym replacement, so no WordNet - with ``alpha = 0.3`` and ``N = 5`` augmentations per text
(``attack.py``: ``eda(prompt, alpha=0.3, num_aug=N)``, ``calculate_PAC(..., N=5)``):

* the text is split on single spaces (``text.split(' ')``: other whitespace stays inside its word, two spaces
  give an empty word) and re-joined with single spaces, so the word multiset is kept exactly;
* each augmentation starts from the original words and applies ``max(1, floor(alpha * n_words))`` swaps in
  sequence; one swap draws a first index uniformly, then draws the second until it differs from the first, but
  gives up (no swap) on the fourth draw, as in ``swap_word``.

Where this differs from their code:

* Seeding. Their code seeds Python's global ``random`` once at import, so a text's augmentations depend on every
  text processed before it. Here each text's draws come from ``neighbors.text_rng(seed, text)``: the same text
  gets the same augmentations whatever else is in the batch and in whatever order.
* Their final ``shuffle`` of a text's augmentations is left out (it changes only their order, not their mean).
* The swap count is ``max(1, floor(alpha * n))`` computed without floating-point error (``scorers.k_count``);
  theirs is ``max(1, int(alpha * n))``, one less where ``alpha * n`` rounds down below an integer.

An augmentation identical to its text (a one-word text, swaps of equal words) is dropped and counted by the
``augment`` pass (``neighbors.drop_identical``), like an identical neighbour.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mia_jax.methods.neighbors import text_rng
from mia_jax.scorers.min_k import k_count

ALGORITHM_VERSION = 1  # part of the config (and so of the cache key): changing the algorithm invalidates caches
DEFAULT_N = 5  # yyy01/PAC attack.py calculate_PAC(N=5)
DEFAULT_ALPHA = 0.3  # yyy01/PAC attack.py eda(prompt, alpha=0.3, ...)
MAX_DRAWS = 4  # swap_word: the second index is drawn at most 4 times; on the 4th draw it gives up


def n_swaps(n_words: int, alpha: float) -> int:
    """Swaps per augmentation: max(1, floor(alpha * n_words)), exactly (``k_count``)."""
    return int(k_count(alpha, n_words))


def swap_once(words: list[str], rng: np.random.Generator) -> None:
    """One random swap in place (yyy01/PAC ``swap_word``): i uniform, j redrawn while j == i; no swap if the
    fourth draw is reached (always the case for a one-word list)."""
    n = len(words)
    i = j = int(rng.integers(n))
    for draw in range(1, MAX_DRAWS + 1):
        j = int(rng.integers(n))
        if draw == MAX_DRAWS:
            return
        if j != i:
            break
    words[i], words[j] = words[j], words[i]


def random_swap(text: str, n: int, alpha: float, rng: np.random.Generator) -> list[str]:
    """``n`` augmentations of ``text``, each ``n_swaps`` random swaps of its space-separated words."""
    words = text.split(" ")
    swaps = n_swaps(len(words), alpha)
    out = []
    for _ in range(n):
        new = list(words)
        for _ in range(swaps):
            swap_once(new, rng)
        out.append(" ".join(new))
    return out


class EdaAugmenter:
    """Random-swap augmentations (see the module doc): a generator like ``neighbors``' (``name``, JSON-able
    ``config``, ``__call__(texts) -> list[list[str]]``, ``n`` per text), so ``passes.neighbor_pass`` and
    ``neighbors.cached_neighbors`` take it; its config (``"generator": "eda"``) keeps its cache entries apart
    from the neighbour generators'."""

    def __init__(self, n: int = DEFAULT_N, alpha: float = DEFAULT_ALPHA, seed: int = 0):
        if n < 1 or not 0 < alpha <= 1:
            raise ValueError(f"need n >= 1 and 0 < alpha <= 1; got n={n}, alpha={alpha}")
        self.n, self.alpha, self.seed = int(n), float(alpha), int(seed)
        self.name = "eda:random_swap"
        self.config = {"generator": "eda", "algorithm": ALGORITHM_VERSION, "ops": ["random_swap"], "n": self.n,
                       "alpha": self.alpha, "seed": self.seed, "words": "text.split(' '), re-joined with ' '",
                       "swaps": "max(1, floor(alpha * words)) per augmentation, from the original words"}

    def __call__(self, texts: Sequence[str]) -> list[list[str]]:
        return [random_swap(t, self.n, self.alpha, text_rng(self.seed, t, 0)) for t in texts]
