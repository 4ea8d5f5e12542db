"""Dataset inference (Maini et al., NeurIPS 2024): was this *set* of texts trained on? Many weak per-text membership
scores are aggregated by a linear model, and a t-test on held-out texts answers with a p-value.

Following the authors' code (pratyushmaini/llm_dataset_inference, ``linear_di.py``): each feature (a per-text MIA
score) is clipped at its 2.5% and 97.5% quantiles within each set (their ``outliers="clip"``), standardised with
the suspect set's mean and standard deviation (``normalize="train"``), both sets are shuffled (seeded) and split in
halves; a linear classifier is fitted on the first halves (suspect vs validation) and scores the second halves; a
one-sided Welch t-test asks whether the held-out suspect texts score higher than the held-out validation texts.
Where this differs: scikit-learn's L2-regularised logistic regression (C = 1) instead of an unregularised
``nn.Linear`` trained by Adam for 1000 epochs; scores oriented higher = member (their losses are the opposite, so
their test is ``alternative="less"``); Welch's test (``equal_var=False``) instead of Student's; one split (theirs
also reports p-values over growing prefixes of the held-out halves). A text with a non-finite feature is dropped
(counted); a feature non-finite everywhere is refused.

A valid test does not reject for two halves of the same unseen set: ``tests/test_dataset_inference.py`` checks that
the p-values of such splits are near uniform over seeds.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy import stats
from sklearn.linear_model import LogisticRegression

from mia_jax.errors import UserError

MIN_PER_HALF = 10
CLIP = 0.025


@dataclass
class Result:
    p_value: float
    t_statistic: float
    n_suspect: int  # held-out halves
    n_validation: int
    n_dropped: int  # texts with a non-finite feature
    mean_suspect: float  # the linear model's held-out scores
    mean_validation: float
    weights: dict  # feature -> weight of the linear model (standardised features)
    seed: int

    def to_markdown(self) -> str:
        rows = "".join(f"| {k} | {v:+.3f} |\n" for k, v in sorted(self.weights.items(), key=lambda kv: -abs(kv[1])))
        return (f"Dataset inference: held-out suspect texts {self.n_suspect}, validation texts {self.n_validation} "
                f"({self.n_dropped} dropped for a non-finite score); linear score {self.mean_suspect:+.3f} vs "
                f"{self.mean_validation:+.3f}; one-sided Welch t = {self.t_statistic:.3f}.\n\n"
                f"| Feature | Weight |\n|---|---:|\n{rows}")


def _clip(x: np.ndarray) -> np.ndarray:
    lo, hi = np.quantile(x, [CLIP, 1 - CLIP], axis=0)
    return np.clip(x, lo, hi)


def dataset_inference(suspect, validation, names: Sequence[str] | None = None, *, seed: int = 0) -> Result:
    """``suspect`` [n_s, F] and ``validation`` [n_v, F]: per-text scores (higher = member) of the same methods under
    the same model; ``validation`` texts are known non-members from the suspect set's distribution."""
    s, v = np.asarray(suspect, np.float64), np.asarray(validation, np.float64)
    if s.ndim != 2 or v.ndim != 2 or s.shape[1] != v.shape[1]:
        raise UserError(f"suspect and validation need the same features: got shapes {s.shape} and {v.shape}")
    names = list(names) if names is not None else [f"f{i}" for i in range(s.shape[1])]
    dead = [n for n, j in zip(names, range(s.shape[1]))
            if not np.isfinite(s[:, j]).any() or not np.isfinite(v[:, j]).any()]
    if dead:
        raise UserError(f"feature(s) with no finite score in one of the sets: {', '.join(dead)}")
    keep_s, keep_v = np.isfinite(s).all(1), np.isfinite(v).all(1)
    dropped = int((~keep_s).sum() + (~keep_v).sum())
    s, v = s[keep_s], v[keep_v]
    if min(len(s), len(v)) < 2 * MIN_PER_HALF:
        raise UserError(f"dataset inference needs at least {2 * MIN_PER_HALF} scored texts per set (two halves of "
                        f"{MIN_PER_HALF}); got {len(s)} suspect and {len(v)} validation")
    s, v = _clip(s), _clip(v)
    mu, sd = s.mean(0), s.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    s, v = (s - mu) / sd, (v - mu) / sd
    rng = np.random.default_rng(seed)
    s, v = s[rng.permutation(len(s))], v[rng.permutation(len(v))]
    hs, hv = len(s) // 2, len(v) // 2
    x = np.concatenate([s[:hs], v[:hv]])
    y = np.concatenate([np.ones(hs), np.zeros(hv)])
    clf = LogisticRegression(C=1.0, max_iter=1000).fit(x, y)
    held_s, held_v = clf.decision_function(s[hs:]), clf.decision_function(v[hv:])
    t, p = stats.ttest_ind(held_s, held_v, equal_var=False, alternative="greater")
    return Result(float(p), float(t), len(held_s), len(held_v), dropped, float(held_s.mean()), float(held_v.mean()),
                  {n: float(w) for n, w in zip(names, clf.coef_[0])}, seed)


