"""DC-PDD (Zhang et al., EMNLP 2024, *Pretraining Data Detection for Large Language Models: A Divergence-based
Calibration Method*): token probabilities calibrated by a reference corpus's token frequencies, one forward pass.

For a text's predicted tokens x_1..x_n (the runner's targets, ``ids``), with p_i = p(x_i | x_<i; M) the
model's probability and f(v) = (count(v) + 1) / (N + |V|) the Laplace-smoothed frequency of token v in a reference
corpus counted with the model's tokenizer (``mia_jax.methods.freq``):

    alpha_i = min(-p_i * log f(x_i), a)                      (a = 0.01)
    score   = (1 / |FOS|) * sum_{i in FOS} alpha_i

FOS keeps each distinct token id at its first occurrence among the predicted tokens only. alpha_i is one term of
the cross-entropy of the frequency distribution under the model's distribution, -p log f (not the KL term
p log(p / f)); clipping at a stops a few rare tokens from dominating. A higher score means the model is confident
on tokens that are rare in general text: a member, as in the paper (beta > tau -> member) and the authors'
evaluation (``pred = -mean(ce)`` then ``roc_curve(label, -pred)``). Rows without tokens score NaN.

The authors' code (github.com/zhang-wei-chao/DC-PDD, ``com_det_sco.py`` / ``src/com_fre_dis.py``) as published
differs from the paper, and cannot run as is: it computes the smoothed ``fre_dis_smo`` but indexes the raw counts
``fre_dis`` (a Python list, with a NumPy index list), and compares with ``a`` parsed as a string. We follow the paper
and the code's evident intent (its comment: add-one smoothing): smoothed frequencies, first occurrences over the
predicted tokens (``input_ids[1:]``, as here), ``ce[ce > a] = a``, the plain mean. Also differing: the authors size
the frequency table by the model's embedding rows (50304 for Pythia), we by the tokenizer's vocabulary (only the
smoothing denominator changes, by the padding rows); they count the first 1024 tokens of each corpus document
(``mia-jax freq-table --max-tokens 1024`` does too; default: every token); they cut each text to its first
``max_cha`` words before scoring (here: the data as given, cut only to the model's context).

The resource ``freq_table`` is a ``mia_jax.methods.freq.FreqTable`` (preferred: it carries the tokenizer's identity,
which ``freq.for_model`` / ``FreqTable.load(path, tokenizer)`` check against the model's) or a 1-D array of the smoothed
probabilities f(v) themselves; ``scorers.resource_arrays`` turns either into the float32 array ``dc_pdd`` reads
(``freq=``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from mia_jax.errors import UserError
from mia_jax.scorers.base import RESOURCES, Resource, register
from mia_jax.scorers.reduce import floating, masked_mean, real

A_CLIP = 0.01  # the paper's and the authors' default a


def first_occurrence(ids: ArrayLike, mask: ArrayLike) -> jax.Array:
    """bool ``[..., T]``: True at the first real (``mask``) position of each distinct id in its row.

    One sort per row by (padding last, id, position): each run of equal real ids starts at its first occurrence,
    which is put back in place by the inverse permutation. O(T log T) per row, O(T) memory.

    Args:
        ids: int [..., T] token ids.
        mask: bool [..., T] the real positions.

    Returns:
        bool [..., T] the first occurrences.

    >>> import jax.numpy as jnp
    >>> ids, mask = jnp.array([[7, 3, 7, 3, 5, 3]]), jnp.array([[1, 1, 1, 1, 0, 1]], bool)
    >>> print(first_occurrence(ids, mask))
    [[ True  True False False False False]]
    """
    ids, mask = jnp.asarray(ids), jnp.asarray(mask, bool)
    axis = ids.ndim - 1
    slot = jax.lax.broadcasted_iota(jnp.int32, ids.shape, axis)
    padding, ranked, order = jax.lax.sort(((~mask).astype(jnp.int32), ids, slot), dimension=axis, num_keys=3)
    starts = jnp.concatenate([jnp.ones_like(ranked[..., :1], bool), ranked[..., 1:] != ranked[..., :-1]], axis=-1)
    inverse = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(starts & (padding == 0), inverse, axis=-1)


@register("dc_pdd", resources={"freq_table": "freq"})
def dc_pdd(logprob: ArrayLike, ids: ArrayLike, mask: ArrayLike, *, freq: ArrayLike, a: float = A_CLIP) -> jax.Array:
    """DC-PDD: mean over first-occurring tokens of min(-p(x_i) log f(x_i), 0.01), f the reference corpus's smoothed
    token frequency (needs --freq-table).

    score = (1/|FOS|) sum_{i in FOS} min(-exp(l_i) log f(x_i), a), FOS the first occurrence of each distinct id
    among the scored tokens (module docstring). A row holding a scored id outside ``0..V-1`` (a table counted with
    another tokenizer) is NaN: ``device_scores`` and ``score_batch`` refuse such ids with a UserError wherever the ids
    are concrete, i.e. outside a trace.

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        ids: int [..., T] the target token ids (the token each log-prob is of).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        freq: float [V] the smoothed frequencies f (``resource_arrays``' ``freq_table``).
        a: the clip of each token's term.

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> freq = jnp.array([0.5, 0.25, 0.125, 0.125])
    >>> logprob = jnp.log(jnp.array([[0.001, 0.004, 0.5, 0.002]]))
    >>> ids, mask = jnp.array([[1, 2, 1, 4]]), jnp.array([[1, 1, 1, 0]], bool)
    >>> round(float(dc_pdd(logprob, ids, mask, freq=freq)[0]), 5)  # min(0.001 log 4, a), min(0.004 log 8, a)
    0.00485
    """
    ids, mask, freq = jnp.asarray(ids), jnp.asarray(mask, bool), floating(freq)
    inside = (ids >= 0) & (ids < freq.shape[-1])
    keep = first_occurrence(ids, mask) & inside
    index = jnp.where(keep, ids, 0)
    f = jnp.where(keep, freq.at[index].get(out_sharding=jax.typeof(index).sharding), 1.0)  # sharded like the ids
    alpha = jnp.minimum(jnp.exp(real(logprob, keep)) * -jnp.log(f), a)
    return jnp.where((mask & ~inside).any(-1), jnp.nan, masked_mean(alpha, keep))


def _probabilities(resource) -> np.ndarray:
    """The smoothed frequencies, float32 ``[V]``, of a ``FreqTable`` resource or of a 1-D probability array."""
    freq = resource.probabilities() if hasattr(resource, "probabilities") else np.asarray(resource, np.float64)
    if freq.ndim != 1 or not freq.size or not np.all((freq > 0) & (freq <= 1)):
        raise UserError("freq_table must be a mia_jax.methods.freq.FreqTable or a 1-D array of probabilities in (0, 1]")
    return np.asarray(freq, np.float32)


def _check_ids(ids: np.ndarray, mask: np.ndarray, freq: np.ndarray) -> None:
    """UserError for a scored id outside the table (counted with another tokenizer)."""
    real_ids = np.asarray(ids)[np.asarray(mask, bool)]
    size = np.shape(freq)[-1]
    if real_ids.size and (real_ids.min() < 0 or real_ids.max() >= size):
        bad = int(real_ids.max() if real_ids.max() >= size else real_ids.min())
        raise UserError(f"dc_pdd: token id {bad} is outside the frequency table's vocabulary of {size}: the table "
                        "was counted with another tokenizer; make one with this model (mia-jax freq-table --model M)")


RESOURCES["freq_table"] = Resource(
    "freq_table", ("make one with `mia-jax freq-table --model M --corpus FILE --out T.npz` (default corpus: the "
                   "bundled Pile sample) and pass it with --freq-table T.npz"), _probabilities, _check_ids)
