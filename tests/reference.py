"""Plain float64 NumPy references for the token statistics and every single-pass scorer, written from the scorers'
docstrings: one row at a time, over the row's scored tokens in order (sorted lists, loops, ``np.polyfit``)."""
import math
import zlib as zlib_mod
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np


def ref_token_arrays(logits, targets, vocab_size=None):
    """Per-token (log p, mu, sigma, entropy, rank) from full logits, in float64."""
    x = np.asarray(logits, np.float64)
    if vocab_size is not None:
        x = x[..., :vocab_size]
    top = x.max(-1, keepdims=True)
    e = np.exp(x - top)
    z = e.sum(-1, keepdims=True)
    logp = x - (np.log(z) + top)
    p = e / z
    lp = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    mu = np.einsum("...v,...v->...", p, logp)  # sums of products without a [.., V] temporary each
    sigma = np.sqrt(np.einsum("...v,...v,...v->...", p, logp, logp) - mu**2)
    ent = -mu
    rank = 1 + (x > np.take_along_axis(x, targets[..., None], -1)).sum(-1)
    return lp, mu, sigma, ent, rank


def ref_tempered(logits, targets, temperatures, vocab_size=None):
    """Per-token (log p_T(y), E_{p_T} log p_T, Var_{p_T} log p_T) [..., K] of softmax(x / T), in float64."""
    x = np.asarray(logits, np.float64)
    if vocab_size is not None:
        x = x[..., :vocab_size]
    out = []
    for t in np.asarray(temperatures, np.float64):
        z = x / t
        with np.errstate(invalid="ignore", divide="ignore"):  # p log p of a -inf logit: 0 * -inf, replaced by 0
            top = np.max(z, -1, keepdims=True)
            logp = z - (np.log(np.exp(z - top).sum(-1, keepdims=True)) + top)
            p = np.exp(logp)
            mu = np.where(p > 0, p * logp, 0.0).sum(-1)
            var = np.where(p > 0, p * (logp - mu[..., None]) ** 2, 0.0).sum(-1)
        out.append((np.take_along_axis(logp, targets[..., None], -1)[..., 0], mu, var))
    return tuple(np.stack([o[i] for o in out], -1) for i in range(3))


