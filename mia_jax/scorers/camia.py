"""CAMIA (Chang et al., EMNLP 2025, *Context-Aware Membership Inference Attacks against Pre-trained Large Language
Models*): membership signals read from the *trajectory* of the per-token loss of a text, and from the same text read
again after itself. Each signal is its own registered method so that each can be evaluated alone (the paper combines
them afterwards; here that is dataset inference's job).

Notation: a text's predicted tokens x_1..x_n (the runner's masked positions, in order), l_i = log p(x_i | x_<i) the
token log-likelihood (the LM loss is -l_i), c_j = (1/j) sum_{i<=j} l_i the prefix-averaged (cumulative mean)
log-likelihood. Every score is oriented higher = member.

Single pass (pure float64 NumPy over a ``TokenBatch``, vectorised over the batch; the same formulas in
``jax.numpy`` in ``DEVICE_FORMS``, for ``scorers.device``):

- ``camia_slope``: the least-squares slope of c_j against j = 1..n, i.e. minus the slope of the cumulative mean
  loss: a member's loss falls faster as the model reads more of it. n < 2: NaN (one point has no slope).
- ``camia_count_1``, ``camia_count_2``, ``camia_count_3``: the share of the first 200 predicted tokens whose loss is
  at most tau = 1, 2, 3 nats (l_i >= -tau). n = 0: NaN; n = 1: 0 or 1.
- ``camia_count_pre``: the share of tokens x_i, i >= 2, whose log-likelihood is above the mean of the tokens before
  it (l_i > c_{i-1}: the loss still falling below the cumulative mean). n < 2: NaN.
- ``camia_loss_200``, ``camia_loss_300``: the mean log-likelihood of the first 200 / 300 predicted tokens (the
  paper's cut-off loss). n = 0: NaN.
- ``camia_calibrated``: mean log-likelihood / token diversity, diversity = (distinct target ids) / n: a low loss on
  repetitive text is expected and says less. n = 0: NaN.
- Not registered, a function only: ``lempel_ziv_scores``, minus the Lempel-Ziv complexity of the log-likelihood
  sequence of the first 200 tokens quantised to 3 levels (the authors' binning; a sequential parse, with no
  ``jax.numpy`` form, which every registered single-pass scorer must have).
- ``camia_ll_tail``: the mean log-likelihood without the first predicted token (n < 2: NaN): the repeat pass's
  score on a tokenizer without BOS (below); not a CAMIA signal itself.

Two passes:

- ``camia_repeat`` = LL(x) - LL(x | x): the mean log-likelihood of the text alone minus that of the text read after
  itself (pass ``repeat``: each text is its own prefix, only the second copy scored, ``runner.encode``). Reading a
  text a second time lets the model copy it; a member is already predicted well, so it gains less: a smaller gain,
  a higher score. Both means are over the same tokens: a tokenizer that adds BOS scores x_1..x_n in both passes;
  without BOS the text alone has no prediction for x_1, so the second copy's x_1 (predicted at the junction of the
  two copies) is left out too (``camia_ll_tail``). A text that alone fills the model's context cannot be read after
  itself: NaN with that reason. A text longer than half the context is read after only the end of its first copy
  (the prefix is cut from its start; ``truncated`` and ``n_context`` in ``passes/repeat.jsonl`` say how much).

The authors' code (github.com/changhongyan123/context_aware_mia: ``util_features.py``, ``run_ours_train_lr.py``,
``run_ours_construct_mia_data.py``), followed for the thresholds, cut-offs and binning; where this differs:

- Orientation: the authors choose each feature's sign from the labels (a feature whose member mean is above the
  non-member mean is negated) and then combine per-feature p-values against non-member scores. Here each sign is
  fixed in advance by the mechanism the signal stands for (above), as this project's convention requires; a sign
  that is wrong for some model or data shows up as an AUROC below 0.5.
- Slope: the authors' slope is ``np.polyfit`` of the raw token log-probabilities over the first 600 / 800 / 1000
  tokens of the text repeated six times; here (one pass, as the issue describes the paper's signal) the slope of the
  cumulative mean over the text itself.
- Repeat: the authors read six copies joined by spaces (``x + " " + x`` and four more, one forward) and take each
  feature of copy 1 minus that of copy 2 and of copy 3 (for the loss: LL(x) - LL(x | x), as here), finding the
  copies by searching their token ids (``find_sublist_indices``, from each copy's third token: the joining space
  changes the tokenisation of the first ones). Here two forwards: the text alone, then its ids read after its own
  ids (no separator, so the second copy has exactly the text's tokens and nothing needs searching); one copy
  compared, on the loss only.
- ``count_above`` (their name): the same thresholds (log-prob >= -1, -2, -3) and cut-off (first 200 tokens).
  ``count_above_pre``: their cut-offs are all tokens, 200 and 300; here all tokens.
- Their ``loss`` feature over "all tokens" slices ``x[:-1]`` and so drops the last token; here every token. Their
  token diversity counts the input ids (the first token included); here the predicted ones (``batch.ids``).
- Not registered: ``ppl`` and ``calibrated_ppl`` (monotone or near-monotone in the loss ones), ``count_mean`` (a
  count, not a share: it grows with the length), ``find_t`` (filtered out by the authors), the approximate entropy
  (the authors compute it on the six-copy text with m = 8, r = 0.8 std, which this pass does not read) and the
  copy differences of the non-loss features (each would need the repeat pass again: the runner runs one pass per
  (kind, pass method)).
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from mia_jax import passes
from mia_jax.scorers.base import TokenBatch, register, register_multi_pass
from mia_jax.scorers.dcpdd import first_occurrence

COUNT_CUTOFF = 200  # the authors' count_above reads the first 200 predicted tokens
COUNT_THRESHOLDS = (1, 2, 3)  # loss thresholds in nats (their log-prob thresholds -1, -2, -3)
LOSS_CUTOFFS = (200, 300)  # the authors' cut-off loss
LZ_CUTOFF, LZ_BINS = 200, 3  # the authors' Lempel-Ziv complexity: first 200 tokens, bins 3 (of 3, 4, 5)


# ---------------------------------------------------------------------------------------------- pure functions
# Each formula is written once for an array module ``xp``: NumPy (float64, the registered scorers) or jax.numpy
# (``DEVICE_FORMS``: under jit / vmap / grad, float32). Shapes [..., T]; ``mask`` marks the scored tokens. Divisions
# never see a zero (a row without the tokens a formula needs is NaN by a final ``where``), so zero padding gives
# finite gradients and the host path raises no floating-point warning.

def positions(mask, xp=np):
    """j = 1, 2, ... at each row's real (``mask``) positions in order, 0 elsewhere (a prefix's context and the
    padding are not positions of the text)."""
    return xp.where(mask, xp.cumsum(mask, axis=-1), 0)


def _nonzero(x, xp):
    return xp.where(x > 0, x, 1)


def cumulative_mean(values, mask, xp=np):
    """c_j = mean of a row's first j real values, at its j-th real position (0 elsewhere)."""
    j = positions(mask, xp).astype(values.dtype)
    return xp.where(mask, xp.cumsum(xp.where(mask, values, 0), axis=-1) / _nonzero(j, xp), 0)


