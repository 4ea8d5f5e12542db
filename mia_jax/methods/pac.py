"""PAC (Ye et al., ACL 2024 Findings): the polarized distance of a text (``scorers.pac.polarized``, whose docstring
gives the formula and where it follows the authors' code) minus the mean over its random-swap augmentations
(``mia_jax.methods.augment``): the ``augment`` pass (``basic.neighbor_pass`` over the augmentations, cached in
``out_dir/neighbors/`` under the augmenter's config; identical augmentations dropped and counted) and ``pac``'s
combine function. 1 + N forwards per text."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mia_jax.engine import passes
from mia_jax.methods.augment import DEFAULT_ALPHA, DEFAULT_N, EdaAugmenter
from mia_jax.methods.basic import neighbor_pass
from mia_jax.scorers.base import register_multi_pass


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
    ``EdaAugmenter(augment_n, augment_alpha, augment_seed)``): ``basic.neighbor_pass`` with the augmenter in
    place of the neighbour generator (the ``neighbors`` option, the ``neighbor`` method's, is not used). Folded:
    per text the mean ``method`` score of its augmentations; counts ``n_augmentations`` (scored) and
    ``n_identical_augmentations`` (dropped), apart from the ``neighbor`` method's."""
    gen = augmenter if augmenter is not None else EdaAugmenter(augment_n, augment_alpha, augment_seed)
    inner = neighbor_pass(name, loaded, texts, neighbors=gen, out_dir=out_dir, out_path=out_path,
                                 resume=resume, method=method)
    fold = inner.fold

    def renamed(recs):
        values, reasons, counts = fold(recs)
        reasons = {i: r.replace("(no word could be replaced)", "(no two different words to swap)")
                   .replace("neighbours", "augmentations") for i, r in reasons.items()}
        return values, reasons, {_RENAMED.get(k, k): v for k, v in counts.items()}

    inner.fold = renamed
    return inner