def load_features(path, methods: Sequence[str] | None = None) -> tuple[list[str], np.ndarray]:
    """(method names, [texts, methods] scores, NaN for null) from a mia_jax run's ``results.jsonl``."""
    recs = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not recs:
        raise UserError(f"{path}: no records")
    names = list(methods) if methods else list(recs[0]["scores"])
    missing = [m for m in names if m not in recs[0]["scores"]]
    if missing:
        raise UserError(f"{path}: no scores for {', '.join(missing)} (it has {', '.join(recs[0]['scores'])})")
    x = np.array([[np.nan if r["scores"][m] is None else r["scores"][m] for m in names] for r in recs], np.float64)
    return names, x


# ----------------------------------------------------------------------------- mia-jax dataset-inference

DEFAULT_METHODS = ["loss", "zlib", "min_k", "min_k_pp", "max_k", "entropy", "rank", "min_k_pp_mu", "min_k_pp_sigma",
                   "gap_k"]
DEFAULT_K = [0.05, 0.1, 0.2, 0.3, 0.5]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("dataset-inference", help="was this set of texts trained on? (a p-value; Maini et al. 2024)")
    p.add_argument("--suspect", help="JSONL / CSV of the suspect texts (--text-field)")
    p.add_argument("--validation", help="texts from the same distribution known not to be trained on")
    p.add_argument("--suspect-scores", help="instead of --suspect: a mia-jax run's results.jsonl")
    p.add_argument("--validation-scores", help="instead of --validation: a mia-jax run's results.jsonl")
    p.add_argument("--model", default="smollm2", help="model scoring --suspect / --validation (default: smollm2)")
    p.add_argument("--text-field", default="text")
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, help="the per-text scores used as features")
    p.add_argument("--k", nargs="+", type=float, default=DEFAULT_K, help="fractions of the Min-K%%-type methods")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output folder (scores of each set in out/suspect, out/validation)")
    p.add_argument("--no-progress", action="store_true")
    return p


def _scores(args, side: str, methods: list[str], loaded_box: list) -> tuple[list[str], np.ndarray]:
    given = getattr(args, f"{side}_scores")
    if given:
        return load_features(given, methods)
    path = getattr(args, side)
    if not path:
        raise UserError(f"give --{side} FILE (texts) or --{side}-scores results.jsonl")
    from mia_jax import data, models, rundir, runner

    ds = data.load_records(path, args.text_field, None)
    if not loaded_box:
        loaded_box.append(models.load(args.model))
    loaded = loaded_box[0]
    out = Path(args.out) / side
    fingerprint = runner.run_fingerprint(loaded, ds.texts, None, methods, data_files=ds.files,
                                         batch_size=args.batch_size)
    with rundir.claim(rundir.check_path(out), fingerprint) as resume:
        runner.score_dataset(loaded, ds.texts, methods, out_dir=out, resume=resume, batch_size=args.batch_size,
                             progress=not args.no_progress)
    return load_features(out / "results.jsonl", methods)


def command(args) -> Result:
    """Score both sets (or read their scores), run the test, write DIR/dataset_inference.json / .md, print the
    markdown and, last, ``p-value: X``."""
    from mia_jax.scorers import expand_methods, is_multi_pass

    methods = expand_methods(args.methods, args.k)
    multi = [m for m in methods if is_multi_pass(m)]
    if multi:
        raise UserError(f"dataset-inference uses single-pass scores; drop {', '.join(multi)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    box: list = []
    names_s, s = _scores(args, "suspect", methods, box)
    names_v, v = _scores(args, "validation", methods, box)
    if names_s != names_v:
        raise UserError(f"the two score files have different methods: {names_s} vs {names_v}")
    res = dataset_inference(s, v, names_s, seed=args.seed)
    (out / "dataset_inference.json").write_text(json.dumps(asdict(res), indent=2) + "\n")
    md = res.to_markdown()
    (out / "dataset_inference.md").write_text(md + f"\np-value: {res.p_value:.4g}\n")
    print(md)
    print(f"p-value: {res.p_value:.4g}")
    return res