def trajectory_slope(values, mask, xp=np):
    """Least-squares slope of the cumulative mean c_j against j = 1..n per row, in closed form:
    sum_j (j - (n + 1)/2) c_j / (n (n^2 - 1) / 12). NaN for a row with fewer than 2 real values."""
    j = positions(mask, xp).astype(values.dtype)
    n = mask.sum(-1).astype(values.dtype)
    centred = xp.where(mask, j - (n[..., None] + 1) / 2, 0)
    sxy = (centred * cumulative_mean(values, mask, xp)).sum(-1)
    two = n >= 2
    return xp.where(two, sxy / xp.where(two, n * (n * n - 1) / 12, 1), xp.nan)


def share(hit, keep, xp=np):
    """Per row, the share of the ``keep`` positions where ``hit`` is True (NaN where none is kept)."""
    n = keep.sum(-1)
    return xp.where(n > 0, (hit & keep).sum(-1) / _nonzero(n, xp), xp.nan)


def first_tokens(mask, limit: int, xp=np):
    """The mask of each row's first ``limit`` real positions."""
    return mask & (positions(mask, xp) <= limit)


def count_below(logprob, mask, tau: float, cutoff: int = COUNT_CUTOFF, xp=np):
    """Share of the first ``cutoff`` tokens with loss at most ``tau`` (log p >= -tau, as the authors compare)."""
    return share(logprob >= -tau, first_tokens(mask, cutoff, xp), xp)


