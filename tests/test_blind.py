"""The model-free blind baseline: out-of-fold, seeded, and it finds WikiMIA's distribution shift."""
import numpy as np
import pytest

from mia_jax.blind import WARN_AUROC, blind_bow_scores, warning
from mia_jax.data import wikimia
from mia_jax.errors import UserError
from mia_jax.metrics import auroc


def test_wikimia32_members_are_separable_without_any_model():
    ds = wikimia(32)
    scores = blind_bow_scores(ds.texts, ds.labels, seed=0)
    assert scores.shape == (776,) and np.all((scores >= 0) & (scores <= 1))
    assert auroc(ds.labels, scores) > 0.9  # Das et al. 2024 report ~0.99 for a bag-of-words on WikiMIA
    np.testing.assert_array_equal(scores, blind_bow_scores(ds.texts, ds.labels, seed=0))
    assert "WARNING" in warning(auroc(ds.labels, scores))


def test_no_signal_when_labels_are_random():
    ds = wikimia(32)
    labels = np.random.default_rng(0).permutation(ds.labels)
    a = auroc(labels, blind_bow_scores(ds.texts, labels, seed=0))
    assert abs(a - 0.5) < 0.1
    assert a <= WARN_AUROC and warning(a) is None


def test_too_few_examples():
    with pytest.raises(UserError, match="at least 5 members"):
        blind_bow_scores(["a", "b", "c", "d"], [1, 0, 1, 0])
