"""SaMIA (Kaneko et al. 2024, *Sampling-based Pseudo-Likelihood for Membership Inference Attacks*): a
likelihood-free detector that only reads the model's *generated text*.

Each text is split on whitespace into a prefix (its first ``floor(n_words * prefix_ratio)`` words) and the
reference continuation (the remaining words). ``n_samples`` continuations of the prefix are sampled from the
model, each is compared with the reference by ROUGE-1 recall, and the score is their mean:

    samia(x)      = 1/m * sum_j R1(c_j, x_ref)
    samia_zlib(x) = 1/m * sum_j R1(c_j, x_ref) * |zlib(c_j)|
    R1(c, r)      = sum_w min(count_c(w), count_r(w)) / |r|     (0 when c or r has no word)

with words = whitespace-separated strings (case-sensitive, punctuation attached) and |zlib(c)| the byte length of
the zlib-compressed candidate (its words joined by single spaces). A memorised text is continued with its own
words more often than an unseen one, so higher = member (both). Texts with no prefix word (fewer than
``ceil(1 / prefix_ratio)`` words) or no reference: NaN with a reason.

Where this follows the authors' code (nlp-titech/samia, ``src/sampling.py`` and ``src/eval_samia.py``):

- prefix = ``" ".join(text.split()[:int(n_words * prefix_ratio)])`` (``get_prefix``), ratio 0.5, 10 samples per
  text, sampling with temperature 1 and top-k 50 (their top_p = 1 is no filter), stopping at EOS;
- ROUGE-1 is their ``rouge_n(..., n=1)``: *recall* of clipped unigram counts over whitespace words, without the
  rouge-score package's lowercasing, punctuation stripping or stemming (it equals rouge-score's rouge1 recall
  with a whitespace tokenizer, which the tests check), 0 for an empty candidate;
- SaMIA*zlib multiplies each sample's recall by the zlib length of that candidate, then averages (``--zlib``).

Where it differs from their code:

- The candidate is the decoded *generated continuation* (new tokens only, special tokens skipped). Theirs decodes
  prompt + output and drops its first ``round(L * 0.5)`` words, L the dataset's *nominal* length (32, 64, ...;
  0.5 hard-coded whatever ``--prefix_ratio``), and takes the reference from the same nominal offset: the
  same words up to an off-by-one where the actual word count differs from L or the first generated token is
  glued to the last prefix word.
- Length: theirs generates up to ``max_length=1024`` tokens (prompt + output) or EOS, which makes each text cost
  ~1000 decode steps per sample, and a long candidate's recall grows by chance overlap alone. Here a sample gets as
  many tokens as the reference continuation has in context (``encode(prefix + " " + reference)`` minus the
  prefix's tokens), at most ``DEFAULT_MAX_NEW_TOKENS`` and half the model's context; ``max_new_tokens=`` sets one
  budget for every text instead. A prompt that does not fit the context with its budget keeps its last tokens
  (and a leading BOS), as ``mia_jax.generate`` does.
- Their sampling is unseeded; here sample j of a text is drawn with the key
  ``fold_in(fold_in(key(seed), sha256(text)[:4]), j)``, one key per row, folded with the step each step: a text's
  samples depend only on (seed, text, j), not on its position or on the other texts in its batch (as the
  neighbour generators do; and the runner's ``compute`` seam only hands a batch its texts).

Paper vs code: the paper's SPL is the same ROUGE-N recall of the reference averaged over the samples (n = 1 in
the released evaluation, as here), and SaMIA*zlib weights it by the candidate's zlib information content.

Cost: ``n_samples`` continuations of ~L tokens per text (L = the reference's token count, capped), i.e. one
prefill and ~n_samples x L single-token decode steps per text, batched as ``batch_size`` texts x ``n_samples`` rows per
jit-compiled sampling loop (the KV-cache ``decode`` of ``mia_jax.models``, as in ``mia_jax.generate``).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections import Counter
from typing import Sequence
from zlib import compress

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from mia_jax.batching import pad_ids
from mia_jax.errors import UserError
from mia_jax.generate import PROMPT_MULTIPLE, _check_sampling, _fit, sample_logits

DEFAULT_MAX_NEW_TOKENS = 256  # the default per-text budget (the reference's token count) is capped here
NEW_TOKENS_MULTIPLE = 16  # the loop's cache length is rounded up to this (fewer compiled shapes)
METHODS = ("samia", "samia_zlib")


def split_prefix(text: str, ratio: float = 0.5) -> tuple[str, str]:
    """(prefix, reference): the first ``int(n_words * ratio)`` whitespace words and the rest, each joined by
    single spaces (the authors' ``get_prefix``). ``ratio`` must be in (0, 1)."""
    if not 0 < ratio < 1:
        raise UserError(f"the SaMIA prefix ratio must be between 0 and 1 (exclusive), got {ratio}")
    words = text.split()
    k = int(len(words) * ratio)
    return " ".join(words[:k]), " ".join(words[k:])


def skip_reason(text: str, ratio: float = 0.5) -> str | None:
    """Why a text gets no SaMIA score (no words, or too few for a one-word prefix), or None. (A prefix that
    encodes to no tokens with the model's tokenizer is the only other reason ``sample_continuations`` gives.)"""
    prefix, _ = split_prefix(text, ratio)
    n = len(text.split())
    if not n:
        return "samia: the text has no words"
    if not prefix:
        return (f"samia: the text has {n} word{'s' * (n != 1)}, too few for a prefix of {ratio:g} of its words "
                f"(needs at least {math.ceil(1 / ratio)})")
    return None


def rouge1_recall(candidate: str, reference: str) -> float:
    """ROUGE-1 recall of ``candidate`` against ``reference`` over whitespace words (case-sensitive): the
    reference's unigrams matched by the candidate (counts clipped) over the reference's word count; 0 when
    either has no word (the authors' ``rouge_n``)."""
    cand, ref = candidate.split(), reference.split()
    if not cand or not ref:
        return 0.0
    return sum((Counter(cand) & Counter(ref)).values()) / len(ref)


def zlib_length(candidate: str) -> int:
    """Bytes of the zlib-compressed candidate, its words joined by single spaces (SaMIA*zlib's weight)."""
    return len(compress(" ".join(candidate.split()).encode("utf-8")))


def samia_from_samples(samples: Sequence[Sequence[str]], references: Sequence[str], *,
                       zlib: bool = False) -> np.ndarray:
    """float64 [N]: per text the mean over its samples of ROUGE-1 recall against its reference (times each
    sample's ``zlib_length`` with ``zlib=True``); NaN for a text with no sample."""
    if len(samples) != len(references):
        raise ValueError(f"{len(samples)} sample lists for {len(references)} references")
    out = np.full(len(references), np.nan)
    for i, (cands, ref) in enumerate(zip(samples, references)):
        if len(cands):
            out[i] = np.mean([rouge1_recall(c, ref) * (zlib_length(c) if zlib else 1) for c in cands])
    return out


@dataclasses.dataclass
class SampleSet:
    """What ``sample_continuations`` drew: per text its prefix, reference, samples (``n_samples`` strings; none
    for a skipped text), the generated token count of each sample (its EOS excluded) and its token budget (0 when
    skipped); ``reasons`` {text index: why it has no samples}."""

    prefixes: list[str]
    references: list[str]
    samples: list[list[str]]
    n_tokens: list[list[int]]
    budgets: list[int]
    reasons: dict[int, str]


def text_hash(text: str) -> int:
    """The 32-bit key component of a text: the first 4 bytes of its UTF-8 SHA-256."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "little")


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "greedy", "filtered"))
def _sample_loop(graphdef, state, ids, n_pad, limit, base_key, hashes, sample_index, temperature, top_k,
                 eos_token_id, pad_token_id, vocab_limit, *, max_new_tokens: int, greedy: bool, filtered: bool):
    """``mia_jax.generate``'s prefill + while_loop of single-token decodes, with one key per row (derived from the
    row's text hash and sample index) and a per-row token budget ``limit`` [B] (a row stops at EOS or after
    ``limit`` tokens; limit 0 = a filler row). -> tokens int32 [B, max_new_tokens] (pad after a row stopped)."""
    model = nnx.merge(graphdef, state)
    B, P = ids.shape
    keys = jax.vmap(lambda h, j: jax.random.fold_in(jax.random.fold_in(base_key, h), j))(hashes, sample_index)
    cache = model.init_cache(B, P + max_new_tokens)
    key_mask = jnp.arange(P + max_new_tokens)[None, :] >= n_pad[:, None]
    logits, cache = model.decode(ids, cache, jnp.arange(P)[None, :] - n_pad[:, None], key_mask)
    valid = jnp.arange(logits.shape[-1]) < vocab_limit  # padded vocabulary rows are never drawn

    def draw(row_logits, key):
        return sample_logits(row_logits[None], key, temperature=temperature,
                             top_k=top_k if filtered else None)[0]

    def body(carry):
        i, tokens, cache, last, done = carry
        masked = jnp.where(valid, last, -jnp.inf)
        if greedy:
            tok = jnp.argmax(masked, axis=-1).astype(jnp.int32)
        else:
            tok = jax.vmap(draw)(masked, jax.vmap(jax.random.fold_in, (0, None))(keys, i))
        tok = jnp.where(done, pad_token_id, tok)
        tokens = tokens.at[:, i].set(tok)
        done = done | (tok == eos_token_id) | (i + 1 >= limit)
        step_logits, cache = model.decode(tok[:, None], cache, (P + i - n_pad)[:, None], key_mask)
        return i + 1, tokens, cache, step_logits[:, 0], done

    def cond(carry):
        return (carry[0] < max_new_tokens) & ~jnp.all(carry[4])

    tokens = jnp.full((B, max_new_tokens), pad_token_id, jnp.int32)
    carry = (jnp.int32(0), tokens, cache, logits[:, -1], limit <= 0)
    return jax.lax.while_loop(cond, body, carry)[1]


def _budgets(loaded, prefixes: list[str], references: list[str], max_new_tokens: int | None) -> list[int]:
    """Per text: ``max_new_tokens``, or the reference's token count in context after the prefix, capped."""
    if max_new_tokens is not None:
        return [max_new_tokens] * len(prefixes)
    cap = max(1, min(DEFAULT_MAX_NEW_TOKENS, loaded.max_length // 2))
    whole = loaded.tokenizer.encode_batch([p + " " + r for p, r in zip(prefixes, references)])
    alone = loaded.tokenizer.encode_batch(prefixes)
    return [min(cap, max(1, len(w.ids) - len(a.ids))) for w, a in zip(whole, alone)]


def sample_continuations(loaded, texts: Sequence[str], *, n_samples: int = 10, prefix_ratio: float = 0.5,
                         max_new_tokens: int | None = None, temperature: float = 1.0, top_k: int | None = 50,
                         seed: int = 0, batch_size: int = 8, progress: bool = True) -> SampleSet:
    """``n_samples`` continuations of each text's prefix (``split_prefix``) from the ``LoadedModel``, each at most
    its text's budget (see the module docstring), seeded per (seed, text, sample). ``batch_size`` texts (x
    ``n_samples`` rows) share one sampling loop; texts are grouped by length (the result does not depend on it)."""
    if isinstance(texts, str):
        raise UserError("texts must be a list of strings, not one string")
    if not isinstance(n_samples, int) or n_samples < 1:
        raise UserError(f"SaMIA needs at least 1 sample per text, got n_samples={n_samples!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")
    _check_sampling(1 if max_new_tokens is None else max_new_tokens, temperature, top_k, None)
    if max_new_tokens is not None and max_new_tokens >= loaded.max_length:
        raise UserError(f"{max_new_tokens} new tokens do not fit the model's context of {loaded.max_length} tokens "
                        "together with a prefix; ask for fewer")
    split = [split_prefix(t, prefix_ratio) for t in texts]
    prefixes, references = [p for p, _ in split], [r for _, r in split]
    reasons = {i: r for i, r in enumerate(skip_reason(t, prefix_ratio) for t in texts) if r is not None}
    todo = [i for i in range(len(texts)) if i not in reasons]
    prompt_ids = dict(zip(todo, (e.ids for e in loaded.tokenizer.encode_batch([prefixes[i] for i in todo]))))
    for i in todo:
        if not prompt_ids[i]:
            reasons[i] = "samia: the prefix encodes to no tokens with this model's tokenizer"
    todo = [i for i in todo if i not in reasons]
    budgets = [0] * len(texts)
    for i, b in zip(todo, _budgets(loaded, [prefixes[i] for i in todo], [references[i] for i in todo],
                                   max_new_tokens)):
        budgets[i] = b
    bos = loaded.bos_token_id if loaded.add_bos else None
    fitted = {i: _fit(list(prompt_ids[i]), loaded.max_length - budgets[i], bos) for i in todo}
    todo.sort(key=lambda i: (budgets[i], len(fitted[i]), i))
    samples: list[list[str]] = [[] for _ in texts]
    n_tokens: list[list[int]] = [[] for _ in texts]
    per_call = min(batch_size, len(todo)) * n_samples
    pad = loaded.pad_token_id if loaded.pad_token_id is not None else (loaded.eos_token_id or 0)
    eos = -1 if loaded.eos_token_id is None else loaded.eos_token_id
    graphdef, state = nnx.split(loaded.model)
    base_key = jax.random.key(seed)
    bar = tqdm(total=len(todo), desc="samia", unit="text", disable=not progress)
    for start in range(0, len(todo), batch_size):
        chunk = todo[start:start + batch_size]
        rows = [(i, j) for i in chunk for j in range(n_samples)]
        rows += [rows[0]] * (per_call - len(rows))  # filler rows (budget 0) keep one compiled batch size
        limit = np.array([budgets[i] for i, _ in rows], np.int32)
        limit[len(chunk) * n_samples:] = 0
        P = -(-max(len(fitted[i]) for i in chunk) // PROMPT_MULTIPLE) * PROMPT_MULTIPLE
        N = -(-int(limit.max()) // NEW_TOKENS_MULTIPLE) * NEW_TOKENS_MULTIPLE
        ids, _ = pad_ids([fitted[i] for i, _ in rows], len(rows), P, pad, side="left")
        n_pad = np.array([P - len(fitted[i]) for i, _ in rows], np.int32)
        tokens = np.asarray(_sample_loop(
            graphdef, state, jnp.asarray(ids, jnp.int32), jnp.asarray(n_pad), jnp.asarray(limit), base_key,
            jnp.asarray([text_hash(texts[i]) for i, _ in rows], jnp.uint32),
            jnp.asarray([j for _, j in rows], jnp.int32), jnp.float32(temperature or 1.0),
            jnp.int32(top_k if top_k is not None else 2**31 - 1), jnp.int32(eos), jnp.int32(pad),
            jnp.int32(loaded.tokenizer.get_vocab_size()), max_new_tokens=N, greedy=temperature == 0,
            filtered=top_k is not None))
        outs = []
        for r in range(len(chunk) * n_samples):
            row = [int(t) for t in tokens[r, :limit[r]]]
            outs.append(row[:row.index(eos)] if eos in row else row)
        for (i, _), out, text in zip(rows, outs, loaded.tokenizer.decode_batch(outs, skip_special_tokens=True)):
            samples[i].append(text)
            n_tokens[i].append(len(out))
        bar.update(len(chunk))
    bar.close()
    return SampleSet(prefixes, references, samples, n_tokens, budgets, dict(sorted(reasons.items())))


def samia_scores(loaded, texts: Sequence[str], *, n_samples: int = 10, prefix_ratio: float = 0.5,
                 max_new_tokens: int | None = None, temperature: float = 1.0, top_k: int | None = 50, seed: int = 0,
                 batch_size: int = 8, progress: bool = True) -> tuple[dict[str, np.ndarray], dict[int, str]]:
    """({"samia": float64 [N], "samia_zlib": float64 [N]}, {text index: why its scores are NaN}): SaMIA and
    SaMIA*zlib of each text from the same samples (``sample_continuations``; higher = member)."""
    drawn = sample_continuations(loaded, texts, n_samples=n_samples, prefix_ratio=prefix_ratio,
                                 max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                                 batch_size=batch_size, progress=progress)
    scores = {"samia": samia_from_samples(drawn.samples, drawn.references),
              "samia_zlib": samia_from_samples(drawn.samples, drawn.references, zlib=True)}
    return scores, drawn.reasons
