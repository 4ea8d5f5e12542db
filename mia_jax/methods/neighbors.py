"""Neighbour texts for the ``neighbor`` method (Mattern et al. 2023): a few words of each text replaced by
plausible alternatives, so that the target model's log-likelihood of the text can be compared with that of
texts which say nearly the same thing.

Generators are callables ``texts -> list[list[str]]`` (``n`` neighbours per text) with a ``name`` and a
JSON-able ``config`` (recorded in outputs and the cache key). Both generators here are deterministic: each
text's random choices come from ``numpy.random.default_rng([seed, sha256(text)[:8], stream])``, so a text
gets the same neighbours whatever else is in the batch, and the order of texts does not matter.

* ``MLMNeighbors`` - a BERT / RoBERTa masked LM (Mattern et al.'s set-up). For each neighbour,
  ``max(1, round(mask_frac * words))`` whitespace words are chosen at random among those with a letter or
  digit; each chosen word's *core* (from its first to its last letter/digit, so surrounding punctuation
  stays) becomes a single mask token and all chosen words are masked in the same input. Each mask is filled
  with a **seeded sample** from the MLM's ``top_k`` best *valid* candidates (softmax renormalised over them):
  a valid candidate is a whole-word token (not an added/special token, not a ``##`` continuation) that
  decodes to one word with a letter or digit and differs from the original word ignoring case. The text
  outside the replaced cores is kept byte-identical. Texts longer than the MLM's context are processed in
  consecutive windows.
* ``SelfNeighbors`` - the target causal LM proposes the replacements (no second model). One jitted forward
  per text gives the next-token distribution at every position (top candidates computed in slices of
  positions, never a [T, V] float32 array). For each neighbour, words are visited in a seeded random order
  and ``max(1, round(frac * words))`` of them get their *first token* replaced by a seeded sample from the
  model's ``top_k`` best valid tokens at the previous position (the original token excluded, softmax
  renormalised over them), the word's other tokens kept. A valid token is not an added token (special,
  control, markup) and decodes, in context, to the original token's leading whitespace followed by a
  non-empty word with a letter or digit, so the word count is kept; it is spliced into the original string
  at the token's offsets (everything else byte-identical, also past the context length). A text's first
  token (no previous position) is never replaced.

A neighbour identical to its text (no replaceable word, or no valid candidate) is dropped and counted by
``drop_identical``; ``cached_neighbors`` stores neighbours in a JSONL keyed by sha256(config, text).
"""
from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.batching import batch_shapes, pad_ids, real_vocab_size
from mia_jax.models.bert import load_mlm

ALGORITHM_VERSION = 1  # part of every generator config: changing the algorithm invalidates cached neighbours
_EXTRA = 16  # candidates fetched beyond top_k, to make up for invalid ones
_WORD = re.compile(r"\S+")


class NeighborGenerator(Protocol):
    """What makes neighbours: called on texts, returns each text's neighbour texts; ``name`` and ``config`` define it
    (cache key, run fingerprint)."""
    name: str
    config: dict

    def __call__(self, texts: Sequence[str]) -> list[list[str]]: ...


def text_rng(seed: int, text: str, stream: int = 0) -> np.random.Generator:
    """A generator seeded by ``seed``, ``text``'s SHA-256 and ``stream`` (the same draws wherever the text is)."""
    h = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng([seed, h, stream])


def n_replaced(n_words: int, frac: float) -> int:
    """Words to replace: round(frac * n_words), at least 1."""
    return max(1, int(np.floor(frac * n_words + 0.5)))


def _sample(rng: np.random.Generator, logits: Sequence[float]) -> int:
    z = np.asarray(logits, np.float64)
    p = np.exp(z - z.max())
    return int(rng.choice(len(p), p=p / p.sum()))


def _special_ids(tokenizer) -> set[int]:
    """Added tokens (special, control or markup such as Gemma's '<h1>') are never proposed as replacements."""
    return set(tokenizer.get_added_tokens_decoder())


