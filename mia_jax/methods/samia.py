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
  (and a leading BOS), as ``mia_jax.engine.generate`` does.
- Their sampling is unseeded; here sample j of a text is drawn with the key
  ``fold_in(fold_in(key(seed), sha256(text)[:4]), j)`` (``generate.row_keys``), one key per row, folded with the
  step each step (``generate_ids(keys=...)``): a text's
  samples depend only on (seed, text, j), not on its position or on the other texts in its batch (as the
  neighbour generators do; and the runner's ``compute`` seam only hands a batch its texts).

Paper vs code: the paper's SPL is the same ROUGE-N recall of the reference averaged over the samples (n = 1 in
the released evaluation, as here), and SaMIA*zlib weights it by the candidate's zlib information content.

Cost: ``n_samples`` continuations of ~L tokens per text (L = the reference's token count, capped), i.e. one
prefill and ~n_samples x L single-token decode steps per text, batched as ``batch_size`` texts x ``n_samples`` rows per
jit-compiled sampling loop (``mia_jax.engine.generate.sample_completions``: ``generate_ids`` with one key and one token
budget per row).
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Sequence
from zlib import compress

import numpy as np

from mia_jax.engine import generate
from mia_jax.errors import UserError

DEFAULT_MAX_NEW_TOKENS = 256  # the default per-text budget (the reference's token count) is capped here
METHODS = ("samia", "samia_zlib")


def split_prefix(text: str, ratio: float = 0.5) -> tuple[str, str]:
    """(prefix, reference): the first ``int(n_words * ratio)`` whitespace words and the rest, each joined by
    single spaces (the authors' ``get_prefix``). ``ratio`` must be in (0, 1)."""
    if not 0 < ratio < 1:
        raise UserError(f"the SaMIA prefix ratio must be between 0 and 1 (exclusive), got {ratio}")
    words = text.split()
    k = int(len(words) * ratio)
    return " ".join(words[:k]), " ".join(words[k:])


def skip_reason(text: str, ratio: float = 0.5, label: str = "samia") -> str | None:
    """Why a text gets no SaMIA score (no words, or too few for a one-word prefix), or None, said by ``label`` (the
    method). (A prefix that encodes to no tokens with the model's tokenizer is the only other reason
    ``sample_continuations`` gives.)"""
    prefix, _ = split_prefix(text, ratio)
    n = len(text.split())
    if not n:
        return f"{label}: the text has no words"
    if not prefix:
        return (f"{label}: the text has {n} word{'s' * (n != 1)}, too few for a prefix of {ratio:g} of its words "
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
                         top_p: float | None = None, seed: int = 0, batch_size: int = 8, progress: bool = True,
                         label: str = "samia") -> SampleSet:
    """``n_samples`` continuations of each text's prefix (``split_prefix``) from the ``LoadedModel``, each at most
    its text's budget (see the module docstring), seeded per (seed, text, sample), filtered by ``top_k`` / ``top_p``
    (``nucleus.sample_logits``). ``batch_size`` texts (x ``n_samples`` rows) share one sampling loop; texts are
    grouped by length (the result does not depend on it). ``label``: the method the skip reasons name."""
    if isinstance(texts, str):
        raise UserError("texts must be a list of strings, not one string")
    if not isinstance(n_samples, int) or n_samples < 1:
        raise UserError(f"{label} needs at least 1 sample per text, got n_samples={n_samples!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch_size must be a positive integer, got {batch_size!r}")
    generate.check_sampling(1 if max_new_tokens is None else max_new_tokens, temperature, top_k, top_p)
    if max_new_tokens is not None and max_new_tokens >= loaded.max_length:
        raise UserError(f"{max_new_tokens} new tokens do not fit the model's context of {loaded.max_length} tokens "
                        "together with a prefix; ask for fewer")
    split = [split_prefix(t, prefix_ratio) for t in texts]
    prefixes, references = [p for p, _ in split], [r for _, r in split]
    reasons = {i: r for i, r in enumerate(skip_reason(t, prefix_ratio, label) for t in texts) if r is not None}
    todo = [i for i in range(len(texts)) if i not in reasons]
    prompt_ids = dict(zip(todo, (e.ids for e in loaded.tokenizer.encode_batch([prefixes[i] for i in todo]))))
    for i in todo:
        if not prompt_ids[i]:
            reasons[i] = f"{label}: the prefix encodes to no tokens with this model's tokenizer"
    todo = [i for i in todo if i not in reasons]
    budgets = [0] * len(texts)
    for i, b in zip(todo, _budgets(loaded, [prefixes[i] for i in todo], [references[i] for i in todo],
                                   max_new_tokens)):
        budgets[i] = b
    samples: list[list[str]] = [[] for _ in texts]
    n_tokens: list[list[int]] = [[] for _ in texts]
    drawn = generate.sample_completions(loaded, [prompt_ids[i] for i in todo], [budgets[i] for i in todo],
                                        [texts[i] for i in todo], n_samples=n_samples, temperature=temperature,
                                        top_k=top_k, top_p=top_p, seed=seed, batch_size=batch_size, progress=progress,
                                        desc=label)
    for i, text_samples, text_tokens in zip(todo, *drawn):
        samples[i], n_tokens[i] = text_samples, text_tokens
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
