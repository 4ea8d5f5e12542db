"""The masked per-row reductions the scorer formulas are written with, in ``jax.numpy`` (shapes ``[..., T]``).

``mask`` marks each row's scored tokens. What lies outside it may hold anything (zeros, NaN, inf): it is replaced
before any arithmetic, so neither the scores nor the gradients of the real tokens see it. Floats are at least
float32 (bfloat16 statistics are reduced in float32; float64 under ``jax_enable_x64`` stays float64).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


def floating(x: ArrayLike) -> jax.Array:
    """``x`` as a float array of at least float32 (bool and integer arrays become float32).

    Args:
        x: any dtype, any shape.

    Returns:
        float (float32, or float64 for float64 ``x``) of ``x``'s shape.
    """
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def real(x: ArrayLike, mask: ArrayLike, pad: float = 0.0) -> jax.Array:
    """``x`` as floats where ``mask``, ``pad`` elsewhere (e.g. 1 for a variance or a rank that is divided by or
    whose log is taken).

    Args:
        x: any dtype [..., T] per-token values (anything, NaN or inf included, outside ``mask``).
        mask: bool [..., T] (or broadcastable to ``x``) the real tokens.
        pad: the value put outside ``mask``.

    Returns:
        float (at least float32) [..., T].
    """
    return jnp.where(jnp.asarray(mask, bool), floating(x), pad)


def masked_mean(values: ArrayLike, mask: ArrayLike) -> jax.Array:
    """Mean of each row's ``values`` where ``mask`` (NaN for a row where none is); bool values give the share.

    Args:
        values: float, int or bool [..., T] per-token values.
        mask: bool [..., T] the tokens averaged.

    Returns:
        float (at least float32) [...] each row's mean; NaN for a row without a token in ``mask``.

    >>> import jax.numpy as jnp
    >>> print(masked_mean(jnp.array([[1.0, 2.0, 9.0], [4.0, 0.0, 0.0]]), jnp.array([[1, 1, 0], [0, 0, 0]], bool)))
    [1.5 nan]
    """
    mask = jnp.asarray(mask, bool)
    total = real(values, mask).sum(-1)
    n = mask.sum(-1)
    return jnp.where(n > 0, total / jnp.maximum(n, 1).astype(total.dtype), jnp.nan)


def positions(mask: ArrayLike) -> jax.Array:
    """j = 1, 2, ... at each row's ``mask`` positions in order, 0 elsewhere (a prefix's context and the padding are
    not positions of the text).

    Args:
        mask: bool [..., T] the scored tokens.

    Returns:
        int [..., T] each scored token's 1-based position among its row's scored tokens; 0 outside ``mask``.
    """
    mask = jnp.asarray(mask, bool)
    return jnp.where(mask, jnp.cumsum(mask, axis=-1), 0)


def first_tokens(mask: ArrayLike, limit: int) -> jax.Array:
    """The mask of each row's first ``limit`` real positions.

    Args:
        mask: bool [..., T] the scored tokens.
        limit: how many of each row's first scored tokens to keep.

    Returns:
        bool [..., T] ``mask`` cut to each row's first ``limit`` scored tokens.
    """
    mask = jnp.asarray(mask, bool)
    return mask & (positions(mask) <= limit)