def count_above_prefix_mean(logprob, mask, xp=np):
    """Share of the tokens i >= 2 with l_i > c_{i-1}, the mean log-likelihood of the tokens before it."""
    j = positions(mask, xp)
    lp = xp.where(mask, logprob, 0)
    before = xp.cumsum(lp, axis=-1) - lp  # the sum of the real values before each position
    later = mask & (j >= 2)
    prev_mean = before / xp.where(later, j - 1, 1).astype(lp.dtype)
    return share(lp > prev_mean, later, xp)


def masked_mean(values, keep, xp=np):
    """Mean of each row's kept values (NaN where none is kept)."""
    n = keep.sum(-1)
    return xp.where(n > 0, xp.where(keep, values, 0).sum(-1) / _nonzero(n, xp).astype(values.dtype), xp.nan)


def tail_mean(values, mask, xp=np):
    """Mean of each row's real values without its first (NaN below 2)."""
    return masked_mean(values, mask & (positions(mask, xp) >= 2), xp)


def token_diversity(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Distinct ids / real tokens per row (NaN for a row without tokens)."""
    mask = np.asarray(mask, bool)
    return share(first_occurrence(ids, mask), mask)


def lempel_ziv(values: np.ndarray, bins: int = LZ_BINS) -> float:
    """The authors' ``lempel_ziv_complexity`` of one sequence of log-probabilities: each value is placed on 100 levels
    from the sequence's minimum to 0 (``np.digitize(..., right=True)``), the levels cut into ``bins`` equal ranges
    between the lowest and highest level used, and the sequence parsed left to right into sub-words not seen before;
    the number of sub-words / the length. NaN for an empty sequence.

    Not registered: a sequential parse has no ``jax.numpy`` form (``scorers.device``), which every registered
    single-pass scorer must have. ``lempel_ziv_scores(batch.stats.logprob, batch.mask)`` gives it per row."""
    x = np.asarray(values, np.float64)
    if not x.size:
        return float("nan")
    level = np.digitize(x, bins=np.linspace(x.min(), 0, 100), right=True)
    seq = np.searchsorted(np.linspace(level.min(), level.max(), bins + 1)[1:], level, side="left").tolist()
    seen: set[tuple[int, ...]] = set()
    start, width, n = 0, 1, len(seq)
    while start + width <= n:
        word = tuple(seq[start: start + width])
        if word in seen:
            width += 1
        else:
            seen.add(word)
            start, width = start + width, 1
    return len(seen) / n


def lempel_ziv_scores(logprob: np.ndarray, mask: np.ndarray, cutoff: int = LZ_CUTOFF, bins: int = LZ_BINS):
    """Minus the Lempel-Ziv complexity of each row's first ``cutoff`` log-likelihoods (higher = the more regular
    trajectory, taken to be the member's; the authors pick the sign from the labels; NaN for a row without tokens)."""
    keep = first_tokens(np.asarray(mask, bool), cutoff)
    return -np.array([lempel_ziv(np.asarray(v, np.float64)[k], bins) for v, k in zip(logprob, keep)], np.float64)


# ------------------------------------------------------------------------------------------ registered methods
# name -> f(logprob, mask, xp): the whole formula of each registered single-pass method that reads only the
# log-likelihoods, for the host scorer (xp = np) and ``DEVICE_FORMS`` (xp = jax.numpy) alike
FORMULAS = {
    "camia_slope": trajectory_slope,
    **{f"camia_count_{tau}": (lambda lp, m, xp, tau=tau: count_below(lp, m, tau, COUNT_CUTOFF, xp))
       for tau in COUNT_THRESHOLDS},
    "camia_count_pre": count_above_prefix_mean,
    **{f"camia_loss_{cut}": (lambda lp, m, xp, cut=cut: masked_mean(lp, first_tokens(m, cut, xp), xp))
       for cut in LOSS_CUTOFFS},
    "camia_ll_tail": tail_mean,
}

DOCS = {
    "camia_slope": ("CAMIA slope: least-squares slope of the cumulative mean log-likelihood over positions (NaN "
                    "below 2 tokens).\n\nMinus the slope of the prefix-averaged loss: a member's loss falls faster "
                    "as more of it is read."),
    **{f"camia_count_{tau}": (f"CAMIA count below: share of the first {COUNT_CUTOFF} tokens with loss at most {tau} "
                              f"nat{'s' if tau != 1 else ''} (log p >= -{tau}).") for tau in COUNT_THRESHOLDS},
    "camia_count_pre": ("CAMIA count below the prefix mean: share of tokens with log p above the mean of those before "
                        "(NaN below 2).\n\nOver the tokens from the 2nd: l_i > c_{i-1}, the token's loss below the "
                        "cumulative mean loss before it."),
    **{f"camia_loss_{cut}": f"CAMIA cut-off loss: mean log-likelihood of the first {cut} tokens."
       for cut in LOSS_CUTOFFS},
    "camia_ll_tail": ("Mean log-likelihood without the first predicted token (CAMIA's repeat pass without BOS; NaN "
                      "below 2)."),
}


def _host(name: str):
    formula = FORMULAS[name]

    def fn(batch: TokenBatch) -> np.ndarray:
        return formula(batch.stats.logprob, batch.mask, np)

    fn.__name__, fn.__doc__ = name, DOCS[name]
    return register(name)(fn)


for _name in FORMULAS:
    _host(_name)


@register("camia_calibrated", needs_ids=True)
def camia_calibrated(batch: TokenBatch) -> np.ndarray:
    """CAMIA calibrated loss: mean log-likelihood / token diversity (distinct predicted ids / predicted tokens)."""
    return batch.mean(batch.stats.logprob) / token_diversity(batch.ids, batch.mask)


# for ``scorers.device.FORMS``: f(tokens, k) with ``tokens.lp`` / ``tokens.mask`` (padding already 0 / False)
DEVICE_FORMS = {name: (lambda t, k, f=f: f(t.lp, t.mask, jnp)) for name, f in FORMULAS.items()}


# ---------------------------------------------------------------------------------------------- the repeat pass

@passes.register_pass("repeat")
def repeat_pass(name, loaded, texts, *, resume, method="loss", **_) -> passes.Pass:
    """The target model on every text read after itself, only the second copy scored; with ``loss`` on a tokenizer
    without BOS the second copy's first token is left out (``camia_ll_tail``) so that both passes mean over the same
    tokens. A text read with no token of its first copy before it (it alone fills the context) is NaN with the
    reason."""
    scored = "camia_ll_tail" if method == "loss" and not loaded.add_bos else method
    base = passes.same_texts(loaded, list(texts), name, resume, scored, prefixes=list(texts), methods=[scored])
    inner, bos = base.fold, int(bool(loaded.add_bos))

    def fold(recs):
        values, reasons, counts = inner(recs)
        values = np.array(values, np.float64)
        for i, rec in enumerate(recs):  # a context of at most a BOS holds nothing of the first copy
            if "skip_reason" not in rec and rec.get("n_context", 0) - bos < 1:
                values[i] = np.nan
                reasons[i] = (f"{name} pass: the text alone (nearly) fills the model's context of "
                              f"{loaded.max_length} tokens, so it cannot be read after itself")
        return values, reasons, counts

    base.fold = fold
    return base


@register_multi_pass("camia_repeat", pass_kind="repeat", pass_method="loss")
def camia_repeat(loss: np.ndarray, loss_repeat: np.ndarray, texts: Sequence[str]):
    """CAMIA repeat: LL(x) - LL(x | x), the text's mean log-likelihood minus that of its second reading.

    A member is predicted well already, so it gains less from reading itself again: a higher score."""
    return np.asarray(loss, np.float64) - np.asarray(loss_repeat, np.float64), {}