def count(k, n: int) -> int:
    """max(1, floor(k n)), k the decimal it prints as."""
    f = Fraction(repr(float(k)))
    return max(1, n * f.numerator // f.denominator)


def lowest(values, k) -> float:
    """Mean of the count(k, n) lowest values (NaN for none)."""
    v = sorted(float(x) for x in values)
    if not v:
        return math.nan
    c = count(k, len(v))
    return sum(v[:c]) / c


def highest(values, k) -> float:
    return -lowest([-float(x) for x in values], k)


def mean(values) -> float:
    v = [float(x) for x in values]
    return sum(v) / len(v) if v else math.nan


def _slope(x):
    n = len(x)
    if n < 2:
        return math.nan
    cum = [mean(x[:j]) for j in range(1, n + 1)]
    return float(np.polyfit(np.arange(1, n + 1, dtype=np.float64), cum, 1)[0])


def _count_pre(x):
    return mean([x[t] > mean(x[:t]) for t in range(1, len(x))]) if len(x) >= 2 else math.nan


def _gap(r, k):
    g = (r["logprob"] - r["max_logprob"]) / np.sqrt(r["var"])
    smooth = g if len(g) < 3 else np.convolve(g, np.ones(3) / 3, mode="valid")  # the authors' smoothing
    return lowest(smooth, k)


def _dc_pdd(r, freq, a=0.01):
    seen, alphas = set(), []
    for lp, t in zip(r["logprob"], r["ids"]):
        if int(t) in seen:
            continue
        seen.add(int(t))
        alphas.append(min(math.exp(lp) * -math.log(freq[int(t)]), a))
    return mean(alphas)


def _acmia(r, e, variant):
    """ACMIA (scorers.acmia's docstring) over the first occurrence of each id, temperatures e = [T, T * 2^0.1]."""
    t = e["temperatures"][0]
    seen, terms = set(), []
    for j, i in enumerate(r["ids"]):
        if int(i) in seen:
            continue
        seen.add(int(i))
        lt = r["logprob_t"][j]
        if variant == "ac":
            terms.append(-math.inf if lt[0] == -math.inf else (1.0 if t < 1 else -1.0) * (lt[0] - r["logprob"][j]))
        elif variant == "derivac":
            terms.append(-math.inf if lt[0] == -math.inf else lt[0] - lt[1])
        else:
            terms.append((lt[0] - r["mu_t"][j][0]) / math.sqrt(r["var_t"][j][0]))
    return mean(terms)


# base name -> f(row, k, extra): row = {statistic: float64 values over the scored tokens, "ids": ...}
REFERENCES = {
    "loss": lambda r, k, e: mean(r["logprob"]),
    "ppl": lambda r, k, e: -math.exp(-mean(r["logprob"])) if len(r["logprob"]) else math.nan,
    "zlib": lambda r, k, e: mean(r["logprob"]) / e["zlib_bytes"],
    "entropy": lambda r, k, e: -mean(r["entropy"]),
    "rank": lambda r, k, e: -mean(np.log(r["rank"])),
    "min_k": lambda r, k, e: lowest(r["logprob"], k),
    "max_k": lambda r, k, e: highest(r["logprob"], k),
    "min_k_pp": lambda r, k, e: lowest((r["logprob"] - r["mu"]) / np.sqrt(r["var"]), k),
    "min_k_pp_mu": lambda r, k, e: lowest(r["logprob"] - r["mu"], k),
    "min_k_pp_sigma": lambda r, k, e: lowest(r["logprob"] / np.sqrt(r["var"]), k),
    "gap_k": lambda r, k, e: _gap(r, k),
    "polarized": lambda r, k, e: lowest(r["logprob"], 0.3) - highest(r["logprob"], 0.05),
    "camia_slope": lambda r, k, e: _slope(list(r["logprob"])),
    **{f"camia_count_{tau}": (lambda r, k, e, tau=tau: mean(r["logprob"][:200] >= -tau)) for tau in (1, 2, 3)},
    "camia_count_pre": lambda r, k, e: _count_pre(list(r["logprob"])),
    **{f"camia_loss_{cut}": (lambda r, k, e, cut=cut: mean(r["logprob"][:cut])) for cut in (200, 300)},
    "camia_ll_tail": lambda r, k, e: mean(r["logprob"][1:]) if len(r["logprob"]) >= 2 else math.nan,
    "camia_calibrated": lambda r, k, e: (mean(r["logprob"]) / (len(set(r["ids"].tolist())) / len(r["ids"]))
                                         if len(r["ids"]) else math.nan),
    "dc_pdd": lambda r, k, e: _dc_pdd(r, e["freq"]),
    **{f"acmia_{v}": (lambda r, k, e, v=v: _acmia(r, e, v)) for v in ("ac", "derivac", "normac")},
    "tag_tab": lambda r, k, e: mean(r["logprob"][r["keywords"]]),  # the scored keyword tokens only
}


def method_references(stats, mask, methods, *, ids=None, zlib_bytes=None, freq=None, tempered=None,
                      temperatures=None, keywords=None) -> dict:
    """{method: float64 [B]} from the references, per row over its scored tokens in order (``tempered``: the
    TemperedStats [B, T, K] at ``temperatures`` [K]; ``keywords``: Tag&Tab's bool [B, T] keyword tokens)."""
    mask = np.asarray(mask, bool)
    fields = {name: np.asarray(x, np.float64) for name, x in stats._asdict().items()}
    fields.update({name: np.asarray(x, np.float64) for name, x in (tempered._asdict() if tempered else {}).items()})
    out = {m: np.full(mask.shape[0], np.nan) for m in methods}
    for b in range(mask.shape[0]):
        row = {name: x[b][mask[b]] for name, x in fields.items()}
        row["ids"] = np.asarray(ids)[b][mask[b]] if ids is not None else None
        row["keywords"] = np.asarray(keywords, bool)[b][mask[b]] if keywords is not None else None
        extra = {"zlib_bytes": None if zlib_bytes is None else float(zlib_bytes[b]),
                 "freq": None if freq is None else np.asarray(freq, np.float64),
                 "temperatures": None if temperatures is None else np.asarray(temperatures, np.float64)}
        for m in methods:
            base, _, k = m.partition("@")
            with np.errstate(all="ignore"):
                out[m][b] = REFERENCES[base](row, float(k) if k else None, extra)
    return out


def reference_scores(lp, mu, sigma, ent, rank, text, k):
    """The default methods of one text, per example (the published code's reading: sorted lists)."""
    n = len(lp)
    c = count(k, n)
    z = (lp - mu) / sigma
    return {
        "loss": lp.mean(),
        "ppl": -np.exp(-lp.mean()),
        "zlib": lp.mean() / len(zlib_mod.compress(text.encode("utf-8"))),
        f"min_k@{k:g}": np.mean(np.sort(lp)[:c]),
        f"max_k@{k:g}": np.mean(np.sort(lp)[::-1][:c]),
        f"min_k_pp@{k:g}": np.mean(np.sort(z)[:c]),
        "entropy": -ent.mean(),
        "rank": -np.log(rank).mean(),
    }


def scores_x64(stats, mask, methods, **kwargs) -> dict:
    """``device_scores`` on float64 inputs under ``jax_enable_x64``: float64 out (checked), as NumPy."""
    from mia_jax import device_scores

    with jax.enable_x64(True):
        s = type(stats)(*(jnp.asarray(np.asarray(x, np.float64)) for x in stats))
        kw = {key: (None if v is None else {r: jnp.asarray(np.asarray(a, np.float64)) for r, a in v.items()}
                    if key == "resources" else type(v)(*(jnp.asarray(np.asarray(x, np.float64)) for x in v))
                    if key == "tempered" else jnp.asarray(np.asarray(v)))
              for key, v in kwargs.items()}
        out = device_scores(s, jnp.asarray(np.asarray(mask, bool)), methods, **kw)
        assert all(v.dtype == jnp.float64 for v in out.values()), {m: v.dtype for m, v in out.items()}
        return {m: np.asarray(v) for m, v in out.items()}


def ngram_coverage_ref(candidate, reference, n) -> float:
    """Hallinan et al. 2025's coverage of a candidate word list by a reference word list, from the definition: word j
    of the candidate is covered when some window of n words containing it occurs somewhere in the reference as n
    consecutive words; the share of covered words (0 for a candidate shorter than n), as an exact fraction."""
    c, r = list(candidate), list(reference)
    if len(c) < n:
        return 0.0

    def occurs(window):
        return any(r[s:s + n] == window for s in range(len(r) - n + 1))

    covered = [any(occurs(c[s:s + n]) for s in range(max(0, j - n + 1), min(j, len(c) - n) + 1))
               for j in range(len(c))]
    return float(Fraction(sum(covered), len(c)))


def sliding_window_coverage_ref(candidate, reference, min_n) -> float:
    """The n-gram coverage attack's coverage as its authors compute it (``find_exact_match`` of
    shallinan1/NGramCoverageAttack, restated): a window [first, second) of the candidate starts at min_n words; a
    window found in the reference is recorded (replacing the last recorded span when it contains it) and grows at its
    end; one not found shrinks from its start, or slides when it has min_n words; the share of the candidate's words
    inside a recorded span. A window is found when its words occur consecutively in the reference (theirs: its
    detokenized text is a substring of the reference's text)."""
    c, r = list(candidate), list(reference)
    if len(c) < min_n:
        return 0.0

    def found(lo, hi):
        return any(r[s:s + hi - lo] == c[lo:hi] for s in range(len(r) - (hi - lo) + 1))

    spans, first, second = [], 0, min_n
    while second <= len(c):
        if found(first, second):
            if spans and first <= spans[-1][0] and spans[-1][1] <= second:
                spans[-1] = (first, second)
            else:
                spans.append((first, second))
            second += 1
        elif second - first > min_n:
            first += 1
        else:
            first, second = first + 1, second + 1
    flags = [False] * len(c)
    for lo, hi in spans:
        flags[lo:hi] = [True] * (hi - lo)
    return sum(flags) / len(c)


def em_mia_ref(ratio, init, iterations) -> np.ndarray:
    """EM-MIA (Kim et al. 2026, the authors' NegPref / AUC-ROC rule) in float64 loops: pseudo-labels y = 1[f > median
    f]; r(p) = P(R[p, member] > R[p, non-member]) + P(tie) / 2 over the pairs of finite entries (NaN with one
    class); f = -r, NaN -> 0."""
    ratio = np.asarray(ratio, np.float64)
    f = [0.0 if not math.isfinite(v) else float(v) for v in init]
    for _ in range(iterations):
        srt = sorted(f)
        n = len(srt)
        med = srt[n // 2] if n % 2 else (srt[n // 2 - 1] + srt[n // 2]) / 2
        y = [v > med for v in f]
        new = []
        for row in ratio:
            pos = [v for v, yy in zip(row, y) if yy and math.isfinite(v)]
            neg = [v for v, yy in zip(row, y) if not yy and math.isfinite(v)]
            if not pos or not neg:
                new.append(0.0)
                continue
            wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
            new.append(-wins / (len(pos) * len(neg)))
        f = new
    return np.asarray(f)
