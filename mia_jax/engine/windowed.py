"""Online detection (Min-K%++ section 4.4): every ``window``-token chunk of a long text scored from the **same**
forward pass.

A causal LM's statistics at position t are already conditioned on the text's true prefix, so the score of a window
is the method applied to the window's own tokens of the one pass over the whole text: a 2048-token document costs
one forward pass, not one pass per window over its prefix + window (64 passes and ~33x the tokens at w = 32).
Windows are consecutive and non-overlapping over the *scored* tokens (the first token of a text has no prediction
unless the tokenizer adds BOS); the last window may be shorter (its ``n_tokens`` says so). Only single-pass methods
apply (a multi-pass method would need a second pass per window, as the paper notes for Lowercase / Neighbor / Ref);
``zlib`` reads the window's own decoded text.

Window-level metrics come with the blind baseline (``mia_jax.evaluation.blind``) on the windows' decoded texts, the
windows of one text kept in one cross-validation fold: non-member and member windows of a concatenation may differ in
topic and date words, and this says how far a model-free classifier separates them.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from mia_jax.evaluation import blind, metrics
from mia_jax.batching import encode
from mia_jax.evaluation.blind import NAME as BLIND_NAME
from mia_jax.errors import UserError
from mia_jax.scorers import RESOURCES, TokenBatch, is_multi_pass, score_batch
from mia_jax.scorers.base import single_pass
from mia_jax.stats import TokenStats


def check_window(window: int, methods: Sequence[str], max_length: int) -> None:
    """Refuse a window that cannot be scored: below 1, wider than the model's context, a multi-pass method, or one
    that reads tempered statistics (ACMIA's: the per-token statistics kept for the windows are ``TokenStats`` only)."""
    if window < 1:
        raise UserError(f"--window must be at least 1 token, got {window}")
    if window > max_length - 1:
        raise UserError(f"--window {window} is larger than the model's context ({max_length} tokens, so at most "
                        f"{max_length - 1} scored tokens per text)")
    multi = [m for m in methods if is_multi_pass(m)]
    if multi:
        raise UserError(f"--window scores single-pass methods only (one forward pass per text); drop "
                        f"{', '.join(multi)}")
    tempered = [m for m in methods if single_pass(m)[0].temperature_resource is not None]
    if tempered:
        raise UserError(f"--window does not score {', '.join(tempered)} (their tempered statistics are not kept per "
                        "token); score them in a run without --window")
    per_token = [m for m in methods if any(RESOURCES[r].per_token for r in single_pass(m)[0].resources)]
    if per_token:
        raise UserError(f"--window does not score {', '.join(per_token)} (their per-token resources are made for whole "
                        "texts); score them in a run without --window")


def split_windows(batch: TokenBatch, window: int, decode: Callable[[list[int]], str] | None = None):
    """The windows of every row as one TokenBatch ``[n_windows, window]`` (rows right-padded, mask per window), the
    row each window belongs to, and each window's number of tokens."""
    mask = batch.mask
    owner, cols = [], []
    for r in range(mask.shape[0]):
        pos = np.flatnonzero(mask[r])
        for s in range(0, pos.size, window):
            owner.append(r)
            cols.append(pos[s: s + window])
    n = np.array([c.size for c in cols], np.int64)
    idx = np.zeros((len(cols), window), np.int64)
    wmask = np.zeros((len(cols), window), bool)
    for j, c in enumerate(cols):
        idx[j, : c.size] = c
        wmask[j, : c.size] = True
    rows = np.array(owner, np.int64)[:, None]
    stats = TokenStats(*(np.where(wmask, np.asarray(x)[rows, idx], 1) for x in batch.stats))  # padding: inert
    ids = np.where(wmask, batch.ids[rows, idx], 0) if batch.ids is not None else None
    texts = None
    if decode is not None and ids is not None:
        texts = [decode([int(t) for t in ids[j, : n[j]]]) for j in range(len(cols))]
    wb = TokenBatch(stats, wmask, texts, ids, batch.resources)
    return wb, np.array(owner, np.int64), n


def window_scores(batch: TokenBatch, methods: Sequence[str], window: int,
                  decode: Callable[[list[int]], str] | None = None) -> list[dict]:
    """Per row of ``batch``: ``{"size", "n_tokens": [..], "scores": {method: [..]}}`` over its windows in order
    (NaN scores as None)."""
    wb, owner, n = split_windows(batch, window, decode)
    scores = score_batch(wb, methods) if len(owner) else {m: np.zeros(0) for m in methods}
    out = []
    for r in range(batch.mask.shape[0]):
        sel = owner == r
        out.append({"size": window, "n_tokens": n[sel].tolist(),
                    "scores": {m: [None if not np.isfinite(v) else float(v) for v in scores[m][sel]]
                               for m in methods}})
    return out


def step_window_scores(step, tokens, mask, encoded, texts, methods, window, decode, resources) -> dict[int, list]:
    """Each text's windowed scores (:func:`window_scores`) in a packed scoring step (``batching.Step``) from its
    per-token statistics [rows, segments, L] (its first prediction at column 0, ``score_step.gather_segments``),
    the step's scored-prediction ``mask`` [rows, L] (``batching.packed_arrays(..., targets=True)``: a text's n
    slots are its n predictions) and ``encoded`` ({index: ``batching.Encoded``}): {index: windows}."""
    out = {}
    for r, row in enumerate(step.contents):
        for s, (item, start, n) in enumerate(row):
            stats = TokenStats(*(x[r, s, None, :n] for x in tokens))
            batch = TokenBatch(stats, mask[None, r, start: start + n], [texts[item]],
                               np.asarray(encoded[item].ids[1:], np.int64)[None], resources or {})
            out[item] = window_scores(batch, methods, window, decode)[0]
    return out


def window_labels(tokenizer, texts: Sequence[str], member_from: Sequence[int | None], records: Sequence[dict],
                  ) -> list[list[int | None]]:
    """Per text, per window: 1 when all the window's tokens start at or after character ``member_from`` of the text
    (the member part of a non-member + member concatenation), 0 when all start before it, None when the window
    straddles the boundary (left out of the window metrics, counted). A text without ``member_from`` (None) gets
    its windows labeled by nothing (None)."""
    out = []
    for text, start, rec in zip(texts, member_from, records):
        win = rec.get("windows")
        if win is None or start is None:
            out.append([None] * (len(win["n_tokens"]) if win else 0))
            continue
        begins = [s for s, _ in tokenizer.encode(text).offsets][1:]  # scored tokens: every token after the first
        labels, pos = [], 0
        for n in win["n_tokens"]:
            side = {int(b >= start) for b in begins[pos: pos + n]}
            labels.append(side.pop() if len(side) == 1 else None)
            pos += n
        out.append(labels)
    return out


def window_texts(loaded, texts: Sequence[str], records: Sequence[dict]) -> list[list[str]]:
    """Per text, per window: the decoded text of the window's scored (target) tokens, the text its scores are
    about. Rebuilt from the texts and the tokenizer exactly as the scoring pass cut them (``batching.encode``: every
    token after the first, cut to the context), so it needs nothing but the records' ``n_tokens``."""
    out = []
    for enc, rec in zip(encode(loaded, texts), records):
        ids, pieces, pos = enc.ids[1:], [], 0
        for n in (rec.get("windows") or {}).get("n_tokens", []):
            pieces.append(ids[pos: pos + n])
            pos += n
        out.append(loaded.tokenizer.decode_batch(pieces) if pieces else [])
    return out


def blind_row(texts: list[list[str]] | None, labels: list[list[int | None]], *, n_bootstrap: int, seed: int,
              ) -> tuple[dict | None, str]:
    """The blind baseline over the labeled windows (groups: the text each window belongs to), as a metrics row, and
    the line that reports it (with ``blind.warning`` above its threshold) or says why it was not computed."""
    if texts is None:
        return None, "Blind baseline not computed: no window texts (a windows.csv without its window_text column)"
    picked = [(t, lab, i) for i, (ts, labs) in enumerate(zip(texts, labels)) for t, lab in zip(ts, labs)
              if lab is not None]
    try:
        if not picked:
            raise UserError("no labeled window")
        wt, y, g = map(list, zip(*picked))
        scores = blind.blind_bow_scores(wt, y, seed=seed, groups=g)
    except UserError as e:
        return None, f"Blind baseline not computed on the windows: {e}"
    m = metrics.evaluate(np.asarray(y), scores, n_bootstrap=n_bootstrap, seed=seed)
    ci = m["auroc_ci"] or (float("nan"), float("nan"))
    line = (f"Blind baseline on the windows ({blind.NAME}: bag-of-words + logistic regression, {blind.FOLDS}-fold CV "
            f"with each text's windows in one fold, no model): AUROC {m['auroc']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}].")
    warn = blind.warning(m["auroc"])
    return m, line + (f"\n{warn}" if warn else "")


def first_flags(records: Sequence[dict], method: str, threshold: float) -> list[int | None]:
    """Per text, the index of its first window whose ``method`` score is above ``threshold`` (None: no window)."""
    out = []
    for rec in records:
        scores = (rec.get("windows") or {}).get("scores", {}).get(method, [])
        out.append(next((j for j, v in enumerate(scores) if v is not None and v > threshold), None))
    return out


def threshold_at_fpr(scores: np.ndarray, labels: np.ndarray, fpr: float) -> float:
    """The smallest threshold whose share of non-member windows scoring above it is at most ``fpr``."""
    neg = np.sort(scores[(labels == 0) & np.isfinite(scores)])
    if neg.size == 0:
        raise UserError("no non-member window to set a threshold on: give --window-threshold")
    allowed = int(np.floor(fpr * neg.size))
    return float(neg[neg.size - allowed - 1]) if allowed < neg.size else float(neg[0])


def report(records: Sequence[dict], labels: list[list[int | None]], methods: Sequence[str], *, method: str,
           threshold: float | None, fpr: float, n_bootstrap: int, seed: int,
           texts: list[list[str]] | None = None, blind: bool = True) -> dict:
    """Window-level AUROC / TPR per method (windows pooled over texts) where window labels exist, the flag
    threshold (given, or at ``fpr`` on the non-member windows of ``method``) and each text's first flagged window.
    With ``blind``, the metrics also hold the blind baseline's row (``blind.NAME``) over ``texts`` (per text, per
    window: :func:`window_texts`) where it can be computed, and ``blind_note`` the line that reports it or says
    why not."""
    flat_labels = np.array([lab for labs in labels for lab in labs if lab is not None], np.int64)
    out: dict = {"n_windows": int(sum(len(r.get("windows", {}).get("n_tokens", [])) for r in records)),
                 "n_labeled": int(flat_labels.size),
                 "n_straddling": int(sum(lab is None for labs in labels for lab in labs))}
    scores = {m: np.array([v if v is not None else np.nan
                           for r, labs in zip(records, labels)
                           for v, lab in zip(r.get("windows", {}).get("scores", {}).get(m, []), labs)
                           if lab is not None], np.float64) for m in methods}
    if flat_labels.size and len(set(flat_labels.tolist())) == 2:
        out["metrics"] = {m: metrics.evaluate(flat_labels, scores[m], n_bootstrap=n_bootstrap, seed=seed)
                          for m in methods}
        if blind:
            row, out["blind_note"] = blind_row(texts, labels, n_bootstrap=n_bootstrap, seed=seed)
            if row is not None:
                out["metrics"][BLIND_NAME] = row
        if threshold is None:
            threshold = threshold_at_fpr(scores[method], flat_labels, fpr)
            out["threshold_from"] = f"{fpr:g} FPR on the non-member windows"
    if threshold is not None:
        out.update(method=method, threshold=threshold, first_flagged=first_flags(records, method, threshold))
    return out