def _has_word(s: str) -> bool:
    return bool(s) and not any(c.isspace() for c in s) and any(c.isalnum() for c in s)


class _Tokens:
    """The non-special, non-empty tokens of an encoding (first ``limit``) by character offsets, for lookups."""

    def __init__(self, enc, limit: int | None = None):
        keep = [(s, e, i) for i, ((s, e), sp) in enumerate(zip(enc.offsets[:limit], enc.special_tokens_mask[:limit]))
                if not sp and e > s]
        self.starts, self.ends, self.index = ([k[j] for k in keep] for j in range(3))

    def overlapping(self, cs: int, ce: int) -> list[int]:
        """Tokens whose characters overlap [cs, ce)."""
        out, k = [], bisect.bisect_right(self.ends, cs)
        while k < len(self.index) and self.starts[k] < ce:
            out.append(self.index[k])
            k += 1
        return out

    def first_containing(self, c: int) -> int | None:
        """The first token whose characters include position c (several byte tokens may share a character)."""
        k, found = bisect.bisect_right(self.starts, c) - 1, None
        while k >= 0 and self.starts[k] <= c < self.ends[k]:
            found, k = self.index[k], k - 1
        return found


def _splice(text: str, replacements: list[tuple[int, int, str]]) -> str:
    for s, e, r in sorted(replacements, reverse=True):
        text = text[:s] + r + text[e:]
    return text


def drop_identical(texts: Sequence[str], neighbors: Sequence[Sequence[str]]) -> tuple[list[list[str]], list[int]]:
    """(the neighbours that differ from their text, the number dropped per text)."""
    kept = [[x for x in ns if x != t] for t, ns in zip(texts, neighbors, strict=True)]
    return kept, [len(ns) - len(k) for ns, k in zip(neighbors, kept)]


