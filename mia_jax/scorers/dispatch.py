"""Scores by method name: ``device_scores`` (any registered single-pass formula, inside a caller's ``jax.jit``,
``jax.vmap``, ``jax.grad``), ``scores_from_logits`` (the shift, the mask and the statistics too), ``score_batch``
(the host path: one cached ``jax.jit`` per method tuple, float64 NumPy out) and ``resource_arrays`` (what a caller
holds -> the arrays the formulas read).

Which methods need what: ``requirements(methods)`` (and ``REGISTRY[name].needs_ids`` / ``.needs_text`` /
``.resources``): the target ``ids``, each text's ``zlib_bytes`` (``scorers.zlib_bytes(text)``), resources by name
(``freq_table`` for ``dc_pdd``; a resource with a default, e.g. ACMIA's ``acmia_temperature``, may be left out), the
``tempered`` statistics at the temperatures of the resource ``temperature_resource(methods)`` (ACMIA's methods:
``stats.token_stats(..., temperatures=resource_arrays(methods, resources)[that resource])``). A missing one, a
multi-pass or unknown method, or mismatched shapes: UserError.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from mia_jax import checks
from mia_jax.errors import UserError
from mia_jax.scorers.base import (RESOURCES, Scorer, TokenBatch, check_resources, requirements, single_pass,
                                  temperature_resource)
from mia_jax.scorers.likelihood import zlib_bytes as text_zlib_bytes
from mia_jax.stats import DEFAULT_CHUNK, TemperedStats, TokenStats, token_stats

# scores_from_logits' default: the default methods that need nothing but the logits
LOGIT_METHODS = ("loss", "ppl", "min_k@0.2", "min_k_pp@0.2", "max_k@0.2", "entropy", "rank")


def resource_arrays(methods: Sequence[str], resources: Mapping[str, Any] | None, *,
                    per_token: bool = True) -> dict[str, np.ndarray]:
    """{resource name: array} for the resources ``methods`` read (``Scorer.resources``), from what a caller holds:
    for ``freq_table`` a ``mia_jax.methods.freq.FreqTable`` or a 1-D array of probabilities in (0, 1] -> float32
    ``[V]``. Validated on the host (UserError: a missing or malformed resource); pass the result as ``device_scores(...,
    resources=)``, e.g. into one's own jitted step.

    Args:
        methods: single-pass method names.
        resources: {resource name: what the caller holds}; a resource left out takes its default (none: UserError).
        per_token: with False the per-token resources (``Resource.per_token``, made per text by
            ``token_resources``) are left out.

    Returns:
        {resource name: host ``np.ndarray``}, e.g. ``freq_table`` float32 [V], ``acmia_temperature`` float32 [2],
        ``tag_tab_keywords`` bool of the statistics' shape; resources no method reads are left out.
    """
    check_resources(methods, resources)
    return {r: RESOURCES[r].to_array(_given(resources, r)) for r in requirements(methods).resources
            if per_token or RESOURCES[r].per_token is None}


def token_resources(methods: Sequence[str], resources: Mapping[str, Any] | None, tokenizer,
                    texts: Mapping[int, str], *, alone: bool = True) -> dict[str, dict[int, np.ndarray]]:
    """{resource: {key: array over the text's tokens}} for ``texts`` ({key: text}) of the per-token resources
    ``methods`` read (``Resource.per_token``, from the caller's value or the default, e.g. Tag&Tab's K). They are
    made for each text read alone: a pass that reads texts after a prefix or by windows (``alone=False``) is
    refused (UserError).

    Args:
        methods: single-pass method names.
        resources: {resource name: what the caller holds} (or None: the defaults).
        tokenizer: the model's ``tokenizers.Tokenizer``.
        texts: {key: text}.
        alone: whether the pass reads each text alone.

    Returns:
        {resource: {key: host ``np.ndarray`` [n] over the text's n tokens}}; empty when no method reads one.
    """
    names = [r for r in requirements(methods).resources if RESOURCES[r].per_token is not None]
    if names and not alone:
        raise UserError(f"{', '.join(names)}: made per token of a text read alone; not after a prefix or by windows")
    keys = list(texts)
    return {r: dict(zip(keys, RESOURCES[r].per_token(_given(resources, r), tokenizer, [texts[i] for i in keys])))
            for r in names}


def pack_token_resources(per_text: Mapping[str, Mapping[int, np.ndarray]], contents, shape: tuple[int, int]
                         ) -> dict[str, np.ndarray]:
    """{resource: [rows, length]} beside a packed step's targets: item ``i`` of row r at slot ``start`` (``contents``:
    per row its (item, start, slots)) gets ``per_text[name][i][1: 1 + slots]``, slot j holding the value of the token
    it predicts (zero past a text and in padding).

    Args:
        per_text: ``token_resources``' output.
        contents: per packed row, its (item, start, slots).
        shape: (rows, length) of the step's targets.

    Returns:
        {resource: bool ``np.ndarray`` [rows, length]}.
    """
    out = {}
    for name, arrays in per_text.items():
        packed = np.zeros(shape, bool)
        for r, row in enumerate(contents):
            for item, start, n in row:
                values = np.asarray(arrays[item])[1: 1 + n]
                packed[r, start: start + len(values)] = values
        out[name] = packed
    return out


def _given(resources: Mapping[str, Any] | None, r: str):
    """The caller's value of resource ``r``, else its default (None when it has none)."""
    value = (resources or {}).get(r)
    return RESOURCES[r].default if value is None and r in RESOURCES else value


def check_ids(methods: Sequence[str], ids: ArrayLike | None, mask: ArrayLike | None, arrays: Mapping[str, Any]) -> None:
    """Host check of the target ids against the resource arrays that ``methods`` index by them (``dc_pdd``: an id
    outside the frequency table is a UserError; ``Resource.check_ids``). ``device_scores`` runs it itself outside a
    trace; a caller that jits its own step runs it on the host ids before (under a trace such a row is NaN).

    Args:
        methods: single-pass method names.
        ids: int [..., T] the target ids (traced or None: nothing is checked).
        mask: bool [..., T] the scored tokens (traced or None: nothing is checked).
        arrays: {resource name: array} (``resource_arrays``).
    """
    ids, mask = checks.concrete(ids), checks.concrete(mask)
    if ids is None or mask is None:
        return
    for method in methods:
        scorer, _ = single_pass(method)
        for r in scorer.resources if scorer.needs_ids else ():
            table = checks.concrete(arrays[r])
            if RESOURCES[r].check_ids is not None and table is not None:
                RESOURCES[r].check_ids(ids, mask, table)


def _arrays(methods, resources) -> dict:
    """{resource: array} of what ``methods`` read: an array as given (e.g. traced), anything else converted on the
    host (``Resource.to_array``), a missing one its default (none: UserError saying how to make it)."""
    arrays = {}
    for r in requirements(methods).resources:
        value = _given(resources, r)
        if value is None:
            check_resources(methods, resources)  # says how to make it
        # a host array of a per-token resource is still checked and cast (``to_array``), once
        as_given = isinstance(value, jax.Array) or (isinstance(value, np.ndarray) and RESOURCES[r].per_token is None)
        arrays[r] = value if as_given else RESOURCES[r].to_array(value)
    return arrays


def _check_tempered(parsed, tempered, shape, arrays, temperatures: str | None) -> None:
    """The ``tempered`` statistics: given when a method reads them, ``[*shape, K]`` floats, K the temperatures'."""
    if temperatures is None:
        return
    if tempered is None:
        names = [m for m, s, _ in parsed if s.temperature_resource]
        raise UserError(f"{', '.join(names)} need tempered=: the statistics at the temperatures of "
                        f"{temperatures!r}, stats.token_stats(..., temperatures=resource_arrays(methods, "
                        f"resources)[{temperatures!r}]) returns them with the TokenStats")
    k = jnp.shape(arrays[temperatures])[-1:]
    for name, x in TemperedStats(*tempered)._asdict().items():
        checks.shape(f"tempered.{name}", x, (*shape, *k))
        checks.floating(f"tempered.{name}", x)


def _prepare(stats, mask, methods, ids, zlib_bytes, resources, tempered=None):
    """The parsed methods and the resource arrays, every argument checked (UserError)."""
    need = requirements(methods)
    parsed = [(m, *single_pass(m)) for m in methods]
    shape = tuple(jnp.shape(stats.logprob))
    for name, x in stats._asdict().items():
        checks.shape(f"stats.{name}", x, shape)
        (checks.numeric if name == "rank" else checks.floating)(f"stats.{name}", x)
    checks.shape("mask", mask, shape)
    checks.integer("mask", mask, bool_ok=True)
    if need.ids:
        if ids is None:
            names = [m for m, s, _ in parsed if s.needs_ids]
            raise UserError(f"{', '.join(names)} need ids=: the target token ids, int {list(shape)} (the token each "
                            "log-prob is of)")
        checks.shape("ids", ids, shape)
        checks.integer("ids", ids)
    if need.zlib_bytes:
        if zlib_bytes is None:
            raise UserError("'zlib' needs zlib_bytes=: each text's zlib-compressed length in bytes, float "
                            f"{list(shape[:-1])} (mia_jax.scorers.zlib_bytes(text))")
        checks.shape("zlib_bytes", zlib_bytes, shape[:-1])
    arrays = _arrays(methods, resources)
    for r in need.resources:
        if RESOURCES[r].per_token is not None:
            checks.shape(r, arrays[r], shape)
    if need.ids and need.resources:
        check_ids(methods, ids, mask, arrays)
    _check_tempered(parsed, tempered, shape, arrays, temperature_resource(methods))
    return parsed, arrays


def _call(scorer: Scorer, k, inputs: dict, zlib_bytes, arrays: dict):
    kwargs = {kw: arrays[r] for r, kw in zip(scorer.resources, scorer.resource_keywords)}
    if scorer.takes_k:
        kwargs["k"] = k
    if scorer.needs_text:
        kwargs["zlib_bytes"] = zlib_bytes
    return scorer.fn(*(inputs[a] for a in scorer.arrays), **kwargs)


def device_scores(stats: TokenStats, mask: ArrayLike, methods: Sequence[str], *, ids: ArrayLike | None = None,
                  zlib_bytes: ArrayLike | None = None, resources: Mapping[str, Any] | None = None,
                  tempered: TemperedStats | None = None) -> dict[str, jax.Array]:
    """{method: float32 [...]} for single-pass ``methods`` (registry names, ``min_k@0.2``; a tuple or a list) from
    ``TokenStats`` and a bool ``mask`` of the scored tokens; NaN for a row without one.

    Pure ``jax.numpy``: call it inside ``jax.jit`` (methods are Python constants there), ``jax.vmap``,
    ``jax.grad``, on sharded arrays. Outside a trace, ``dc_pdd``'s ids are checked against the table (UserError);
    under one an id outside it gives the row NaN.

    Args:
        stats: ``TokenStats`` of ``[..., T]`` arrays (float; ``rank`` int): ``stats.token_stats`` of the shifted
            logits.
        mask: bool (or int) [..., T] the scored tokens.
        methods: single-pass method names, a tuple or a list (static under ``jax.jit``).
        ids: int [..., T] the target ids (``dc_pdd``, ``camia_calibrated``).
        zlib_bytes: int or float [...] each text's compressed length (``zlib``).
        resources: {name: array} (``resource_arrays``; a ``FreqTable`` is also taken, converted on the host).
        tempered: the ``TemperedStats`` ``[..., T, K]`` of the ACMIA methods (the module docstring says how to make
            them).

    Returns:
        {method: float [...]} one score per row: float32 for float32 or bfloat16 statistics; float64 stays float64
        under ``jax_enable_x64``.

    >>> import jax.numpy as jnp
    >>> from mia_jax.stats import token_stats
    >>> logits = jnp.array([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 1.0, 1.0]]])
    >>> stats = token_stats(logits, jnp.array([[0, 1, 2]]))
    >>> out = device_scores(stats, jnp.array([[True, True, False]]), ["loss", "min_k@0.5"])
    >>> {m: round(float(v[0]), 4) for m, v in out.items()}
    {'loss': -0.1672, 'min_k@0.5': -0.2395}
    """
    stats = TokenStats(*stats)
    parsed, arrays = _prepare(stats, mask, methods, ids, zlib_bytes, resources, tempered)
    mask = jnp.asarray(mask, bool)
    inputs = {**stats._asdict(), **(TemperedStats(*tempered)._asdict() if tempered is not None else {}),
              "mask": mask, "ids": ids}
    # a NaN statistic of a scored token (a NaN logit: stats.token_stats) makes the text's every score NaN, whatever
    # the formula does with it (a sort would move it past the k lowest, a max would skip it)
    broken = jnp.any(mask & jnp.isnan(stats.logprob), axis=-1)
    return {m: jnp.where(broken, jnp.nan, _call(scorer, k, inputs, zlib_bytes, arrays)) for m, scorer, k in parsed}


def scores_from_logits(logits: ArrayLike, ids: ArrayLike, attention_mask: ArrayLike, *,
                       methods: Sequence[str] = LOGIT_METHODS, vocab_size: int | None = None,
                       chunk_size: int = DEFAULT_CHUNK, zlib_bytes: ArrayLike | None = None,
                       resources: Mapping[str, Any] | None = None) -> dict[str, jax.Array]:
    """{method: float32 [B]} from a causal LM's ``logits`` ``[B, T, V]`` over token ``ids`` ``[B, T]``.

    ``logits[:, t]`` predicts ``ids[:, t + 1]``; a target counts when it and its predecessor are real tokens, so
    right- and left-padded batches both work and a text's first token (no prediction) is not scored. Then
    ``stats.token_stats`` (float32, in vocabulary chunks) and ``device_scores`` (the targets as ``ids``).
    jit-friendly: inside one's own ``jax.jit`` as is, or ``jax.jit(scores_from_logits, static_argnames=("methods",
    "vocab_size", "chunk_size"))`` with a tuple of methods.

    Args:
        logits: float (any float dtype) [B, T, V] the model's logits.
        ids: int [B, T] the token ids (checked against the vocabulary where concrete).
        attention_mask: int or bool [B, T], 1 = real token.
        methods: single-pass method names (default ``LOGIT_METHODS``, which need nothing but the logits).
        vocab_size: the real vocabulary size: rows at or beyond it are padding.
        chunk_size: the vocabulary chunk of ``stats.token_stats``.
        zlib_bytes: int or float [B] each text's compressed length (``zlib``).
        resources: as ``device_scores``'.

    Returns:
        {method: float32 [B]} one score per text; NaN for a text without a scored token.

    >>> import jax.numpy as jnp
    >>> logits = jnp.zeros((2, 4, 8))  # uniform: log p = -log 8 for every token
    >>> ids, am = jnp.array([[1, 2, 3, 0], [0, 5, 6, 7]]), jnp.array([[1, 1, 1, 0], [0, 1, 1, 1]])
    >>> [round(float(v), 4) for v in scores_from_logits(logits, ids, am, methods=["loss"])["loss"]]  # right, left
    [-2.0794, -2.0794]
    """
    requirements(methods)  # a bad method before any work
    checks.floating("logits", logits)
    checks.shape("ids", ids, tuple(jnp.shape(logits)[:-1]))
    checks.shape("attention_mask", attention_mask, tuple(jnp.shape(logits)[:-1]))
    checks.integer("attention_mask", attention_mask, bool_ok=True)
    checks.token_ids("ids", ids, vocab_size or jnp.shape(logits)[-1], where=attention_mask)
    logits, ids, am = jnp.asarray(logits), jnp.asarray(ids), jnp.asarray(attention_mask).astype(bool)
    targets = ids[..., 1:]
    arrays = _arrays(methods, resources)
    temperatures = temperature_resource(methods)
    stats = token_stats(logits[..., :-1, :], targets, vocab_size=vocab_size, chunk_size=chunk_size,
                        temperatures=None if temperatures is None else arrays[temperatures])
    stats, tempered = stats if temperatures is not None else (stats, None)
    return device_scores(stats, am[..., 1:] & am[..., :-1], methods, ids=targets, zlib_bytes=zlib_bytes,
                         resources={**(resources or {}), **arrays}, tempered=tempered)


@lru_cache(maxsize=64)
def _jitted(methods: tuple[str, ...]):
    return jax.jit(lambda stats, mask, ids, zb, res, tempered: device_scores(
        stats, mask, methods, ids=ids, zlib_bytes=zb, resources=res, tempered=tempered))


def _pad_rows(x, rows: int, fill=0):
    """``x`` with rows of ``fill`` appended up to ``rows`` (None stays None)."""
    if x is None:
        return None
    x = np.asarray(x)
    return np.concatenate([x, np.full((rows - len(x), *x.shape[1:]), fill, x.dtype)]) if rows > len(x) else x


def score_batch(batch: TokenBatch, methods: Sequence[str]) -> dict[str, np.ndarray]:
    """All requested methods for one host batch: {method: float64 [B]} (NaN for rows without tokens), from
    ``device_scores`` jitted once per method tuple (float32; the rows padded to a power of two, so batches of
    varying size compile a few programs).

    Args:
        batch: the host ``TokenBatch`` (statistics [B, T]). ``zlib`` reads ``batch.texts``, ``dc_pdd`` and
            ``camia_calibrated`` ``batch.ids``, ``dc_pdd`` ``batch.resources["freq_table"]`` (ids checked against
            it), the ACMIA methods ``batch.tempered``.
        methods: single-pass method names.

    Returns:
        {method: float64 ``np.ndarray`` [B]} (computed in float32).
    """
    methods = tuple(methods)
    need = requirements(methods)
    if need.zlib_bytes and batch.texts is None:
        raise UserError("'zlib' needs the texts (TokenBatch.texts)")
    zb = np.array([text_zlib_bytes(t) for t in batch.texts], np.float32) if need.zlib_bytes else None
    if need.ids and batch.ids is None:
        raise UserError(f"{', '.join(m for m in methods if single_pass(m)[0].needs_ids)} need the token ids "
                        "(TokenBatch.ids)")
    ids = batch.ids if need.ids else None
    arrays = resource_arrays(methods, batch.resources)
    if need.ids and need.resources:
        check_ids(methods, ids, batch.mask, arrays)
    n = len(batch.mask)
    rows = 1 << max(n - 1, 0).bit_length()
    stats = TokenStats(*(_pad_rows(x, rows) for x in batch.stats))
    tempered = None
    if temperature_resource(methods) is not None:
        if batch.tempered is None:
            raise UserError(f"{', '.join(m for m in methods if single_pass(m)[0].temperature_resource)} need the "
                            "tempered statistics (TokenBatch.tempered: stats.token_stats(..., temperatures=))")
        tempered = TemperedStats(*(_pad_rows(x, rows) for x in batch.tempered))
    arrays = {r: _pad_rows(a, rows) if RESOURCES[r].per_token is not None else a for r, a in arrays.items()}
    out = _jitted(methods)(stats, _pad_rows(batch.mask, rows, False), _pad_rows(ids, rows), _pad_rows(zb, rows, 1),
                           arrays, tempered)
    return {m: np.asarray(v, np.float64)[:n] for m, v in out.items()}
