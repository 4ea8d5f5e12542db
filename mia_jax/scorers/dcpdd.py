"""DC-PDD (Zhang et al., EMNLP 2024, *Pretraining Data Detection for Large Language Models: A Divergence-based
Calibration Method*): token probabilities calibrated by a reference corpus's token frequencies, one forward pass.

For a text's predicted tokens x_1..x_n (the runner's targets, ``batch.ids``), with p_i = p(x_i | x_<i; M) the
model's probability and f(v) = (count(v) + 1) / (N + |V|) the Laplace-smoothed frequency of token v in a reference
corpus counted with the model's tokenizer (``mia_jax.freq``):

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

The resource ``freq_table`` (``batch.resources``) is a ``mia_jax.freq.FreqTable`` (preferred: it carries the
tokenizer's identity, which ``freq.for_model`` / ``FreqTable.load(path, tokenizer)`` check against the model's) or
a 1-D array of the smoothed probabilities f(v) themselves.
"""
from __future__ import annotations

import numpy as np

from mia_jax.errors import UserError
from mia_jax.scorers.base import RESOURCE_HINTS, TokenBatch, check_resources, register

A_CLIP = 0.01  # the paper's and the authors' default a

RESOURCE_HINTS["freq_table"] = ("make one with `mia-jax freq-table --model M --corpus FILE --out T.npz` (default "
                                "corpus: the bundled Pile sample) and pass it with --freq-table T.npz")


def first_occurrence(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """bool ``[B, T]``: True at the first real (``mask``) position of each distinct id in its row.

    A stable row-wise sort by id keeps equal ids in position order, so the first of each run is its first
    occurrence: O(B T log T) time, O(B T) memory."""
    ids, mask = np.asarray(ids, np.int64), np.asarray(mask, bool)
    key = np.where(mask, ids, -1)  # padding: one id of its own, dropped below
    order = np.argsort(key, axis=-1, kind="stable")
    ranked = np.take_along_axis(key, order, axis=-1)
    first_ranked = np.ones(ranked.shape, bool)
    first_ranked[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
    first = np.empty_like(first_ranked)
    np.put_along_axis(first, order, first_ranked, axis=-1)
    return first & mask


def dc_pdd_scores(logprob: np.ndarray, ids: np.ndarray, mask: np.ndarray, freq: np.ndarray,
                  a: float = A_CLIP) -> np.ndarray:
    """DC-PDD per row of ``[B, T]`` target log-probs and ids over the real tokens: the mean over first occurrences
    of min(-p_i log f(x_i), a), ``freq`` the smoothed corpus frequencies ``[V]`` (NaN for a row without tokens)."""
    logprob, mask = np.asarray(logprob, np.float64), np.asarray(mask, bool)
    ids = np.asarray(ids, np.int64)
    freq = np.asarray(freq, np.float64)
    real = ids[mask]
    if real.size and (real.min() < 0 or real.max() >= freq.size):
        raise UserError(f"dc_pdd: token id {int(real.max() if real.max() >= freq.size else real.min())} is outside "
                        f"the frequency table's vocabulary of {freq.size}: the table was counted with another "
                        "tokenizer; make one with this model (mia-jax freq-table --model M)")
    keep = first_occurrence(ids, mask)
    f = freq[np.where(keep, ids, 0)]
    alpha = np.minimum(np.exp(np.where(keep, logprob, 0.0)) * -np.log(f), a)
    n = keep.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(keep, alpha, 0.0).sum(-1) / n


def _probabilities(resource) -> np.ndarray:
    """The smoothed frequencies of a ``FreqTable`` resource, or the resource itself as a 1-D probability array."""
    if hasattr(resource, "probabilities"):
        return resource.probabilities()
    freq = np.asarray(resource, np.float64)
    if freq.ndim != 1 or not freq.size or not np.all((freq > 0) & (freq <= 1)):
        raise ValueError("freq_table must be a mia_jax.freq.FreqTable or a 1-D array of probabilities in (0, 1]")
    return freq


@register("dc_pdd", needs_ids=True, resources=("freq_table",))
def dc_pdd(batch: TokenBatch) -> np.ndarray:
    """DC-PDD: mean over first-occurring tokens of min(-p(x_i) log f(x_i), 0.01), f the reference corpus's smoothed
    token frequency (needs --freq-table)."""
    check_resources(["dc_pdd"], batch.resources)  # (the runner checks before any scoring)
    freq = _probabilities(batch.resources["freq_table"])
    return dc_pdd_scores(batch.stats.logprob, batch.ids, batch.mask, freq)
