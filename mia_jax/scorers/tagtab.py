"""Tag&Tab (Antebi et al. 2025, arXiv 2501.08454, *Tag&Tab: Pretraining Data Detection in Large Language Models
Using Keyword-Based Membership Inference Attack*): the mean log-likelihood of a text's keywords only, one forward.

Tag (on the host, from the text): the text is cut into sentences; in each sentence of ``MIN_WORDS``..``MAX_WORDS``
whitespace words, the words are normalised (lower case, ASCII punctuation and whitespace removed) and the K distinct
words of lowest "entropy" e(w) = -p(w) log2 p(w) are its keywords, p(w) the word's frequency in English from the
``wordfreq`` library (p = 0, a word it does not know: e = 0, taken first). -p log p increases with p below 1/e, so
these are the sentence's rarest words. Tab (on the device): with l_i the log-probability of predicted token i and
W the tokens overlapping a keyword's characters (the tokenizer's character offsets),

    score = (1 / |W|) * sum_{i in W} l_i                   (higher = more likely a member)

Libraries (both from the package registry, offline: their data ship inside the wheels): ``wordfreq==3.1.1`` (the
word frequencies, as the authors' code) and ``pysbd==0.3.4`` (rule-based sentence boundaries with character spans).

Where this follows the authors' code (github.com/sagivantebi/Tag-Tab, ``src/helpers.py``
``create_line_to_top_words_map`` / ``bottom_k_entropy_words``, ``src/attacks.py`` ``run_all_attacks``): the
sentence filter of 7..40 words (``testbed.py``'s defaults), the normalisation, the wordfreq entropy and its order
(unknown words first), K words per sentence pooled over the sentences, all the tokens of each keyword ("AT"; not only
its first token, "FT"), the plain mean of their log-probabilities. K defaults to 4, the authors' recommended K (their
README: "we use K=4 as the default"; their ``tag_tab_AT_k=K`` keeps the K lowest-entropy words of each sentence).

Where it differs:

- Sentences come from pysbd, not spaCy's ``en_core_web_sm`` parser (a trained pipeline that the package registry
  does not carry); spaCy's named entities are not added. In the authors' code they hardly matter: the union of the
  K rarest words and the entities is ranked again by the same entropy and cut to K - 1 words, so an entity enters
  only where a sentence repeats one of its rarest words.
- A keyword's tokens are found at its own occurrence in its sentence through the tokenizer's character offsets; the
  authors search the normalised word in the whole text's concatenated normalised tokens and take the first match
  (a word inside an earlier word, "art" in "start", lands there) and count a token once per (sentence, keyword),
  here once. Their log-probabilities ``all_prob`` index ``input_ids[1:]`` against ``tokenizer.tokenize(text)``
  (right for tokenizers that add BOS, one token off for those that do not); here each token's own prediction.
- Ties in entropy are broken by the word's first position in its sentence (the authors': a Python set's order).
- A text none of whose sentences has 7..40 words has no keyword in the authors' code (no score: their CSV cell is
  empty); here such a text is taken as one sentence (its K rarest words), so every text with a word has a score.
  A text with no word, or whose keyword tokens are all unscored (its first token, cut by the context), scores NaN.
- The authors' evaluation flips a method whose AUROC is below 0.5 (``get_metrics``); here the orientation is fixed.

The authors' code cannot run here: it needs spaCy's ``en_core_web_sm`` and the Hugging Face hub (``datasets``,
``login``), and ``attacks.py`` uses ``re`` / ``string`` without importing them; the tests compare with a float64
reference of the formula above and a hand-checked keyword choice instead.
"""
from __future__ import annotations

import math
import re
import string
from functools import lru_cache
from typing import Any, Sequence

import jax
import numpy as np
from jax.typing import ArrayLike

from mia_jax.errors import UserError
from mia_jax.scorers.base import RESOURCES, Resource, register
from mia_jax.scorers.reduce import masked_mean

RESOURCE = "tag_tab_keywords"
DEFAULT_K = 4  # keywords per sentence (the authors' README)
MIN_WORDS, MAX_WORDS = 7, 40  # the sentences kept (the authors' --min_len_line_generate / --max_len_line_generate)
_PUNCTUATION = str.maketrans("", "", string.punctuation)


@register("tag_tab", resources={RESOURCE: "keywords"})
def tag_tab(logprob: ArrayLike, mask: ArrayLike, *, keywords: ArrayLike) -> jax.Array:
    """Tag&Tab: mean log-likelihood of the tokens of each sentence's K rarest words (--tag-tab-k; Antebi et al. 2025).

    score = (1/|W|) sum_{i in W} l_i, W the scored tokens (``mask``) that ``keywords`` marks; NaN for a row
    without one.

    Args:
        logprob: float [..., T] token log-probabilities log p(x_i | x_<i) (``TokenStats.logprob``).
        mask: bool [..., T] the scored tokens (anything outside them is ignored).
        keywords: bool (or int) [..., T], the shape of ``logprob``: the keywords' tokens (``keyword_masks``).

    Returns:
        float [...] one score per row (float32 for float32 or bfloat16 statistics), higher = more likely a
        member; NaN for a row without a scored keyword token.

    >>> import jax.numpy as jnp
    >>> lp = jnp.array([[-1.0, -4.0, -2.0, -8.0]])
    >>> kw = jnp.array([[False, True, False, True]])
    >>> print(tag_tab(lp, jnp.array([[1, 1, 1, 0]], bool), keywords=kw))  # token 3 is not scored
    [-4.]
    """
    return masked_mean(logprob, mask & keywords.astype(bool))


