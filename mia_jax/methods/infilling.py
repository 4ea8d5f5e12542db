"""Infilling Score (Raoof et al., ICLR 2025, "Infilling Score: A Pretraining Data Detection Algorithm for Large
Language Models"), following the first author's released code (github.com/neginraoof/mink-plus-plus, ``run.py``,
``calculateInfillPerplexity`` and its ``InfillMIA`` aggregation).

A text of N tokens x_0..x_{N-1} (x_0 the tokenizer's BOS when it adds one). For every predicted token x_t (t = 1..N-1)
let v*_t = argmax_v p(v | x_<t) be the model's top-1 candidate there. The infilling likelihood
p(x_t | x_<t, x_>t) = p(x_t | x_<t) prod_{j>t} p(x_j | x_<j) / sum_v (same with v in place of x_t) needs a sum over
the vocabulary; the paper's ratio test against v*_t cancels that normaliser (their Eq. 6):

    r_t = [ log p(x_t | x_<t) - log p(v*_t | x_<t)
            + sum_{j in F_t} ( log p(x_j | x_<j) - log p(x_j | x_<t, v*_t, x_{t+1..j-1}) ) ] / sigma_t

with sigma_t the standard deviation of log p(v | x_<t) under p(. | x_<t) (Min-K%++'s normaliser; the code's
``(. - mu) / sigma`` terms all use position t's mu and sigma, so mu cancels in every difference), r_t = 0 where
x_t = v*_t, and the future tokens F_t = {t+1, ..., min(t + L, N - 2)}: the next L tokens (``future``; None = all),
and never the text's last token (the code's ``range(i, min(i + token_len, token_count - 3))`` stops one short).
The score is the mean of the m = max(1, floor(k n)) lowest r_t over the n predicted tokens (``k``, default 0.2):
higher = member, as the authors' ``roc_curve(labels, scores)`` reads it.

Cost: no single-pass formulation exists (the future tokens' probabilities after a replaced token need a forward of
the changed text); per text 1 forward of the text (its statistics, from the same hidden states the top-1 ids, and
its KV cache) plus one forward of each changed text: at most n, fewer where x_t is already the top-1 or F_t is empty
(L = 0 needs none). A changed text equals the original up to slot t, so its forward starts there, against the
original's cached keys and values (``CausalLM.decode_hidden``), and stops after its last future token: about half
the tokens of whole forwards (the authors' loop runs each changed text whole, one at a time). The starts are
rounded down to a multiple of max(16, T / 8) slots so a few shapes compile. The runner's ``infill`` pass
(``compute``, one text per row, resumable records) runs them in chunks of about ``batching.TOKENS_PER_BATCH`` new
tokens; each pass record holds ``extra_forwards``, the changed texts it read.

Where this differs from the authors' code:

- k: their ``int(n * ratio)`` (0 tokens for a short text: a NaN mean) is the exact ``max(1, floor(k n))``
  (``scorers.min_k.k_count``); they report a grid of k in 0.1..1.0 and L in {0, 1, 3, 5, 10, 20, 30}; the defaults
  here (k = 0.2, every future token, the paper's Eq. 6) are this project's choice, untuned.
- Their ``sigma_opt`` subtracts the original text's mu (a typo); at position t the two texts share the prefix, so it
  is the same number and changes nothing. Their ``np.nan_to_num`` is not applied: a non-finite ratio (broken logits)
  leaves the text's score NaN with a reason, never a silent 0.
- Statistics are float32 from the vocabulary-chunked kernel (``stats.token_stats_from_hidden``, the variance floored)
  and the ratios are summed in float64; a tie for the top-1 takes the lowest id (theirs: ``torch.sort``'s order).
- Which tokens are predicted follows this project's per-model policy (their ``tokenizer.encode(text)`` adds BOS when
  the tokenizer does, as here).

The parity test (``tests/test_infilling.py``) re-states their loop in float64 over the tiny model's transformers
logits, within 1e-4: their script itself cannot be imported (it parses arguments, loads a Hub model and downloads
WikiMIA at import) and is not vendored. Their function, copied out of the script and run once on the same tiny model
(float32 torch, L = 0, 3, 30, k = 1), agreed with this pass within 1e-6 relative on texts that fit the model's
context (a longer text is truncated to the context here; their loop reads it whole).
"""
from __future__ import annotations

