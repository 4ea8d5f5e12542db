"""The members / non-members split of one dataset (stratified by its class label, matched in length) and the number
of times each member is inserted (fixed, Poisson, buckets): see train/corpus.py's docstring."""
from __future__ import annotations

import numpy as np

from mia_jax.errors import UserError
from train.config import CorpusConfig
from train.overlap import NGRAM
from train.sources import STRATIFIED_BY, Example

def apportion(total: int, weights: list[int], rng) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder, exact integers, ties in seeded order);
    each part is within one of its exact share and at most its weight when ``total <= sum(weights)``."""
    w_sum = sum(weights)
    if w_sum == 0:
        return [0] * len(weights)
    base = [total * w // w_sum for w in weights]
    rem = [total * w % w_sum for w in weights]
    tie = rng.permutation(len(weights))
    for i in sorted(range(len(weights)), key=lambda i: (-rem[i], tie[i]))[: total - sum(base)]:
        base[i] += 1
    return base


def split(cands: list[Example], n_pos: int, n_neg: int, rng) -> tuple[list[Example], list[Example]]:
    """Members and non-members, stratified by ``Example.stratum`` and matched in length.

    The n_pos + n_neg examples are apportioned over the strata in proportion to their candidates, and each
    stratum's share over the two sides in proportion n_pos : n_neg (with n_pos == n_neg a label's count differs by
    at most one between the sides). Within a stratum a seeded sample of its share is sorted by length (characters
    of the formatted text, seeded ties) and cut into as many consecutive runs as the smaller side takes examples;
    one seeded example of each run goes to the smaller side, the rest to the other (so both sides draw from every
    length quantile: with equal sides, a coin per consecutive pair). Both lists come back in file order."""
    strata = sorted({e.stratum for e in cands}, key=lambda s: (s is not None, str(s)))
    groups = [[e for e in cands if e.stratum == s] for s in strata]
    totals = apportion(n_pos + n_neg, [len(g) for g in groups], rng)
    members = apportion(n_pos, totals, rng)
    pos, neg = [], []
    for g, t, m in zip(groups, totals, members):
        sample = [g[i] for i in sorted(rng.choice(len(g), t, replace=False))]
        tie = rng.permutation(t)
        ordered = [sample[i] for i in sorted(range(t), key=lambda i: (len(sample[i].text), tie[i]))]
        k = min(m, t - m)
        picked = {j * t // k + int(rng.integers((j + 1) * t // k - j * t // k)) for j in range(k)}
        few = [e for i, e in enumerate(ordered) if i in picked]
        many = [e for i, e in enumerate(ordered) if i not in picked]
        pos += few if m <= t - m else many
        neg += many if m <= t - m else few
    return sorted(pos, key=lambda e: e.index), sorted(neg, key=lambda e: e.index)


def check_enough(cands: list[Example], pool: list[Example], n_pos: int, n_neg: int, what: str,
                 extra: int = 0) -> None:
    """UserError naming ``what`` when the ``pool`` (after de-duplication) or its 13-gram isolated ``cands`` cannot
    give ``n_pos`` members and ``n_neg`` non-members (and ``extra`` background articles, from the pool)."""
    if len(pool) < n_pos + n_neg + extra:
        more = f" + {extra} background" if extra else ""
        raise UserError(f"{what}: {n_pos} positives + {n_neg} negatives{more} requested but only {len(pool)} usable "
                        "examples (after de-duplication); lower corpus.n_positives / corpus.n_negatives")
    if len(cands) < n_pos + n_neg:
        raise UserError(f"{what}: {n_pos} positives + {n_neg} negatives requested but only {len(cands)} usable "
                        f"examples share no {NGRAM}-gram with another example or the background (of {len(pool)} "
                        "after de-duplication); lower corpus.n_positives / corpus.n_negatives")


def occurrences(cfg: CorpusConfig, pos: list[Example], rng) -> list[int]:
    """How many times each member of ``pos`` is inserted under ``cfg.occurrence`` (fixed, buckets or a
    zero-truncated Poisson), drawn from ``rng``."""
    if cfg.occurrence == "fixed":
        return [cfg.occurrences] * len(pos)
    if cfg.occurrence == "buckets":
        return deal_buckets(pos, cfg.occurrence_buckets, rng)
    k = rng.poisson(cfg.poisson_lambda, len(pos))
    while (k == 0).any():  # zero-truncated Poisson by rejection
        k[k == 0] = rng.poisson(cfg.poisson_lambda, int((k == 0).sum()))
    return [int(x) for x in k]


def deal_buckets(pos: list[Example], buckets: list[int], rng) -> list[int]:
    """Occurrence counts dealt evenly: the members sorted by (stratum, length, seeded tie) are cut into consecutive
    blocks of ``len(buckets)``, and each block gets a seeded permutation of the buckets (the last, partial block a
    seeded subset). Bucket sizes differ by at most one; within each stratum by at most two; lengths match."""
    if len(pos) < len(buckets):
        raise UserError(f"corpus.occurrence=buckets: {len(buckets)} buckets {list(buckets)} but only {len(pos)} "
                        "positives; raise corpus.n_positives or use fewer corpus.occurrence_buckets")
    tie = rng.permutation(len(pos))
    order = sorted(range(len(pos)), key=lambda i: (str(pos[i].stratum), len(pos[i].text), tie[i]))
    occ = [0] * len(pos)
    for start in range(0, len(order), len(buckets)):
        for i, b in zip(order[start: start + len(buckets)], rng.permutation(len(buckets))):
            occ[i] = int(buckets[b])
    return occ


def _summary(values: list[int]) -> dict:
    return {"mean": float(np.mean(values)), "median": float(np.median(values))} if values else {}


def split_record(name: str, cands: list[Example], pos: list[Example], neg: list[Example], pos_tokens,
                 neg_tokens) -> dict:
    """The manifest's record of dataset ``name``'s split: what it is stratified by, candidates / members /
    non-members per stratum, and the mean and median lengths of each side (characters; ``pos_tokens`` /
    ``neg_tokens``: each side's token counts)."""
    strata = sorted({e.stratum for e in cands}, key=lambda s: (s is not None, str(s)))
    rec = {"stratified_by": STRATIFIED_BY.get(name)}
    if rec["stratified_by"] is None:
        rec["stratification_note"] = f"{name} has no class label: members and non-members are length-matched only"
    rec["strata"] = {("all" if s is None else s): {"candidates": sum(e.stratum == s for e in cands),
                                                   "members": sum(e.stratum == s for e in pos),
                                                   "non_members": sum(e.stratum == s for e in neg)} for s in strata}
    rec["max_stratum_count_difference"] = max(abs(v["members"] - v["non_members"]) for v in rec["strata"].values())
    rec["length_chars"] = {"members": _summary([len(e.text) for e in pos]),
                           "non_members": _summary([len(e.text) for e in neg])}
    rec["length_tokens"] = {"members": _summary(list(pos_tokens)), "non_members": _summary(list(neg_tokens))}
    return rec