def normalize(word: str) -> str:
    """A word as the authors compare it: lower case, ASCII punctuation and whitespace removed.

    Args:
        word: one word.

    Returns:
        The normalised word (may be empty).
    """
    return re.sub(r"\s+", "", word.lower().translate(_PUNCTUATION))


@lru_cache(maxsize=1 << 16)
def entropy(word: str) -> float:
    """-p log2 p of a normalised word, p its English frequency (``wordfreq.word_frequency``); 0 when unknown.

    Args:
        word: one normalised word (``normalize``).

    Returns:
        The word's entropy term in bits.
    """
    import wordfreq

    p = wordfreq.word_frequency(word, "en")
    return -p * math.log2(p) if p > 0 else 0.0


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False, char_span=True)


def _sentences(text: str) -> list[tuple[int, int]]:
    """The character spans of the text's sentences of ``MIN_WORDS``..``MAX_WORDS`` words (pysbd); the whole text
    when there is none."""
    spans = [(s.start, s.end) for s in _segmenter().segment(text)] if text.strip() else []
    kept = [(a, b) for a, b in spans if MIN_WORDS <= len(text[a:b].split()) <= MAX_WORDS]
    return kept or [(0, len(text))]


def keyword_spans(text: str, k: int = DEFAULT_K) -> list[tuple[int, int, str]]:
    """(start, end, word) of every keyword of ``text``: in each sentence (``_sentences``), the ``k`` distinct
    normalised words of lowest ``entropy`` (ties: the earlier first), at their first occurrence in the sentence; the
    span runs from the word's first to its last character kept by ``normalize``.

    Args:
        text: one text.
        k: the keywords per sentence.

    Returns:
        (start, end, word) per keyword, in text order: character offsets into ``text``, the normalised word.

    >>> [w for _, _, w in keyword_spans("The quick brown fox jumps over the lazy dog.", 2)]
    ['jumps', 'lazy']
    """
    out = []
    for a, b in _sentences(text):
        first: dict[str, tuple[int, int]] = {}
        for m in re.finditer(r"\S+", text[a:b]):
            word = normalize(m.group())
            if word and word not in first:
                kept = [j for j, c in enumerate(m.group()) if normalize(c)]
                first[word] = (a + m.start() + kept[0], a + m.start() + kept[-1] + 1)
        ranked = sorted(first, key=lambda w: (entropy(w), first[w][0]))[:k]
        out.extend((*first[w], w) for w in sorted(ranked, key=lambda w: first[w][0]))
    return out


def keyword_tokens(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int, Any]]) -> np.ndarray:
    """bool [n]: the tokens (character ``offsets``, a special token's (0, 0) never) overlapping a keyword span.

    Args:
        offsets: (start, end) characters of each of a text's n tokens (the tokenizer's offsets).
        spans: the keywords' (start, end, word) (``keyword_spans``).

    Returns:
        bool ``np.ndarray`` [n] the keywords' tokens.
    """
    out = np.zeros(len(offsets), bool)
    for j, (s, e) in enumerate(offsets):
        out[j] = e > s and any(s < end and e > start for start, end, _ in spans)
    return out


def check_k(value) -> int:
    """K, the keywords per sentence: an integer >= 1 (UserError otherwise).

    Args:
        value: the K given (a Python or NumPy integer).

    Returns:
        K as an int.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UserError(f"tag_tab's K (keywords per sentence, --tag-tab-k) must be an integer >= 1, got {value!r}")
    return int(value)


def keyword_masks(k, tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Per text, bool over its tokens as ``tokenizer`` (a ``tokenizers.Tokenizer``) encodes it by default, special
    tokens included: the tokens of its keywords (``keyword_spans`` with ``k`` per sentence). The statistics of a
    text's predictions are of its tokens 1.., so ``mask[1:]`` is ``tag_tab``'s ``keywords`` row.

    Args:
        k: the keywords per sentence (``check_k``).
        tokenizer: a ``tokenizers.Tokenizer``.
        texts: the texts.

    Returns:
        Per text, bool ``np.ndarray`` [n] over its n tokens.
    """
    k = check_k(k)
    return [keyword_tokens(enc.offsets, keyword_spans(text, k))
            for text, enc in zip(texts, tokenizer.encode_batch(list(texts)))]


def _to_array(value) -> np.ndarray:
    """The keyword mask as given to ``device_scores`` / ``score_batch``: bool, the shape of the statistics."""
    if not isinstance(value, (np.ndarray, jax.Array)) or np.asarray(value).dtype.kind not in "bi":
        raise UserError(f"{RESOURCE} is the bool keyword mask of the scored tokens, the statistics' shape "
                        "(scorers.tagtab.keyword_masks(K, tokenizer, texts), each mask[1:]); the runner makes it "
                        f"from --tag-tab-k, got {type(value).__name__}")
    return np.asarray(value).astype(bool)


RESOURCES[RESOURCE] = Resource(RESOURCE, "give K, the keywords per sentence, with --tag-tab-k K (default 4)",
                               _to_array, default=DEFAULT_K, per_token=keyword_masks)
