"""ACMIA (Zade et al. 2025, *Automatic Calibration for Membership Inference Attack on Large Language Models*,
arXiv 2505.03392): token probabilities recalibrated by a temperature over the whole distribution, on the first
occurrence of each token, in three variants (AC, DerivAC, NormAC). One forward pass.

For a predicted token x_i with logits z (over the vocabulary) and a temperature T > 0, p_T = softmax(z / T) is the
model's distribution at temperature T (p_1 = p). ``stats.token_stats(..., temperatures=[T, T r])``, r = 2^0.1,
computes in the same vocabulary scan as the other statistics (``TemperedStats``, nothing of shape [B, T, V]):
log p_T(x_i), mu_T,i = E_{p_T}[log p_T] and sigma_T,i^2 = Var_{p_T}[log p_T]. FOS keeps each distinct token id at
its first occurrence among the scored tokens (``dcpdd.first_occurrence``). Then, with s = +1 for T < 1 and -1 for
T >= 1:

    AC      = (1/|FOS|) sum_{i in FOS} s (log p_T(x_i) - log p(x_i))
    DerivAC = (1/|FOS|) sum_{i in FOS} (log p_T(x_i) - log p_{T r}(x_i))
    NormAC  = (1/|FOS|) sum_{i in FOS} (log p_T(x_i) - mu_T,i) / sigma_T,i

a token of probability 0 (a -inf logit) counting -inf in every variant (the limit of each term), each oriented
higher = more likely a member (the authors evaluate ``roc_curve(labels, scores)`` with 1 = member).
AC compares the model with itself sharpened (T < 1) or flattened (T >= 1), always sharper minus flatter: it equals
|1/T - 1| (log p(x_i) + H_{1/T}(p)) per token, H_a the Renyi entropy of order a: the log-likelihood calibrated by
the distribution's spread, which tends to the Min-K%++ numerator log p - mu as T -> 1 (where AC itself is 0).
DerivAC is the change of log p_T(x_i) over one step of the authors' temperature grid (a finite difference, not
divided by the step: a constant factor that changes no ranking). NormAC is Min-K%++'s z-score of the distribution at
temperature T, averaged over FOS (no k).

Where this follows the authors' code (github.com/Salehzz/ACMIA, ``src/com_pro_dis.py`` ``inference`` and
``src/Main_file.py``, the ``Ref_Temp`` / ``Temp_diff`` / ``Normal_Temp`` scores): their temperature multiplies the
log-probabilities, ``log_softmax(beta * log p)``, which is softmax(z / T) with T = 1 / beta (log_softmax drops the
constant); their grid is beta = 2^(0.1 j), j = -25..25, so T r is the grid point next to T on the flatter side; the
sign flip of AC at beta <= 1; FOS from ``np.unique(input_ids, return_index=True)`` over the predicted tokens; the
plain mean. Where it differs: (1) one temperature per run (``--acmia-temperature``, default ``DEFAULT_TEMPERATURE``),
not the best of the 51 grid points by AUROC on the evaluated texts' own labels (their ``Main_file`` keeps, per
variant, the grid point with the best AUROC: an oracle this project does not run; sweep the option instead);
(2) DerivAC at their first grid point steps to beta = 0 (the uniform distribution), here always to T r; (3) NormAC's
sigma is the kernel's, floored at sqrt(``stats.VAR_FLOOR``) = 1e-6, where theirs adds 1e-10 and turns a NaN ratio
into 0 (here a NaN logit makes the text NaN, as for every method); (4) they cut texts to ``--max_char`` words and
1024 tokens (here: the data as given, cut to the model's context). The paper's text could not be read where this
was written (only its abstract); the formulas are the authors' code's.

Parity: checked once against the authors' code itself, ``tok_pro_dis`` / ``inference`` and ``Main_file``'s scoring
loop (run with ``--max_char 100000``: its default 1e5 is a float that breaks the slicing) on a tiny random
transformers Llama (torch 2.13 CPU, float32), six token sequences, every grid temperature, against
``scores_from_logits`` on the same logits: at most 2.5e-6 apart absolutely for all three variants, 1.7e-5 relatively
for T in [0.5, 2]; at the grid's ends DerivAC and NormAC are near-cancelling float32 differences (1e-4 or less) that
both codes compute to about 1e-3 relative of a float64 evaluation. It is not a test: their modules cannot be imported
(module-level imports of openai, tensor_parallel, datasets, pandas and jieba; the scoring script runs at import and
raises in its metrics step, which unpacks 10 values from a function returning 8) and their code is not vendored here;
``tests/test_acmia.py`` holds the float64 reference written from the formulas above (``tests/reference.py``).

The temperature is the resource ``acmia_temperature`` (``RESOURCES``): a caller gives T (default
``DEFAULT_TEMPERATURE``), ``scorers.resource_arrays`` turns it into the kernel's temperatures [T, T r], which the
scoring step passes to ``stats`` and the formulas read as ``temperatures``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from mia_jax.errors import UserError
from mia_jax.scorers.base import RESOURCES, Resource, register
from mia_jax.scorers.dcpdd import first_occurrence
from mia_jax.scorers.reduce import floating, masked_mean, real

STEP = 2.0 ** 0.1  # the authors' temperature grid: beta = 2^(0.1 j); DerivAC steps from T to T * STEP
# not the paper's: the authors keep the best of 51 temperatures on the evaluated labels; an untuned octave above 1
DEFAULT_TEMPERATURE = 2.0
RESOURCE = "acmia_temperature"


def _at(x, temperatures, index: int):
    """Column ``index`` of tempered statistics ``[..., T, K]`` (``temperatures`` ``[K]`` must have it: UserError)."""
    if jnp.shape(temperatures)[-1] <= index:
        raise UserError(f"ACMIA reads {index + 1} temperatures [T, T * 2^0.1], got {jnp.shape(temperatures)[-1]}: "
                        f"make them with scorers.resource_arrays(methods, {{{RESOURCE!r}: T}})")
    return floating(x)[..., index]


def _impossible(logprob_t, term):
    """``term``, but -inf where the token has probability 0 (a -inf logit: log p = log p_T = -inf at every T, where
    the difference would be NaN; its limit is -inf for AC and DerivAC at any T, the least member-like token)."""
    return jnp.where(logprob_t == -jnp.inf, -jnp.inf, term)


@register("acmia_ac", resources={RESOURCE: "temperatures"})
def acmia_ac(logprob: ArrayLike, logprob_t: ArrayLike, ids: ArrayLike, mask: ArrayLike, *, temperatures: ArrayLike
             ) -> jax.Array:
    """ACMIA AC: mean over first-occurring tokens of log p sharpened minus log p flattened by --acmia-temperature
    (T < 1: log p_T - log p; T >= 1: log p - log p_T).

    score = (1/|FOS|) sum_{i in FOS} s (log p_T(x_i) - log p(x_i)), s = +1 if T < 1 else -1, T = ``temperatures[0]``
    (module docstring).

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        logprob_t: float [..., T, K] log p_T(x_i) at each temperature (``TemperedStats.logprob_t``).
        ids: int [..., T] the target token ids (the token each log-prob is of).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        temperatures: float [K] the kernel's temperatures [T, T r] (``resource_arrays``' ``acmia_temperature``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob, logprob_t = jnp.array([[-1.0, -2.0, -1.0]]), jnp.array([[[-1.5], [-2.0], [-9.0]]])
    >>> ids, mask = jnp.array([[4, 5, 4]]), jnp.ones((1, 3), bool)  # the second 4 is not a first occurrence
    >>> print(acmia_ac(logprob, logprob_t, ids, mask, temperatures=jnp.array([2.0])))  # (0.5 + 0) / 2
    [0.25]
    """
    t = _at(temperatures, temperatures, 0)
    keep = first_occurrence(ids, mask)
    sign = jnp.where(t < 1, 1.0, -1.0)[..., None]
    at_t = real(_at(logprob_t, temperatures, 0), keep)
    return masked_mean(_impossible(at_t, sign * (at_t - real(logprob, keep))), keep)


@register("acmia_derivac", resources={RESOURCE: "temperatures"})
def acmia_derivac(logprob_t: ArrayLike, ids: ArrayLike, mask: ArrayLike, *, temperatures: ArrayLike) -> jax.Array:
    """ACMIA DerivAC: mean over first-occurring tokens of log p at --acmia-temperature T minus log p at T * 2^0.1.

    score = (1/|FOS|) sum_{i in FOS} (log p_T(x_i) - log p_{T r}(x_i)), ``temperatures`` = [T, T r], r = 2^0.1
    (module docstring).

    Args:
        logprob_t: float [..., T, K] log p_T(x_i) at each temperature (``TemperedStats.logprob_t``).
        ids: int [..., T] the target token ids (the token each log-prob is of).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        temperatures: float [K] the kernel's temperatures [T, T r] (``resource_arrays``' ``acmia_temperature``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob_t = jnp.array([[[-1.0, -1.5], [-3.0, -2.0], [-1.0, -1.5]]])
    >>> ids, mask = jnp.array([[4, 5, 6]]), jnp.array([[1, 1, 0]], bool)
    >>> print(acmia_derivac(logprob_t, ids, mask, temperatures=jnp.array([2.0, 2.0 * 2 ** 0.1])))  # (0.5 - 1) / 2
    [-0.25]
    """
    keep = first_occurrence(ids, mask)
    at_t = real(_at(logprob_t, temperatures, 0), keep)
    return masked_mean(_impossible(at_t, at_t - real(_at(logprob_t, temperatures, 1), keep)), keep)


@register("acmia_normac", resources={RESOURCE: "temperatures"})
def acmia_normac(logprob_t: ArrayLike, mu_t: ArrayLike, var_t: ArrayLike, ids: ArrayLike, mask: ArrayLike, *,
                 temperatures: ArrayLike) -> jax.Array:
    """ACMIA NormAC: mean over first-occurring tokens of (log p_T - mu_T) / sigma_T of the distribution at
    --acmia-temperature T.

    score = (1/|FOS|) sum_{i in FOS} (log p_T(x_i) - mu_T,i) / sigma_T,i, mu_T and sigma_T^2 the mean and variance of
    log p_T under p_T (``TemperedStats.mu_t``, ``var_t``; module docstring).

    Args:
        logprob_t: float [..., T, K] log p_T(x_i) at each temperature (``TemperedStats.logprob_t``).
        mu_t: float [..., T, K] E_{p_T}[log p_T] (``TemperedStats.mu_t``).
        var_t: float [..., T, K] Var_{p_T}[log p_T] (``TemperedStats.var_t``).
        ids: int [..., T] the target token ids (the token each log-prob is of).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        temperatures: float [K] the kernel's temperatures [T, T r] (``resource_arrays``' ``acmia_temperature``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without scored tokens.

    >>> import jax.numpy as jnp
    >>> logprob_t, mu_t = jnp.array([[[-1.0], [-3.0]]]), jnp.array([[[-2.0], [-2.0]]])
    >>> var_t, ids, mask = jnp.array([[[4.0], [1.0]]]), jnp.array([[4, 5]]), jnp.ones((1, 2), bool)
    >>> print(acmia_normac(logprob_t, mu_t, var_t, ids, mask, temperatures=jnp.array([0.5])))  # (0.5 - 1) / 2
    [-0.25]
    """
    keep = first_occurrence(ids, mask)
    z = real(_at(logprob_t, temperatures, 0), keep) - real(_at(mu_t, temperatures, 0), keep)
    return masked_mean(z / jnp.sqrt(real(_at(var_t, temperatures, 0), keep, 1.0)), keep)


def temperatures(value: ArrayLike) -> np.ndarray:
    """The kernel's temperatures float32 [T, T * 2^0.1] of one temperature T (a positive finite number; else
    UserError).

    Args:
        value: one temperature T: a number, or an array of one element.

    Returns:
        float32 ``np.ndarray`` [2]: [T, T * 2^0.1].
    """
    try:
        t = np.asarray(value, np.float64)
    except (TypeError, ValueError):
        t = np.asarray(math.nan)
    if isinstance(value, (str, bytes)) or t.size != 1 or not np.isfinite(t).all() or not (t > 0).all():
        raise UserError(f"{RESOURCE} must be one positive, finite temperature (e.g. 2.0), got {value!r}")
    t = float(t.reshape(()))
    return np.array([t, t * STEP], np.float32)


RESOURCES[RESOURCE] = Resource(
    RESOURCE, f"give one positive temperature T with --acmia-temperature T (default {DEFAULT_TEMPERATURE:g})",
    temperatures, default=DEFAULT_TEMPERATURE)
