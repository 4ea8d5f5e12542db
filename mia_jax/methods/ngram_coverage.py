"""The n-gram coverage attack (Hallinan et al. 2025, *The Surprising Effectiveness of Membership Inference with
Simple N-Gram Coverage*, COLM 2025, arXiv 2508.09603): a black-box detector that only reads generated text.

Each text is split into a prefix and its true suffix (``samia.split_prefix``: the first ``floor(n_words *
prefix_ratio)`` whitespace words and the rest). ``n_samples`` continuations c_1..c_m of the prefix are sampled from
the model and each is compared with the suffix r by its n-gram coverage:

    cov_n(c, r) = |{ j : c_j lies in some n-gram c_s..c_{s+n-1} that occurs contiguously in r }| / |c|
    ngram_coverage(x) = max_j cov_n(c_j, x_suffix)

over the words of c and r (``words``: NLTK's casual tokenizer, as the authors), n = ``min_n`` (default 3), 0 for a
candidate with fewer than n words. The fraction of a continuation that repeats the suffix verbatim in runs of n or
more words is high when the model reproduces its training text, so higher = member. A text with no prefix word or
no suffix (fewer than ``ceil(1 / prefix_ratio)`` words) is NaN with a reason.

Where this follows the authors' code (shallinan1/NGramCoverageAttack, ``src/attacks/ngram_coverage_attack``):

- the coverage is theirs with the generation as the target document and the true suffix (``snippet_no_prompt``)
  as the only source document (``compute_ngram_coverage.py``, ``onedoc``): their sliding window (``find_exact_match``)
  records, for every end position, the longest matching span of at least ``min_ngram`` words, and the share of the
  generation's words inside a recorded span is ``coverages_gen_length`` (``compute_creativity_index.py``); that union
  of spans is the union of the matching n-grams computed here. ``min_n`` = 3 is their ``--min_ngram`` of the
  published pipeline; words come from ``nltk.tokenize.casual.casual_tokenize``; a generation shorter than n words
  has coverage 0 (their ``too_short``);
- the aggregate is the maximum over the samples (``Max_Coverage_Gen_Length`` of ``compute_roc_metrics.py``);
- sampling at temperature 1 with nucleus top-p 0.95 (their ``generate.py`` defaults), each continuation at most as
  many tokens as the suffix has (their ``--max_length_to_sequence_length``; capped as ``mia_jax.methods.samia`` does),
  20 samples per text (their pipeline example's ``--num_sequences 20``).

Where it differs:

- Matching is on word sequences: an n-gram matches when its words occur consecutively among the suffix's words.
  Theirs detokenizes the span (Moses) and tests ``span_text in suffix_text`` on the characters, so a span may also
  match inside a longer word at its ends ("the cat" in "the cathedral"); and theirs transliterates both texts to
  ASCII first (``unidecode``), which is not done here.
- The prefix is the first half of the words (SaMIA's ``split_prefix``, so that both methods can read the same samples);
  their default prompt is the text's first sentence(s) and their word mode (``--num_proportion_from_end p``)
  removes ``max(1, min(int(l p), l - 1))`` words from the end (a prefix of ``ceil(l / 2)`` words at p = 0.5, one
  more than here for an odd word count ``l``). No task prompt template is added around the prefix.
- Their sampling is seeded per request (vLLM / the API); here sample j of a text is drawn with the key of
  (seed, text, j) (``generate.row_keys``), as SaMIA's.
- Their other aggregates (min / median / mean), the coverage over the reference's length and the creativity index
  (coverage summed over n = 2..12) are not registered methods.

The defaults above are those of the released code and its README; the paper's per-benchmark settings (its prefix
split, sample counts and n for WikiMIA) were not checked against its text here.

Cost: as SaMIA's (``mia_jax.methods.samia``): one prefill and about ``n_samples`` x L single-token decode steps per
text, L the suffix's token count (capped); the coverage is a host computation over words. When ``samia`` is requested
with the same sampling options, both read one set of samples (``methods.sampling``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mia_jax.errors import UserError

METHODS = ("ngram_coverage",)
DEFAULT_MIN_N = 3  # the authors' --min_ngram
DEFAULT_SAMPLING = {"n_samples": 20, "prefix_ratio": 0.5, "max_new_tokens": None, "temperature": 1.0, "top_k": None,
                    "top_p": 0.95, "seed": 0}


def words(text: str) -> list[str]:
    """The words of ``text`` as the authors split them: ``nltk.tokenize.casual.casual_tokenize`` (punctuation and
    emoticons apart, case kept)."""
    from nltk.tokenize.casual import casual_tokenize  # ~100 ms: only when the method runs

    return casual_tokenize(text)


def check_min_n(min_n) -> int:
    """``min_n`` if it is an integer >= 1, else a UserError."""
    if isinstance(min_n, bool) or not isinstance(min_n, (int, np.integer)) or min_n < 1:
        raise UserError(f"the n-gram coverage's minimum n-gram length must be an integer >= 1, got {min_n!r}")
    return int(min_n)


def coverage(candidate: Sequence[str], reference: Sequence[str], min_n: int = DEFAULT_MIN_N) -> float:
    """cov_n(c, r): the share of the candidate's words (a word list) that lie in an n-gram (n = ``min_n``) of the
    candidate occurring as consecutive words of the reference (a word list); 0 when the candidate has fewer than n
    words (the authors' ``coverages_gen_length``, see the module docstring)."""
    n = check_min_n(min_n)
    c, r = list(candidate), list(reference)
    if len(c) < n:
        return 0.0
    grams = {tuple(r[s:s + n]) for s in range(len(r) - n + 1)}
    covered = np.zeros(len(c), bool)
    for s in range(len(c) - n + 1):
        if tuple(c[s:s + n]) in grams:
            covered[s:s + n] = True
    return float(covered.mean())


def ngram_coverage_from_samples(samples: Sequence[Sequence[str]], references: Sequence[str], *,
                                min_n: int = DEFAULT_MIN_N) -> np.ndarray:
    """float64 [N]: per text the maximum over its sampled continuations (strings) of ``coverage`` against its
    reference suffix (a string), both split by ``words``; NaN for a text with no sample."""
    if len(samples) != len(references):
        raise ValueError(f"{len(samples)} sample lists for {len(references)} references")
    n = check_min_n(min_n)
    out = np.full(len(references), np.nan)
    for i, (cands, ref) in enumerate(zip(samples, references)):
        if len(cands):
            ref_words = words(ref)
            out[i] = max(coverage(words(c), ref_words, n) for c in cands)
    return out
