"""EM-MIA (Kim et al., EACL 2026, "Detecting Training Data of Large Language Models via Expectation Maximization"):
membership scores of the texts and prefix scores of candidate prefixes refined in turn over the whole dataset.

Every evaluated text is also a candidate prefix. With R[p, x] = LL(x | p) / LL(x), ReCaLL's ratio of a text x read
after the prefix p (``methods.recall.recall``; LL the mean token log-likelihood), the iterations are, from the
initial membership scores f_0 = LL(x) (the unconditional mean log-likelihood, the authors' ``Loss`` initialisation):

    prefix score      r_t(p) = AUROC over x of R[p, x] against the pseudo-labels 1[f_t(x) > median_x f_t(x)]
    membership score  f_{t+1}(x) = -r_t(x)                           (NaN -> 0, as the authors)

for ``iterations`` = 10 rounds (the authors' ``--max_iter``); the score is f_10. A good ReCaLL prefix is a
non-member (conditioning on it lowers members' likelihood most), so the better a text separates the others as a
prefix, the less likely it is a member: higher = member. The model's work is the matrix of conditional
log-likelihoods, one pass through the runner (batched, packed and resumable like every pass: pass kind
``em_mia_prefixes``); the iterations are a NumPy function of that matrix and the main pass's LL(x), run without the
model (:func:`em_iterations`).

This follows the authors' code (gyuwankim/em-mia: ``run.py --method ReCaLL-all`` makes the matrix, ``emmia.py`` with
its defaults ``--membership_score NegPref --prefix_score AUC-ROC --max_iter 10`` iterates; AUROC by scikit-learn's
``roc_curve`` + ``auc``, the same as ``metrics.auroc``) and differs where said:

- Candidate prefixes: the authors read every text after every text (N^2 forwards, the text itself as its own prefix
  included). Here the texts are split (seeded: ``seed``) into ceil(N / n_prefixes) blocks of near-equal size, at
  most ``n_prefixes`` texts each, and EM runs within each block, every text of the block a candidate prefix of every
  text of the block (itself included): N * n_prefixes forwards at most. With ``n_prefixes`` >= N (e.g. WikiMIA-32's
  776 texts and ``--em-mia-prefixes 776``) it is the authors' computation exactly. Scores of different blocks are
  on one scale (minus an AUROC) but each block's pseudo-labels come from its own median.
- Initialisation: the unconditional mean log-likelihood (the authors' ``Loss``; their script also runs Ref, Zlib,
  Min-K% and Min-K%++ initialisations and reports each).
- Only the authors' default rules: their other prefix scores (Kendall-Tau, RankDist) and membership updates
  (TopPref, which re-reads every text after the top prefixes joined; Avg, a baseline) are not implemented.
- Reading a text after a prefix is ReCaLL's pass (``methods.recall``): tokenized apart and joined, the text's BOS
  dropped after the prefix, every token of the text scored, the prefix cut from its start when the pair exceeds
  the context (the authors' ``modeling_utils.infer`` joins the left-padded prefix and the text, BOS included, scores
  the text's tokens from its second on, and does not truncate). A text that fills the context
  alone has no conditional score: its R entries are NaN and left out of the AUROCs (the authors set a NaN ReCaLL
  score to 0); its own score, which is its prefix score, stands. A text after which no text of its block could be
  read has no prefix score: 0 in the iterations (as the authors' NaN -> 0), NaN with the reason in the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mia_jax.engine import passes
from mia_jax.errors import UserError
from mia_jax.evaluation.metrics import auroc, scores_by_method
from mia_jax.scorers.base import register_multi_pass
from mia_jax.methods.recall import no_room_for_prefix, recall

PASS_KIND = "em_mia_prefixes"
DEFAULT_PREFIXES = 16  # candidate prefixes per text: 16 prefixed reads per text (the authors: every text, N)
DEFAULT_ITERATIONS = 10  # the authors' --max_iter
MIN_PREFIXES = 4  # a block needs texts on both sides of its median


def check_options(n_prefixes: int, iterations: int, seed: int) -> dict:
    """The options as a dict, or a UserError naming the bad one."""
    if int(n_prefixes) < MIN_PREFIXES:
        raise UserError(f"--em-mia-prefixes must be at least {MIN_PREFIXES}, got {n_prefixes}")
    if int(iterations) < 1:
        raise UserError(f"--em-mia-iterations must be at least 1, got {iterations}")
    if int(seed) < 0:
        raise UserError(f"--em-mia-seed must be >= 0, got {seed}")
    return {"n_prefixes": int(n_prefixes), "iterations": int(iterations), "seed": int(seed)}


def blocks(n: int, n_prefixes: int, seed: int = 0) -> list[np.ndarray]:
    """The text indices 0..n-1 split into ceil(n / n_prefixes) blocks of near-equal size (a seeded permutation,
    each block sorted); one block of every text when ``n_prefixes`` >= n."""
    if n <= n_prefixes:
        return [np.arange(n)]
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(b) for b in np.array_split(order, -(-n // n_prefixes))]


def prefix_scores(ratio: np.ndarray, membership: np.ndarray) -> np.ndarray:
    """r(p) = AUROC over texts x of ``ratio[p, x]`` against the pseudo-labels 1[membership(x) > median]; float64
    [P]. Non-finite entries of a row are left out; NaN where the pseudo-labels (of the kept entries) have one
    class."""
    ratio = np.asarray(ratio, np.float64)
    membership = np.asarray(membership, np.float64)
    pseudo = membership > np.median(membership)
    out = np.full(ratio.shape[0], np.nan)
    for p, row in enumerate(ratio):
        ok = np.isfinite(row)
        if 0 < pseudo[ok].sum() < ok.sum():
            out[p] = auroc(pseudo[ok].astype(int), row[ok])
    return out


def em_iterations(ratio: np.ndarray, init: np.ndarray, iterations: int = DEFAULT_ITERATIONS) -> np.ndarray:
    """EM-MIA's membership scores after ``iterations`` rounds: f_0 = ``init`` (NaN -> 0), r_t = prefix_scores(R,
    f_t), f_{t+1} = -r_t (NaN -> 0). ``ratio`` [P, N] is R[p, x] = LL(x | p) / LL(x) with the prefixes the same
    texts as the columns (P = N, prefix p is text p). Returns float64 [N]."""
    ratio = np.asarray(ratio, np.float64)
    if ratio.ndim != 2 or ratio.shape[0] != ratio.shape[1]:
        raise ValueError(f"EM-MIA needs a square [prefix, text] matrix (every text a prefix), got {ratio.shape}")
    f = np.nan_to_num(np.asarray(init, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    for _ in range(int(iterations)):
        f = np.nan_to_num(-prefix_scores(ratio, f), nan=0.0)
    return f


@dataclass
class PrefixMatrix:
    """The folded ``em_mia_prefixes`` pass: per block, its text indices and ``conditional[b][p, x]`` = LL(text x |
    text p) (mean token log-likelihood, NaN where there is none), and the number of EM ``iterations``."""

    blocks: list[np.ndarray]
    conditional: list[np.ndarray]
    iterations: int


@passes.register_pass(PASS_KIND)
def prefix_pass(name, loaded, texts, *, resume, method="loss", em_mia=None, **_) -> passes.Pass:
    """The target model on every text read after every text of its block (itself included), its tokens only
    scored; folded into a :class:`PrefixMatrix`."""
    opts = check_options(**{"n_prefixes": DEFAULT_PREFIXES, "iterations": DEFAULT_ITERATIONS, "seed": 0,
                            **(em_mia or {})})
    parts = blocks(len(texts), opts["n_prefixes"], opts["seed"])
    pairs = [(int(x), int(p)) for b in parts for x in b for p in b]  # text x after prefix p
    made = passes.same_texts(loaded, [texts[x] for x, _ in pairs], name, resume, method,
                             prefixes=[texts[p] for _, p in pairs])

    def fold(recs):
        values = scores_by_method(recs, [method])[method] if recs else np.zeros(0)
        no_room_for_prefix(name, recs, values, {})
        ends = np.cumsum([b.size * b.size for b in parts])[:-1]
        conditional = [m.reshape(b.size, b.size).T for b, m in zip(parts, np.split(values, ends))]  # [p, x]
        return PrefixMatrix(parts, conditional, opts["iterations"]), {}, {}

    made.fold = fold
    return made


@register_multi_pass("em_mia", pass_kind=PASS_KIND)
def em_mia(loss: np.ndarray, matrix: PrefixMatrix, texts: Sequence[str]):
    """EM-MIA: -AUROC of the text as a ReCaLL prefix against the pseudo-labels of the others, iterated (Kim et al.)."""
    loss = np.asarray(loss, np.float64)
    scores = np.full(loss.shape, np.nan)
    reasons = {}
    for b, cond in zip(matrix.blocks, matrix.conditional):
        ratio, _ = recall(loss[b][None, :], cond, texts)
        scores[b] = em_iterations(ratio, loss[b], matrix.iterations)
        for i in b[~np.isfinite(ratio).any(axis=1)]:  # as a prefix it conditioned no text: no prefix score
            reasons[int(i)] = ("em_mia: no text of its block could be read after it (each fills the model's context "
                               "alone)")
    for i in np.flatnonzero(~np.isfinite(loss)):
        reasons[int(i)] = "em_mia: the text has no unconditional score"
    scores[list(reasons)] = np.nan
    return scores, reasons
