"""The library's argument checks, in the style of optax's ``check_subdtype``: every public array function of the
kernel (``stats``) and the scorers (``scorers``) checks what it is given here, and a bad argument is one
``UserError`` (one line: which argument, what it is, what it must be).

What is checked where:

- dtypes and shapes always (they are static, so the checks cost nothing and also run under ``jax.jit``);
- a fraction ``k`` always (a Python number: ``0 < k <= 1``);
- the values of token ids (``0 <= id < vocabulary``) only where they are concrete (NumPy, or a ``jax.Array``
  outside a trace); inside a caller's ``jax.jit`` they cannot be read, and an id out of range is then the
  caller's to avoid (``jnp.take`` clamps it: the statistics of some other token).
"""
from __future__ import annotations

import math
from numbers import Real

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from mia_jax.errors import UserError


def _dtype(x):
    return getattr(x, "dtype", None) or np.asarray(x).dtype


def floating(name: str, x: ArrayLike) -> None:
    """``x`` must hold floats (float16/bfloat16/float32/float64); integer or bool logits are refused (UserError).

    Args:
        name: the argument's name, for the message.
        x: any shape; only its dtype is read.
    """
    dtype = _dtype(x)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise UserError(f"{name} must be a floating-point array (e.g. float32 or bfloat16), got dtype {dtype}")


def integer(name: str, x: ArrayLike, *, bool_ok: bool = False) -> None:
    """``x`` must hold integers (and bools too with ``bool_ok``: a mask); floats are refused (UserError).

    Args:
        name: the argument's name, for the message.
        x: any shape; only its dtype is read.
        bool_ok: whether bools pass too.
    """
    dtype = _dtype(x)
    ok = jnp.issubdtype(dtype, jnp.integer) or (bool_ok and jnp.issubdtype(dtype, jnp.bool_))
    if not ok:
        kind = "integer or bool" if bool_ok else "integer"
        raise UserError(f"{name} must be an {kind} array, got dtype {dtype}")


def numeric(name: str, x: ArrayLike) -> None:
    """``x`` must hold numbers, integer or floating (a count such as a rank); bool and others are refused.

    Args:
        name: the argument's name, for the message.
        x: any shape; only its dtype is read.
    """
    dtype = _dtype(x)
    if not (jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)):
        raise UserError(f"{name} must be a numeric (integer or floating-point) array, got dtype {dtype}")


def shape(name: str, x: ArrayLike, want: tuple) -> None:
    """``x``'s shape must be ``want`` (UserError naming both).

    Args:
        name: the argument's name, for the message.
        x: any dtype; only its shape is read.
        want: the expected shape.
    """
    got = tuple(jnp.shape(x))
    if got != tuple(want):
        raise UserError(f"{name} has shape {got}, expected {tuple(want)}")


def concrete(x: ArrayLike) -> np.ndarray | None:
    """``x`` as a host array, or None under a trace (a value not known yet) or spread over several processes.

    Args:
        x: any array or value.

    Returns:
        ``np.ndarray`` of ``x``'s shape and dtype, or None.
    """
    if isinstance(x, jax.core.Tracer) or (isinstance(x, jax.Array) and not x.is_fully_addressable):
        return None
    return np.asarray(x)


def token_ids(name: str, ids: ArrayLike, vocab: int, where: ArrayLike | None = None) -> None:
    """Integer ``ids`` in ``[0, vocab)`` (only at ``where``, a bool array, when given). The values are checked only
    when concrete (see the module docstring); a negative id would otherwise wrap around to the vocabulary's end.

    Args:
        name: the argument's name, for the message.
        ids: int, any shape: token ids.
        vocab: the vocabulary size.
        where: bool broadcastable to ``ids``: the ids checked (None: all).
    """
    integer(name, ids)
    host = concrete(ids)
    if host is None or host.size == 0:
        return
    if where is not None:
        mask = concrete(where)
        if mask is None:
            return
        host = host[np.broadcast_to(np.asarray(mask, bool), host.shape)]
        if host.size == 0:
            return
    lo, hi = int(host.min()), int(host.max())
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise UserError(f"{name} holds token id {bad}, outside the vocabulary [0, {vocab})")


def fraction(k, what: str = "k") -> float:
    """A fraction ``0 < k <= 1`` (a Python or NumPy real, not a bool) as a float; anything else is a UserError.

    Args:
        k: the fraction given.
        what: what it is, for the message.

    Returns:
        ``k`` as a float.
    """
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, Real) or not math.isfinite(float(k)):
        raise UserError(f"{what} must be a fraction in (0, 1], got {k!r}")
    if not 0.0 < float(k) <= 1.0:
        raise UserError(f"{what} must be a fraction in (0, 1], got {k}")
    return float(k)
