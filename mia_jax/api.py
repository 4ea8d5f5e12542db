"""``mia_jax.score``: texts in, one score per text and method out, from a few lines of Python.

    import mia_jax
    scores = mia_jax.score("smollm2", ["The capital of France is Paris.", "Colorless green ideas sleep."],
                           methods=["loss", "min_k", "min_k_pp"])
    scores["min_k_pp@0.2"]  # float64 [2], higher = more likely a member

The same path as ``mia-jax eval`` (``runner.score_dataset``: packed rows, one jitted step, the scores computed on
the device), without a run folder. For scores inside one's own jitted step, from logits already computed, see
``mia_jax.scores_from_logits``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mia_jax import models
from mia_jax.errors import UserError
from mia_jax.metrics import scores_by_method
from mia_jax.scorers import DEFAULT_K, DEFAULT_METHODS, expand_methods


def score(model, texts: Sequence[str], methods: Sequence[str] = DEFAULT_METHODS, *, k: Sequence[float] = DEFAULT_K,
          ref=None, tokens_per_batch: int | None = None, dtype: str | None = None, resources: dict | None = None,
          progress: bool = False) -> dict[str, np.ndarray]:
    """{method: float64 [len(texts)]} (NaN where a text has no score: empty, or a single token).

    ``model``: a name (``smollm2``), a local Hugging Face folder or GGUF file, or a model ``mia_jax.models.load``
    returned. ``methods``: registered names; a bare ``min_k`` / ``max_k`` / ``min_k_pp`` becomes one method per
    fraction in ``k`` (``min_k@0.2``). Multi-pass methods run their second pass (``ref`` needs ``ref``, a model
    as ``model``). ``dtype``: the forward's (default bfloat16 on GPU/TPU, float32 on CPU)."""
    from mia_jax import runner  # ~50 ms (tqdm, the windowed audit): not at `import mia_jax`, only to score

    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise UserError("texts must be a sequence of strings (a single text goes in a list: [text])")
    methods = expand_methods([methods] if isinstance(methods, str) else list(methods), list(k))

    def loaded_model(m):
        if hasattr(m, "tokenizer") and hasattr(m, "model"):
            return m
        return models.load(m, dtype=dtype or runner.default_dtype())

    loaded = loaded_model(model)
    records = runner.score_dataset(loaded, list(texts), methods, ref=None if ref is None else loaded_model(ref),
                                   tokens_per_batch=tokens_per_batch, resources=resources, progress=progress)
    return scores_by_method(records, methods)
