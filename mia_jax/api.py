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

from typing import Iterable, Sequence

import numpy as np

from mia_jax import models
from mia_jax.errors import UserError
from mia_jax.evaluation.metrics import scores_by_method
from mia_jax.scorers import DEFAULT_K, DEFAULT_METHODS, expand_methods


def text_list(texts: Iterable[str]) -> list[str]:
    """``texts``, any iterable of strings (a list, a tuple, a generator, a NumPy array of str), as a list; a single
    string, a non-iterable or an element that is not a string: UserError.

    Args:
        texts: the texts.

    Returns:
        The texts as a list of str.
    """
    if isinstance(texts, (str, bytes)):
        raise UserError("texts must be an iterable of strings, got a single string (a single text goes in a list: "
                        "[text])")
    try:
        out = list(texts)
    except TypeError:
        raise UserError(f"texts must be an iterable of strings, got {type(texts).__name__}") from None
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise UserError(f"texts must be an iterable of strings; text {i} is a {type(t).__name__}: {t!r:.60}")
    return out


def score(model, texts: Iterable[str], methods: Sequence[str] = DEFAULT_METHODS, *, k: Sequence[float] = DEFAULT_K,
          ref=None, tokens_per_batch: int | None = None, dtype: str | None = None, resources: dict | None = None,
          progress: bool = False) -> dict[str, np.ndarray]:
    """{method: float64 [len(texts)]} (NaN where a text has no score: empty, a single token, or non-finite logits).

    Multi-pass methods run their second pass. Bad arguments: UserError.

    Args:
        model: a name (``smollm2``), a local Hugging Face folder or GGUF file, or a model ``mia_jax.models.load``
            returned.
        texts: any iterable of strings (``text_list``).
        methods: registered names (at least one); a bare ``min_k`` / ``max_k`` / ``min_k_pp`` becomes one method
            per fraction in ``k`` (``min_k@0.2``).
        k: the fractions of a bare name that takes one.
        ref: the reference model of the method ``ref`` (which needs it), given as ``model``.
        tokens_per_batch: the token budget of one scoring step (default per backend).
        dtype: the forward's (default bfloat16 on GPU/TPU, float32 on CPU).
        resources: what scorers that name one need (``scorers.check_resources``; e.g. DC-PDD's ``freq_table``).
        progress: whether to show a progress bar.

    Returns:
        {method: float64 ``np.ndarray`` [len(texts)]}, higher = more likely a member; NaN where a text has no score.
    """
    import mia_jax.methods  # noqa: F401 (registers the multi-pass methods)
    from mia_jax.engine import runner  # ~50 ms (tqdm, the windowed audit): not at `import mia_jax`, only to score

    texts = text_list(texts)
    methods = expand_methods([methods] if isinstance(methods, str) else list(methods), list(k))

    def loaded_model(m):
        if hasattr(m, "tokenizer") and hasattr(m, "model"):
            return m
        return models.load(m, dtype=dtype or runner.default_dtype())

    loaded = loaded_model(model)
    records = runner.score_dataset(loaded, texts, methods, ref=None if ref is None else loaded_model(ref),
                                   tokens_per_batch=tokens_per_batch, resources=resources, progress=progress)
    return scores_by_method(records, methods)
