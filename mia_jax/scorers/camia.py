"""CAMIA (Chang et al., EMNLP 2025, *Context-Aware Membership Inference Attacks against Pre-trained Large Language
Models*): membership signals read from the *trajectory* of the per-token loss of a text, and from the same text read
again after itself. Each signal is its own registered method so that each can be evaluated alone (the paper combines
them afterwards; here that is dataset inference's job).

Notation: a text's predicted tokens x_1..x_n (the runner's masked positions, in order), l_i = log p(x_i | x_<i) the
token log-likelihood (the LM loss is -l_i), c_j = (1/j) sum_{i<=j} l_i the prefix-averaged (cumulative mean)
log-likelihood. Every score is oriented higher = member.

Single pass (one ``jax.numpy`` function each, of the log-probs and the mask ``[..., T]``; ``camia_calibrated`` also of
the ids):

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
  ``jax.numpy`` form, which every registered single-pass scorer must have; host NumPy, left as it is).
- ``camia_ll_tail``: the mean log-likelihood without the first predicted token (n < 2: NaN): the repeat pass's
  score on a tokenizer without BOS (below); not a CAMIA signal itself.

Two passes:

- ``camia_repeat`` = LL(x) - LL(x | x): the mean log-likelihood of the text alone minus that of the text read after
  itself (pass ``repeat``: each text is its own prefix, only the second copy scored, ``batching.encode``). Reading a
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
  token diversity counts the input ids (the first token included); here the predicted ones (the target ``ids``).
- Not registered: ``ppl`` and ``calibrated_ppl`` (monotone or near-monotone in the loss ones), ``count_mean`` (a
  count, not a share: it grows with the length), ``find_t`` (filtered out by the authors), the approximate entropy
  (the authors compute it on the six-copy text with m = 8, r = 0.8 std, which this pass does not read) and the
  copy differences of the non-loss features (each would need the repeat pass again: the runner runs one pass per
  (kind, pass method)).
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from mia_jax.scorers.base import register
from mia_jax.scorers.dcpdd import first_occurrence
from mia_jax.scorers.reduce import first_tokens, masked_mean, positions, real

COUNT_CUTOFF = 200  # the authors' count_above reads the first 200 predicted tokens
COUNT_THRESHOLDS = (1, 2, 3)  # loss thresholds in nats (their log-prob thresholds -1, -2, -3)
LOSS_CUTOFFS = (200, 300)  # the authors' cut-off loss
LZ_CUTOFF, LZ_BINS = 200, 3  # the authors' Lempel-Ziv complexity: first 200 tokens, bins 3 (of 3, 4, 5)


# ------------------------------------------------------------------------------------------ registered methods
# Shapes [..., T]; ``mask`` marks the scored tokens. Divisions never see a zero (a row without the tokens a formula
# needs is NaN by a final ``where``), so zero padding gives finite gradients.

@register("camia_slope")
def camia_slope(logprob: ArrayLike, mask: ArrayLike) -> jax.Array:
    """CAMIA slope: least-squares slope of the cumulative mean log-likelihood over positions (NaN below 2 tokens).

    Minus the slope of the prefix-averaged loss: a member's loss falls faster as more of it is read. In closed form,
    with c_j = (1/j) sum_{i<=j} l_i: slope = sum_j (j - (n + 1)/2) c_j / (n (n^2 - 1) / 12).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row with fewer than 2 scored tokens.

    >>> import jax.numpy as jnp
    >>> print(camia_slope(jnp.array([[-3.0, -1.0, -2.0, -2.0]]), jnp.ones((1, 4), bool)))  # c = -3, -2, -2, -2
    [0.3]
    """
    mask = jnp.asarray(mask, bool)
    lp = real(logprob, mask)
    j = positions(mask).astype(lp.dtype)
    n = mask.sum(-1).astype(lp.dtype)
    cumulative = jnp.where(mask, jnp.cumsum(lp, axis=-1) / jnp.maximum(j, 1), 0)
    sxy = (jnp.where(mask, j - (n[..., None] + 1) / 2, 0) * cumulative).sum(-1)
    two = n >= 2
    return jnp.where(two, sxy / jnp.where(two, n * (n * n - 1) / 12, 1), jnp.nan)


def count_below(logprob: ArrayLike, mask: ArrayLike, *, tau: float, cutoff: int = COUNT_CUTOFF) -> jax.Array:
    """Share of the first ``cutoff`` tokens with loss at most ``tau`` (log p >= -tau, as the authors compare).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        tau: the loss threshold in nats.
        cutoff: how many of each row's first scored tokens are read.

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.
    """
    lp = real(logprob, mask)
    return masked_mean((lp >= -tau).astype(lp.dtype), first_tokens(mask, cutoff))


def _count_method(tau: int):
    def fn(logprob: ArrayLike, mask: ArrayLike) -> jax.Array:
        return count_below(logprob, mask, tau=tau)

    fn.__name__ = fn.__qualname__ = f"camia_count_{tau}"
    fn.__doc__ = f"""CAMIA count below: share of the first {COUNT_CUTOFF} tokens with loss at most {tau} \