import weakref
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.engine import passes
from mia_jax.batching import TOKENS_PER_BATCH, real_vocab_size
from mia_jax.checks import fraction
from mia_jax.errors import UserError
from mia_jax.evaluation.metrics import scores_by_method
from mia_jax.scorers.base import register_multi_pass
from mia_jax.scorers.min_k import k_count
from mia_jax.stats import default_chunk, token_stats_from_hidden

DEFAULT_K = 0.2
PASS_METHODS = ("infilling", "extra_forwards")  # the pass's record columns: the score and the changed texts read


def check_options(k: float = DEFAULT_K, future: int | None = None) -> dict:
    """The options of ``infilling`` checked: ``k`` a fraction in (0, 1], ``future`` (L) None or an integer >= 0;
    anything else is a UserError. Returns them as a dict."""
    k = fraction(k, "--infilling-k")
    if future is not None and (isinstance(future, bool) or not isinstance(future, (int, np.integer)) or future < 0):
        raise UserError(f"--infilling-future must be a whole number >= 0 (or omitted for every future token), "
                        f"got {future!r}")
    return {"k": k, "future": None if future is None else int(future)}


def _top1(hidden, unembedding, vocab: int, chunk: int):
    """argmax_v of ``hidden @ unembedding.T`` over the real vocabulary ``[:vocab]``, one chunk of rows at a time
    (the [.., V] logits never formed); ties: the lowest id."""
    n_rows = unembedding.shape[0]
    c = min(chunk, n_rows)
    h = hidden.astype(jnp.float32)

    def body(i, carry):
        best, arg = carry
        start = jnp.minimum(i * c, n_rows - c)  # the last chunk overlaps the one before: harmless for a max
        rows = jax.lax.dynamic_slice_in_dim(unembedding, start, c, axis=0).astype(jnp.float32)
        x = jnp.einsum("...d,vd->...v", h, rows, preferred_element_type=jnp.float32)
        ids = start + jnp.arange(c)
        x = jnp.where(ids < vocab, x, -jnp.inf)
        top, where = x.max(-1), start + x.argmax(-1)
        better = (top > best) | ((top == best) & (where < arg))
        return jnp.where(better, top, best), jnp.where(better, where, arg)

    init = (jnp.full(h.shape[:-1], -jnp.inf), jnp.zeros(h.shape[:-1], jnp.int32))
    return jax.lax.fori_loop(0, -(-n_rows // c), body, init)[1]


_FNS: "weakref.WeakKeyDictionary[nnx.Module, dict]" = weakref.WeakKeyDictionary()


def _functions(loaded):
    """The two jitted programs, made once per model: ``text(state, ids [R, T])`` -> (log p of each next token, its
    variance, the top-1 log p, the top-1 id, each [R, T-1]; the KV cache's k and v, [layers, R, T, ...]);
    ``changed(state, k, v, rows [B], suffix [B, S], start)`` -> log p [B, S-1] of ``suffix`` (slots start..start+S-1
    of texts ``rows`` of the cache, each with one token changed) after the cached prefix, slots 0..start-1."""
    fns = _FNS.setdefault(loaded.model, {})
    if not fns:
        graphdef, vocab, chunk = nnx.split(loaded.model)[0], real_vocab_size(loaded), default_chunk()

        def forward(model, ids, cache, start):
            """Hidden states of ``ids`` [B, S] at slots start.. after ``cache``'s slots 0..start-1, the cache."""
            b, s = ids.shape
            positions = jnp.broadcast_to(start + jnp.arange(s), (b, s))
            cache = {"k": cache["k"], "v": cache["v"], "index": jnp.int32(start)}
            return model.decode_hidden(ids, cache, positions, jnp.ones((b, start + s), bool))

        def stats(model, hidden, ids):
            return token_stats_from_hidden(hidden[:, :-1], model.unembedding(), ids[:, 1:], vocab_size=vocab,
                                           chunk_size=chunk)

        def text(state, ids):
            model = nnx.merge(graphdef, state)
            hidden, cache = forward(model, ids, model.init_cache(*ids.shape), 0)
            s = stats(model, hidden, ids)
            return (s.logprob, s.var, s.max_logprob, _top1(hidden[:, :-1], model.unembedding(), vocab, chunk),
                    cache["k"], cache["v"])

        def changed(state, k, v, rows, suffix, start):
            model = nnx.merge(graphdef, state)
            cache = {"k": k[:, rows, : start + suffix.shape[1]], "v": v[:, rows, : start + suffix.shape[1]]}
            return stats(model, forward(model, suffix, cache, start)[0], suffix).logprob

        fns["text"] = jax.jit(text)
        fns["changed"] = jax.jit(changed, static_argnums=5)
    return fns


def _future_end(t: np.ndarray, n: int, future: int | None) -> np.ndarray:
    """The last future prediction index of each prediction index ``t`` (0-based, predicting token t+1) of a text of
    ``n`` tokens: min(t + L, n - 3), the authors' bound (an end below t+1: no future term)."""
    return np.minimum(t + (n if future is None else future), n - 3)


def _windows(ends: dict[tuple[int, int], int], length: int) -> dict[tuple[int, int], list]:
    """The changed texts of ``ends`` ({(row, t): last future index}, token t+1 replaced) grouped by the slots each
    forward runs,
    {(start, stop): [(row, t), ...]}: slots 0..t are the original text's (its cached keys and values), so a forward
    starts at slot t+1, rounded down to a multiple of a width g (a few shapes to compile, at most g - 1 slots read
    twice), and stops after its last future token + 1 (rounded up to g, within ``length``)."""
    g = max(16, length // 8)
    out: dict[tuple[int, int], list] = {}
    for (r, t), end in ends.items():
        start = t // g * g + 1
        stop = min(length, -(-(end + 2) // g) * g)
        out.setdefault((start, stop), []).append((r, t))
    return out


def _changed_logprobs(fns, state, ids: np.ndarray, top: np.ndarray, cache: tuple,
                      ends: dict[tuple[int, int], int]) -> dict[tuple[int, int], np.ndarray]:
    """{(r, t): log p [T-1] of text ``r`` of ``ids`` with its token t+1 replaced by ``top[r, t]``} for (r, t) in
    ``ends``, defined at prediction indexes t+1..``ends[(r, t)]`` (NaN before the forward's first slot). Each
    changed text runs from its first changed slot against the original's cached keys and values ``cache`` (k, v), in
    chunks of about ``batching.TOKENS_PER_BATCH`` new tokens (and at most 4 times that many cached slots)."""
    length = ids.shape[1]
    budget = TOKENS_PER_BATCH.get(jax.default_backend(), TOKENS_PER_BATCH["gpu"])
    out = {}
    for (start, stop), items in _windows(ends, length).items():
        size = min(len(items), max(1, min(budget // (stop - start), 4 * budget // stop)))
        for first in range(0, len(items), size):
            part = items[first: first + size]
            rows = np.full(size, part[0][0])  # filler rows: a copy of the first
            suffix = np.repeat(ids[[part[0][0]], start:stop], size, axis=0)
            for i, (r, t) in enumerate(part):
                rows[i], suffix[i] = r, ids[r, start:stop]
                suffix[i, t + 1 - start] = top[r, t]
            lp = np.asarray(fns["changed"](state, *cache, jnp.asarray(rows, jnp.int32),
                                           jnp.asarray(suffix, jnp.int32), start), np.float64)
            for i, key in enumerate(part):
                full = np.full(length - 1, np.nan)
                full[start: stop - 1] = lp[i]
                out[key] = full
    return out


def infilling_scores(loaded, ids, mask, *, k: float = DEFAULT_K, future: int | None = None) -> dict[str, np.ndarray]:
    """{"infilling": the Infilling Score [rows], "extra_forwards": the changed texts read [rows]} of each row of
    ``ids`` int [rows, T] (one text per row, right-padded), ``mask`` bool [rows, T-1] its predicted tokens (module
    docstring: formula and source); NaN for a row with no prediction or a non-finite ratio."""
    opts = check_options(k, future)
    ids, mask = np.asarray(ids, np.int64), np.asarray(mask, bool)
    fns = _functions(loaded)
    state = nnx.split(loaded.model)[1]
    *stats, k_cache, v_cache = fns["text"](state, jnp.asarray(ids, jnp.int32))
    lp, var, top_lp, top = (np.asarray(x) for x in stats)
    lp, top_lp, sigma = lp.astype(np.float64), top_lp.astype(np.float64), np.sqrt(var.astype(np.float64))
    lengths = [int(np.flatnonzero(m)[-1]) + 2 if m.any() else 0 for m in mask]
    differs = mask & (ids[:, 1:] != top)
    last = ((r, int(t), int(_future_end(t, lengths[r], opts["future"]))) for r in range(len(ids))
            for t in np.flatnonzero(differs[r]))
    ends = {(r, t): end for r, t, end in last if end >= t + 1}  # the changed texts to read: a future token each
    changed = _changed_logprobs(fns, state, ids, top, (k_cache, v_cache), ends)
    scores = np.full(len(ids), np.nan)
    extra = np.bincount(np.array([r for r, _ in changed], int), minlength=len(ids)).astype(np.float64)  # texts read
    for r in range(len(ids)):
        ratios = []
        for t in np.flatnonzero(mask[r]):
            if not differs[r, t]:
                ratios.append(0.0)
                continue
            total = lp[r, t] - top_lp[r, t]
            if (r, t) in changed:
                future = slice(t + 1, ends[(r, t)] + 1)
                total += float((lp[r, future] - changed[(r, t)][future]).sum())
            ratios.append(total / sigma[r, t])
        if ratios and np.isfinite(ratios).all():
            m = int(k_count(opts["k"], len(ratios)))
            scores[r] = float(np.sort(ratios)[:m].mean())
    return {"infilling": scores, "extra_forwards": extra}


@passes.register_pass("infill")
def infill_pass(name: str, loaded, texts: Sequence[str], *, resume: bool, infilling: dict | None = None,
                **_) -> passes.Pass:
    """Each text's Infilling Score (``infilling_scores`` with the options ``infilling``: ``k``, ``future``): its
    forward and those of its changed texts, through the runner's buckets and resumable records."""
    opts = check_options(**(infilling or {}))

    def compute(ids, mask, batch_texts):  # the batch's filler rows (all padding) are not read
        n = len(batch_texts)
        return infilling_scores(loaded, ids[:n], mask[:n], **opts)

    def fold(recs):
        values = scores_by_method(recs, ["infilling"])["infilling"] if recs else np.zeros(0)
        reasons = {i: f"{name} pass: {r['skip_reason']}" for i, r in enumerate(recs) if "skip_reason" in r}
        return values, reasons, {}

    return passes.Pass(loaded, list(texts), resume, fold, methods=list(PASS_METHODS), compute=compute)


@register_multi_pass("infilling", pass_kind="infill")
def infilling(loss: np.ndarray, infill: np.ndarray, texts: Sequence[str]):
    """Infilling Score (Raoof et al. 2025): mean of the k lowest per-token infilling ratios (see the module)."""
    infill = np.asarray(infill, np.float64)
    reasons = {int(i): "infilling: a non-finite infilling ratio (the model's logits are not finite)"
               for i in np.flatnonzero(np.isnan(infill))}
    return infill, reasons
