"""Dataset inference (Maini et al., NeurIPS 2024, "LLM Dataset Inference: Did you train on my dataset?"): was this
*set* of texts trained on? Many weak per-text membership scores are combined by a linear model, and a t-test on
held-out texts answers with a p-value.

Given ``suspect`` [n_s, F] and ``validation`` [n_v, F] (rows: texts; columns: per-text MIA scores of the same
methods under the same model, each oriented higher = member; validation: texts *of the same distribution* known not
to be trained on), with a seeded shuffle each set is split in halves A (training) and B (held out), and

    x -> z = (clip(x, lo, hi) - mu) / sd          lo, hi: the 2.5% / 97.5% quantiles, mu, sd: mean and standard
                                                   deviation of each feature over A_s + A_v (after clipping)
    s(x) = w . z + b                               L2-regularised logistic regression (C = 1) of 1 = suspect,
                                                   0 = validation on A_s + A_v
    t = (mean s(B_s) - mean s(B_v)) / sqrt(var s(B_s) / |B_s| + var s(B_v) / |B_v|)
    p = P(T_nu > t)                                Welch's one-sided t-test (Welch-Satterthwaite nu), H1: the held-out
                                                   suspect texts score higher than the held-out validation texts.

Where this follows the authors' code (pratyushmaini/llm_dataset_inference, ``linear_di.py``; features from
``metrics.py``): 2.5% of each tail clipped per feature (their ``outliers="clip"``), features standardised
(``normalize``), a linear model on standardised features trained on one part of each set, a one-sided t-test on the
model's outputs for the other parts; their features are perplexity, Min-K% / Max-K% at k = 0.05 ... 0.6, the zlib
ratio, perturbation and reference-model ratios (``DEFAULT_METHODS`` / ``DEFAULT_K`` are their single-pass subset
plus Min-K%++, entropy and rank; ``lowercase`` / ``neighbor`` / ``ref`` are the two-pass analogues and can be added).
Where it differs:

- clipping bounds and the standardisation are fitted on the training halves only and are one map applied to every
  text (theirs: clip each set at its own quantiles and standardise with the whole suspect set's mean and standard
  deviation, held-out texts included). So a held-out score is a fixed function of its text given the training
  halves, which the t-test assumes; per-set clipping shifts the two held-out groups differently.
- scikit-learn's L2-regularised logistic regression (``C``, default 1, lbfgs to convergence) instead of an
  unregularised ``nn.Linear`` trained by full-batch Adam (lr 0.01, 1000 epochs) from a random initialisation.
- scores oriented higher = member and suspect labelled 1 (theirs: suspect labelled 0, ``alternative="less"``; the
  same test); Welch's test (``equal_var=False``) instead of Student's.
- one split per seed and one p-value on the whole held-out halves (theirs: ``--num_random`` splits written one by
  one, and p-values on growing prefixes of the held-out halves, 2 ... 1000 texts). A different ``seed`` is another
  valid test; taking the smallest p-value over seeds is not.
- a text with a non-finite score (a null in ``results.jsonl``: a skipped text or a method that could not score it)
  is dropped, counted per set and per feature; a feature with no finite score in a set is refused (theirs have
  none).

The test is valid (p-values uniform when both sets come from one distribution and neither was trained on) whatever
the features are, because the linear model never sees the held-out texts; ``tests/test_dataset_inference.py``
checks this over many random splits of synthetic and of real scores.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax.runs import files
from mia_jax.errors import UserError

MIN_PER_HALF = 10  # held-out texts per set, at least (and as many in the training halves)
CLIP = 0.025  # fraction clipped in each tail, as the authors' remove_frac = 0.05
C = 1.0  # inverse L2 strength of the logistic regression
# The authors' single-pass features (ppl, Min-K% and Max-K% at 7 k, zlib) plus the other cheap single-pass scores.
DEFAULT_METHODS = ("ppl", "loss", "zlib", "min_k", "max_k", "min_k_pp", "entropy", "rank")
DEFAULT_K = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
# second passes the command can run itself (lowercase: the text lowercased; ref: --ref-model; neighbor: perturbed
# texts from the target model); others need options of `mia-jax score`: score there, then --*-scores.
MULTI_PASS_OK = ("lowercase", "ref", "neighbor")


@dataclass
class Result:
    """The outcome of one dataset-inference test: the Welch t-test of the held-out halves (``p_value``, ``t_statistic``,
    ``df``), the counts, the linear model's weights and what was dropped."""
    p_value: float
    t_statistic: float
    df: float  # Welch-Satterthwaite degrees of freedom
    n_suspect: int  # held-out halves, tested
    n_validation: int
    n_train_suspect: int  # training halves, fitted
    n_train_validation: int
    mean_suspect: float  # the linear model's mean held-out score (log-odds of "suspect")
    mean_validation: float
    weights: dict  # feature -> weight on the standardised feature
    intercept: float
    n_dropped_suspect: int  # texts with a non-finite score, dropped before the split
    n_dropped_validation: int
    nonfinite: dict  # feature -> texts (both sets) where it is non-finite; only features with any
    seed: int
    clip: float = CLIP
    C: float = C
    n_shared_texts: int | None = None  # texts in both sets (None: not known, e.g. from score files)
    notes: list = field(default_factory=list)

    def to_markdown(self) -> str:
        """The result as a Markdown report (the test, the counts, the weights by size, the notes)."""
        order = sorted(self.weights.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
        rows = "".join(f"| {k} | {v:+.4f} |\n" for k, v in order)
        dropped = ""
        if self.n_dropped_suspect or self.n_dropped_validation:
            worst = ", ".join(f"{k} {v}" for k, v in sorted(self.nonfinite.items(), key=lambda kv: -kv[1])[:5])
            dropped = (f" Dropped for a non-finite score: {self.n_dropped_suspect} suspect and "
                       f"{self.n_dropped_validation} validation texts (by feature: {worst}).")
        notes = "".join(f"\n\n{n}" for n in self.notes)
        return (f"## Dataset inference (Maini et al. 2024)\n\n"
                f"Logistic regression on {len(self.weights)} standardised features, fitted on "
                f"{self.n_train_suspect} suspect vs {self.n_train_validation} validation texts; tested on the other "
                f"{self.n_suspect} suspect and {self.n_validation} validation texts (seed {self.seed}).{dropped}\n\n"
                f"Held-out mean score: suspect {self.mean_suspect:+.4f}, validation {self.mean_validation:+.4f}; "
                f"one-sided Welch t = {self.t_statistic:.3f} (df {self.df:.1f}), p = {self.p_value:.4g}. "
                f"A small p says the suspect set scores as more member-like than texts of its distribution that the "
                f"model did not see, provided the validation texts are such texts.{notes}\n\n"
                f"| Feature | Weight |\n|---|---:|\n{rows}")


def welch_greater(a, b) -> tuple[float, float, float]:
    """(t, p, df) of Welch's one-sided two-sample t-test, H1: mean(a) > mean(b) (scipy.stats.ttest_ind with
    ``equal_var=False, alternative="greater"``); df = (va/na + vb/nb)^2 / ((va/na)^2/(na-1) + (vb/nb)^2/(nb-1))."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    from scipy import stats  # here, as scipy.stats is slow to import (the CLI's start-up)

    res = stats.ttest_ind(a, b, equal_var=False, alternative="greater")
    return float(res.statistic), float(res.pvalue), float(res.df)


def _finite(x: np.ndarray, names: list[str], side: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``x`` whose every feature is finite, and the non-finite count of each feature."""
    bad = ~np.isfinite(x)
    dead = [n for n, col in zip(names, bad.T) if col.all()]
    if dead:
        raise UserError(f"dataset inference: feature(s) with no finite score in the {side} set: {', '.join(dead)} "
                        "(drop them from --methods)")
    return x[~bad.any(1)], bad.sum(0)


def fit_transform(train: np.ndarray, clip: float = CLIP):
    """The feature map fitted on ``train`` [n, F]: clip at the ``clip`` / ``1 - clip`` quantiles, then standardise
    (a feature constant after clipping is centred only)."""
    lo, hi = np.quantile(train, [clip, 1 - clip], axis=0)
    clipped = np.clip(train, lo, hi)
    mu, sd = clipped.mean(0), clipped.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    return lambda x: (np.clip(x, lo, hi) - mu) / sd


def dataset_inference(suspect, validation, names: Sequence[str] | None = None, *, seed: int = 0, clip: float = CLIP,
                      C: float = C, min_per_half: int = MIN_PER_HALF) -> Result:
    """Is ``suspect`` [n_s, F] more member-like than ``validation`` [n_v, F]? Per-text scores (higher = member) of
    the same F methods under the same model; ``names`` label the features (default f0, f1, ...). See the module
    docstring for the test; deterministic given ``seed``."""
    s, v = np.asarray(suspect, np.float64), np.asarray(validation, np.float64)
    if s.ndim != 2 or v.ndim != 2 or s.shape[1] != v.shape[1] or s.shape[1] == 0:
        raise UserError(f"dataset inference: suspect and validation need the same features (2-D, one column per "
                        f"method); got shapes {s.shape} and {v.shape}")
    names = list(names) if names is not None else [f"f{j}" for j in range(s.shape[1])]
    if len(names) != s.shape[1] or len(set(names)) != len(names):
        raise UserError(f"dataset inference: {s.shape[1]} features but names {names}")
    if not 0 <= clip < 0.5:
        raise UserError(f"dataset inference: clip must be in [0, 0.5), got {clip}")
    n_s0, n_v0 = len(s), len(v)
    s, bad_s = _finite(s, names, "suspect")
    v, bad_v = _finite(v, names, "validation")
    nonfinite = {n: int(a + b) for n, a, b in zip(names, bad_s, bad_v) if a + b}
    if min(len(s), len(v)) < 2 * min_per_half:
        why = f" after dropping texts with a non-finite score ({nonfinite})" if nonfinite else ""
        raise UserError(f"dataset inference needs at least {2 * min_per_half} scored texts per set (two halves of "
                        f"{min_per_half}); got {len(s)} suspect and {len(v)} validation{why}")
    rng = np.random.default_rng(seed)
    s, v = s[rng.permutation(len(s))], v[rng.permutation(len(v))]
    hs, hv = len(s) // 2, len(v) // 2
    train = np.concatenate([s[:hs], v[:hv]])
    transform = fit_transform(train, clip)
    z = transform(train)
    if not np.any(z):
        raise UserError("dataset inference: every feature is constant over the training halves; nothing to fit")
    y = np.concatenate([np.ones(hs), np.zeros(hv)])
    from sklearn.linear_model import LogisticRegression  # here: slow to import (the CLI's start-up)

    clf = LogisticRegression(C=C, max_iter=10_000).fit(z, y)
    held_s, held_v = clf.decision_function(transform(s[hs:])), clf.decision_function(transform(v[hv:]))
    if np.ptp(held_s) == 0 and np.ptp(held_v) == 0:  # the test is undefined (0 / 0)
        raise UserError("dataset inference: the linear model gives every held-out text the same score (the features "
                        "carry no variation); nothing to test")
    t, p, df = welch_greater(held_s, held_v)
    return Result(p, t, df, len(held_s), len(held_v), hs, hv, float(held_s.mean()), float(held_v.mean()),
                  {n: float(w) for n, w in zip(names, clf.coef_[0])}, float(clf.intercept_[0]),
                  n_s0 - len(s), n_v0 - len(v), nonfinite, seed, clip, C)


def results_path(path) -> Path:
    """A run folder or its ``results.jsonl``."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.jsonl"
    if not path.is_file():
        raise UserError(f"scores file not found: {path} (give a mia-jax run's results.jsonl or its folder)")
    return path


def load_features(path, methods: Sequence[str] | None = None) -> tuple[list[str], np.ndarray]:
    """(method names, [texts, methods] scores; NaN for a null score) from a mia_jax run's ``results.jsonl`` (or its
    folder): records ``{"index", "label"?, "n_tokens", "scores": {method: value or null}, ...}``, one per text in
    the order of the data. ``methods``: the columns (default: every method of the first record, in its order)."""
    path = results_path(path)
    names = list(methods) if methods else None
    rows = []
    for lineno, rec in files.read_jsonl(path):
        scores = rec.get("scores") if isinstance(rec, dict) else None
        if not isinstance(scores, dict):
            raise UserError(f"{path}: line {lineno} has no 'scores' object; is this a mia-jax results.jsonl?")
        names = names if names is not None else list(scores)
        missing = [m for m in names if m not in scores]
        if missing:
            raise UserError(f"{path}: line {lineno} has no score for {', '.join(missing)} (it has "
                            f"{', '.join(scores) or 'none'}); choose --methods among them")
        row = [scores[m] for m in names]
        if any(not (x is None or isinstance(x, (int, float))) or isinstance(x, bool) for x in row):
            raise UserError(f"{path}: line {lineno}: a score is not a number or null: {row}")
        rows.append([math.nan if x is None else float(x) for x in row])
    if not rows:
        raise UserError(f"{path}: no records")
    return names, np.array(rows, np.float64)


def run_model(path) -> dict | None:
    """What scored the run whose results are at ``path`` (its model files' SHA-256, dtype), from its config.json;
    None when it cannot be read."""
    cfg = results_path(path).parent / "config.json"
    try:
        fp = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(fp, dict) or not isinstance(fp.get("model_files"), dict):
        return None
    ref = fp.get("ref_model_files")  # by content: the same files under another path are the same model
    return {"model_sha256": sorted(fp["model_files"].values()),
            "ref_model_sha256": sorted(ref.values()) if isinstance(ref, dict) else None, "dtype": fp.get("dtype")}