def cache_key(generator: NeighborGenerator, text: str) -> str:
    """The cache key of ``text``'s neighbours from ``generator``: SHA-256 of its config and the text."""
    blob = json.dumps({"generator": generator.config, "text": text}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def cached_neighbors(generator: NeighborGenerator, texts: Sequence[str], cache_dir: str | os.PathLike,
                     chunk: int = 64) -> list[list[str]]:
    """``generator(texts)`` through a disk cache ``cache_dir/neighbors.jsonl`` ({"key", "generator",
    "neighbors"} per line, key = sha256 of the generator config and the text). Only texts not in the cache
    are generated, ``chunk`` at a time, each chunk appended as soon as it is done (a torn last line is
    ignored), so an interrupted run keeps what it generated."""
    path = Path(cache_dir, "neighbors.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    known: dict[str, list[str]] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
                known[rec["key"]] = list(rec["neighbors"])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # torn write
    keys = [cache_key(generator, t) for t in texts]
    todo = list({k: t for k, t in zip(keys, texts) if k not in known}.items())
    if todo:
        with open(path, "a", encoding="utf-8") as sink:
            for s in range(0, len(todo), chunk):
                part = todo[s: s + chunk]
                out = generator([t for _, t in part])
                if len(out) != len(part):
                    raise ValueError(f"{generator.name} returned {len(out)} neighbour lists for {len(part)} texts")
                for (k, _), ns in zip(part, out):
                    known[k] = list(ns)
                    sink.write(json.dumps({"key": k, "generator": generator.name, "neighbors": known[k]}) + "\n")
                sink.flush()
    return [list(known[k]) for k in keys]


# ---------------------------------------------------------------------------------------- masked LM


class MLMNeighbors:
    """Neighbours from a BERT / RoBERTa masked LM in a local Hugging Face folder (see the module doc)."""

    def __init__(self, mlm_path: str, n: int = 10, seed: int = 0, mask_frac: float = 0.15, top_k: int = 10,
                 batch_size: int = 8, dtype: str = "float32"):
        if n < 1 or top_k < 1 or not 0 < mask_frac <= 1:
            raise ValueError(f"need n >= 1, top_k >= 1, 0 < mask_frac <= 1; got {n}, {top_k}, {mask_frac}")
        self.model, self.tokenizer, self.mask_id, self.info = load_mlm(mlm_path, dtype)
        self.n, self.seed, self.mask_frac, self.top_k, self.batch_size = n, seed, mask_frac, top_k, batch_size
        self.name = f"mlm:{self.info['name']}"
        self.config = {"generator": "mlm", "algorithm": ALGORITHM_VERSION, "mlm": self.info["name"],
                       "mlm_model_type": self.info["model_type"], "mlm_sha256": sorted(self.info["files"].values()),
                       "dtype": dtype, "n": n, "seed": seed, "mask_frac": mask_frac, "top_k": top_k,
                       "fill": "seeded sample from the top_k valid candidates"}
        self.max_length = self.info["max_length"]
        self._special = _special_ids(self.tokenizer) | {self.mask_id}
        vocab = min(self.model.config.vocab_size, self.tokenizer.get_vocab_size(with_added_tokens=True))
        kf = min(top_k + _EXTRA, vocab)
        graphdef, self._state = nnx.split(self.model)

        @jax.jit
        def fn(state, ids, attn, pos):
            model = nnx.merge(graphdef, state)
            hidden = model.hidden_states(ids, attn)
            logits = model.head(jnp.take_along_axis(hidden, pos[..., None], axis=1))  # [B, M, V]: masks only
            logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab, logits, -jnp.inf)
            return jax.lax.top_k(logits, kf)

        self._fn = fn
        self._words_of: dict[int, str | None] = {}

    def _candidate(self, tid: int) -> str | None:
        """The word a candidate token stands for, or None when it cannot replace a whole word."""
        if tid not in self._words_of:
            tok = self.tokenizer.id_to_token(tid) or ""
            word = self.tokenizer.decode([tid]).strip()
            ok = tid not in self._special and not tok.startswith("##") and _has_word(word)
            self._words_of[tid] = word if ok else None
        return self._words_of[tid]

    @staticmethod
    def _words(text: str, enc) -> list[tuple[int, int, int, int]]:
        """Replaceable words as (core start, core end, first token, last token) over the encoding's tokens."""
        out, tokens = [], _Tokens(enc)
        for m in _WORD.finditer(text):
            alnum = [i for i, c in enumerate(m.group()) if c.isalnum()]
            if not alnum:
                continue
            cs, ce = m.start() + alnum[0], m.start() + alnum[-1] + 1
            toks = tokens.overlapping(cs, ce)
            if toks and (not out or toks[0] > out[-1][3]):
                out.append((cs, ce, toks[0], toks[-1]))
        return out

    def __call__(self, texts: Sequence[str]) -> list[list[str]]:
        jobs = []  # (text index, neighbour index, ids, [(mask position, word index)])
        plans = []
        for ti, text in enumerate(texts):
            enc = self.tokenizer.encode(text)
            sp = enc.special_tokens_mask
            lead = next((i for i, s in enumerate(sp) if not s), len(sp))
            end = len(sp) - next((i for i, s in enumerate(reversed(sp)) if not s), 0)
            prefix, suffix = enc.ids[:lead], enc.ids[end:]
            width = max(1, self.max_length - len(prefix) - len(suffix))
            words = self._words(text, enc)
            rng = text_rng(self.seed, text, 0)
            m = min(n_replaced(len(text.split()), self.mask_frac), len(words))
            chosen_per = []
            for j in range(self.n):
                chosen = sorted(rng.choice(len(words), m, replace=False).tolist()) if m else []
                chosen_per.append(chosen)
                seq, slots, prev = [], [], lead  # the content with each chosen word collapsed to one mask
                for w in chosen:
                    _, _, a, b = words[w]
                    seq += enc.ids[prev:a]
                    slots.append((len(seq), w))
                    seq.append(self.mask_id)
                    prev = b + 1
                seq += enc.ids[prev:end]
                for w0 in range(0, len(seq), width):
                    inside = [(len(prefix) + p - w0, w) for p, w in slots if w0 <= p < w0 + width]
                    if inside:
                        jobs.append((ti, j, prefix + seq[w0: w0 + width] + suffix, inside))
            plans.append((words, chosen_per))
        cands = self._predict(jobs)
        out = []
        for ti, (text, (words, chosen_per)) in enumerate(zip(texts, plans)):
            rng = text_rng(self.seed, text, 1)
            neigh = []
            for j, chosen in enumerate(chosen_per):
                reps = []
                for w in chosen:
                    cs, ce, _, _ = words[w]
                    vals, idx = cands[ti, j, w]
                    valid = [(float(v), word) for v, tid in zip(vals, idx)
                             if (word := self._candidate(int(tid))) and word.lower() != text[cs:ce].lower()]
                    valid = valid[: self.top_k]
                    if valid:
                        reps.append((cs, ce, valid[_sample(rng, [v for v, _ in valid])][1]))
                neigh.append(_splice(text, reps))
            out.append(neigh)
        return out

    def _predict(self, jobs) -> dict:
        """{(text, neighbour, word): (top logits, token ids)} for every mask of every job."""
        pad = self.model.config.pad_token_id or 0
        result = {}
        for t, rows, part in batch_shapes([len(j[2]) for j in jobs], self.max_length, self.batch_size):
            m = 1 << max(0, max(len(jobs[k][3]) for k in part) - 1).bit_length()
            ids, attn = pad_ids([jobs[k][2] for k in part], rows, t, pad)
            pos = np.zeros((rows, m), np.int32)
            for r, k in enumerate(part):
                pos[r, : len(jobs[k][3])] = [p for p, _ in jobs[k][3]]
            vals, idx = jax.device_get(self._fn(self._state, jnp.asarray(ids), jnp.asarray(attn, jnp.int32),
                                                jnp.asarray(pos)))
            for r, k in enumerate(part):
                ti, j, _, inside = jobs[k]
                for q, (_, w) in enumerate(inside):
                    result[ti, j, w] = (vals[r, q], idx[r, q])
        return result


# ---------------------------------------------------------------------------------------- the target model


class SelfNeighbors:
    """Neighbours proposed by the target causal LM itself (a LoadedModel; see the module doc)."""

    def __init__(self, loaded, n: int = 10, seed: int = 0, frac: float = 0.15, top_k: int = 10,
                 batch_size: int = 8, position_chunk: int = 64):
        if n < 1 or top_k < 1 or not 0 < frac <= 1:
            raise ValueError(f"need n >= 1, top_k >= 1, 0 < frac <= 1; got {n}, {top_k}, {frac}")
        self.loaded, self.n, self.seed, self.frac, self.top_k = loaded, n, seed, frac, top_k
        self.batch_size = batch_size
        self.name = f"self:{loaded.name}"
        self.config = {"generator": "self", "algorithm": ALGORITHM_VERSION, "model": loaded.name,
                       "model_sha256": sorted(loaded.files.values()), "dtype": loaded.dtype, "n": n, "seed": seed,
                       "frac": frac, "top_k": top_k,
                       "fill": "first token of each chosen word <- seeded sample from the top_k valid next tokens"}
        self.tokenizer = loaded.tokenizer
        self._special = _special_ids(self.tokenizer)
        vocab = real_vocab_size(loaded)
        kf = min(top_k + 1 + _EXTRA, vocab)
        graphdef, self._state = nnx.split(loaded.model)
        chunk = position_chunk

        @jax.jit
        def fn(state, ids):
            model = nnx.merge(graphdef, state)
            hidden = model.hidden_states(ids)  # [B, T, D]
            b, t, d = hidden.shape
            flat = jnp.pad(hidden.reshape(b * t, d), ((0, -(b * t) % chunk), (0, 0)))
            unemb = model.unembedding()

            def top(h):  # [chunk, D] -> [chunk, kf]: the logits of one slice of positions at a time
                logits = jnp.einsum("sd,vd->sv", h, unemb, preferred_element_type=jnp.float32)
                logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab, logits, -jnp.inf)
                return jax.lax.top_k(logits, kf)

            vals, idx = jax.lax.map(top, flat.reshape(-1, chunk, d))
            return vals.reshape(-1, kf)[: b * t].reshape(b, t, kf), idx.reshape(-1, kf)[: b * t].reshape(b, t, kf)

        self._fn = fn

    def _top(self, encoded: list[list[int]]) -> list:
        """Per text: (top logits [n, kf], token ids [n, kf]) of the next-token distribution at each position."""
        pad = self.loaded.pad_token_id if self.loaded.pad_token_id is not None else 0
        out: list = [None] * len(encoded)
        for t, rows, part in batch_shapes([len(e) for e in encoded], self.loaded.max_length, self.batch_size):
            ids, _ = pad_ids([encoded[k] for k in part], rows, t, pad)
            vals, idx = jax.device_get(self._fn(self._state, jnp.asarray(ids)))
            for r, k in enumerate(part):
                out[k] = (vals[r, : len(encoded[k])], idx[r, : len(encoded[k])])
        return out

    def _replacement(self, text: str, ids: list[int], offsets, i: int, cand: int) -> str | None:
        """The string to put at token i's offsets when token i becomes ``cand`` (decoded in the context of the
        8 tokens before it), or None when that would not be one word with the original's leading whitespace."""
        ctx = ids[max(0, i - 8): i]
        base, with_o = self.tokenizer.decode_batch([ctx, ctx + [ids[i]]])
        with_c = self.tokenizer.decode(ctx + [cand])
        if not (with_o.startswith(base) and with_c.startswith(base)):
            return None
        o, r = with_o[len(base):], with_c[len(base):]
        s, e = offsets[i]
        span = text[s:e]
        implicit = o[: len(o) - len(span)]  # decoded whitespace the offsets do not cover (e.g. a trimmed 'Ġ')
        if not span or not o.endswith(span) or (implicit and not implicit.isspace()):
            return None
        ws = o[: len(o) - len(o.lstrip())]
        if r == o or not r.startswith(ws) or not r.startswith(implicit) or not _has_word(r[len(ws):]):
            return None
        return r[len(implicit):]

    def __call__(self, texts: Sequence[str]) -> list[list[str]]:
        encs = [self.tokenizer.encode(t) for t in texts]
        ids_all = [e.ids[: self.loaded.max_length] for e in encs]
        tops = self._top(ids_all)
        out = []
        for text, enc, ids, top in zip(texts, encs, ids_all, tops):
            offsets, tokens = enc.offsets[: len(ids)], _Tokens(enc, len(ids))
            spans = list(_WORD.finditer(text))
            starts = []  # each word's first token, where it has a previous position to predict it from
            for m in spans:
                i = tokens.first_containing(m.start())
                if i is not None and i >= 1 and (not starts or i > starts[-1]):
                    starts.append(i)
            rng = text_rng(self.seed, text, 0)
            want = n_replaced(len(spans), self.frac)
            memo: dict[tuple[int, int], str | None] = {}
            neigh = []
            for _ in range(self.n):
                reps = []
                for w in (rng.permutation(len(starts)).tolist() if starts else []):
                    if len(reps) == want:
                        break
                    i, valid = starts[w], []
                    for v, c in zip(top[0][i - 1].tolist(), top[1][i - 1].tolist()):
                        if c == ids[i] or c in self._special or not np.isfinite(v):
                            continue
                        if (i, c) not in memo:
                            memo[i, c] = self._replacement(text, ids, offsets, i, c)
                        if memo[i, c] is not None:
                            valid.append((v, memo[i, c]))
                            if len(valid) == self.top_k:
                                break
                    if valid:
                        s, e = offsets[i]
                        reps.append((s, e, valid[_sample(rng, [v for v, _ in valid])][1]))
                neigh.append(_splice(text, reps))
            out.append(neigh)
        return out