nat{'s' if tau != 1 else ''} (log p >= -{tau}).

    score = #{{i <= {COUNT_CUTOFF} : l_i >= -{tau}}} / min(n, {COUNT_CUTOFF}) (``count_below``).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> print({fn.__name__}(jnp.array([[-0.5, -1.5, -2.5, -3.5]]), jnp.ones((1, 4), bool)))
    [{tau / 4}]
    """
    return register(fn.__name__)(fn)


camia_count_1, camia_count_2, camia_count_3 = (_count_method(tau) for tau in COUNT_THRESHOLDS)


@register("camia_count_pre")
def camia_count_pre(logprob: ArrayLike, mask: ArrayLike) -> jax.Array:
    """CAMIA count below the prefix mean: share of tokens with log p above the mean of those before (NaN below 2).

    Over the tokens from the 2nd: l_i > c_{i-1}, the token's loss below the cumulative mean loss before it.

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row with fewer than 2 scored tokens.

    >>> import jax.numpy as jnp
    >>> print(camia_count_pre(jnp.array([[-2.0, -1.0, -3.0, -1.0, 0.0]]), jnp.ones((1, 5), bool)))
    [0.75]
    """
    mask = jnp.asarray(mask, bool)
    j = positions(mask)
    lp = real(logprob, mask)
    before = jnp.cumsum(lp, axis=-1) - lp  # the sum of the real values before each position
    later = mask & (j >= 2)
    return masked_mean((lp > before / jnp.where(later, j - 1, 1).astype(lp.dtype)).astype(lp.dtype), later)


def cutoff_loss(logprob: ArrayLike, mask: ArrayLike, *, cutoff: int) -> jax.Array:
    """Mean log-likelihood of each row's first ``cutoff`` scored tokens.

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        cutoff: how many of each row's first scored tokens are read.

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.
    """
    return masked_mean(logprob, first_tokens(mask, cutoff))


def _loss_method(cutoff: int):
    def fn(logprob: ArrayLike, mask: ArrayLike) -> jax.Array:
        return cutoff_loss(logprob, mask, cutoff=cutoff)

    fn.__name__ = fn.__qualname__ = f"camia_loss_{cutoff}"
    fn.__doc__ = f"""CAMIA cut-off loss: mean log-likelihood of the first {cutoff} tokens.

    score = (1/min(n, {cutoff})) sum_{{i <= {cutoff}}} l_i (``cutoff_loss``).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> print({fn.__name__}(jnp.array([[-1.0, -2.0, -6.0]]), jnp.ones((1, 3), bool)))
    [-3.]
    """
    return register(fn.__name__)(fn)


camia_loss_200, camia_loss_300 = (_loss_method(cut) for cut in LOSS_CUTOFFS)


@register("camia_ll_tail")
def camia_ll_tail(logprob: ArrayLike, mask: ArrayLike) -> jax.Array:
    """Mean log-likelihood without the first predicted token (CAMIA's repeat pass without BOS; NaN below 2).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row with fewer than 2 scored tokens.

    >>> import jax.numpy as jnp
    >>> print(camia_ll_tail(jnp.array([[-9.0, -1.0, -2.0], [-1.0, 0.0, 0.0]]), jnp.array([[1, 1, 1], [1, 0, 0]], bool)))
    [-1.5  nan]
    """
    mask = jnp.asarray(mask, bool)
    return masked_mean(logprob, mask & (positions(mask) >= 2))


@register("camia_calibrated")
def camia_calibrated(logprob: ArrayLike, ids: ArrayLike, mask: ArrayLike) -> jax.Array:
    """CAMIA calibrated loss: mean log-likelihood / token diversity (distinct predicted ids / predicted tokens).

    score = ((1/n) sum_i l_i) / (|{x_i}| / n): a low loss on repetitive text is expected and says less.

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        ids: int [..., T] the target token ids (the token each log-prob is of).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob, ids = jnp.array([[-1.0, -2.0, -3.0, -2.0]]), jnp.array([[5, 6, 5, 5]])
    >>> print(camia_calibrated(logprob, ids, jnp.ones((1, 4), bool)))  # -2 / (2 distinct / 4)
    [-4.]
    """
    mean_lp = masked_mean(logprob, mask)
    return mean_lp / masked_mean(first_occurrence(ids, mask).astype(mean_lp.dtype), mask)


# ------------------------------------------------------------------------------------------ not registered: LZ

def lempel_ziv(values: ArrayLike, bins: int = LZ_BINS) -> float:
    """The authors' ``lempel_ziv_complexity`` of one sequence of log-probabilities: each value is placed on 100 levels
    from the sequence's minimum to 0 (``np.digitize(..., right=True)``), the levels cut into ``bins`` equal ranges
    between the lowest and highest level used, and the sequence parsed left to right into sub-words not seen before;
    the number of sub-words / the length. NaN for an empty sequence.

    Not registered: a sequential parse has no ``jax.numpy`` form, which every registered single-pass scorer must
    have. ``lempel_ziv_scores(stats.logprob, mask)`` gives it per row (host, NumPy).

    Args:
        values: float [n] one sequence of log-probabilities (host).
        bins: the ranges the levels are cut into.

    Returns:
        The complexity, sub-words per value; NaN when ``values`` is empty.
    """
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


def lempel_ziv_scores(logprob: ArrayLike, mask: ArrayLike, cutoff: int = LZ_CUTOFF, bins: int = LZ_BINS
                      ) -> np.ndarray:
    """Minus the Lempel-Ziv complexity of each row's first ``cutoff`` log-likelihoods (higher = the more regular
    trajectory, taken to be the member's; the authors pick the sign from the labels; NaN for a row without tokens).

    Args:
        logprob: float [B, T] token log-probabilities (host).
        mask: bool [B, T] the scored tokens.
        cutoff: how many of each row's first scored tokens are read.
        bins: as ``lempel_ziv``.

    Returns:
        float64 ``np.ndarray`` [B], one score per row.
    """
    mask = np.asarray(mask, bool)
    keep = mask & (np.cumsum(mask, axis=-1) <= cutoff)
    return -np.array([lempel_ziv(np.asarray(v, np.float64)[k], bins) for v, k in zip(logprob, keep)], np.float64)
