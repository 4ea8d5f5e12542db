"""Overlap between contamination candidates, their datasets and the background: word 13-gram hashing
(``NgramHasher``), the isolation of split candidates (``isolate``: no 13-gram shared with any other candidate or
any background document) and the check recorded in the corpus manifest (``overlap_check``). Used by
``train/corpus.py``; the texts' normalisation is ``sources.normalise``."""
from __future__ import annotations

import numpy as np

from train.sources import Example, normalise

KEY_PROBE_CHARS = 200  # an example is "in the background" when this much of its key text occurs there


NGRAM = 13
_P = np.uint64(0x100000001B3)
_EMPTY = np.empty(0, np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: word ids -> well-spread 64-bit values (uint64 arithmetic wraps)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class NgramHasher:
    """Sorted unique 64-bit hashes of a text's word 13-grams (words of :func:`normalise`). One vocabulary per
    instance, so hashes compare only between texts hashed by the same instance."""

    def __init__(self, n: int = NGRAM):
        self.n, self.vocab = n, {}

    def __call__(self, text: str) -> np.ndarray:
        words = text.lower().split()
        m = len(words) - self.n + 1
        if m <= 0:
            return _EMPTY
        vocab = self.vocab
        ids = _mix(np.fromiter((vocab.setdefault(w, len(vocab)) for w in words), np.uint64, len(words)))
        h = np.zeros(m, np.uint64)
        for j in range(self.n):
            h = h * _P + ids[j: j + m]
        return np.unique(h)

    def union(self, texts) -> np.ndarray:
        """The sorted unique n-gram hashes of all ``texts``."""
        parts = [self(t) for t in texts]
        return np.unique(np.concatenate(parts)) if parts else _EMPTY


def _n_in(h: np.ndarray, sorted_set: np.ndarray) -> int:
    """How many of the hashes ``h`` are in ``sorted_set`` (sorted, unique): a binary search per hash."""
    if not len(h) or not len(sorted_set):
        return 0
    i = np.minimum(np.searchsorted(sorted_set, h), len(sorted_set) - 1)
    return int((sorted_set[i] == h).sum())


def isolate(pools: dict[str, list[Example]], background: list[str] | None, hasher: NgramHasher):
    """Split candidates: the examples that share no 13-gram with any other example of any dataset in ``pools``, nor
    with any ``background`` document (and whose key's first 200 characters do not occur in one). Every example of
    an overlapping group is dropped (not the first kept), so the rule does not depend on file order and a candidate
    shares no 13-gram with anything that can reach the corpus. -> ({name: candidates}, {name: drop counts})."""
    hashes = {n: [hasher(e.text) for e in pool] for n, pool in pools.items()}
    within, per_dataset = {}, []
    for n, hs in hashes.items():
        u, c = np.unique(np.concatenate(hs) if hs else _EMPTY, return_counts=True)
        within[n] = u[c > 1]
        per_dataset.append(u)
    u, c = np.unique(np.concatenate(per_dataset) if per_dataset else _EMPTY, return_counts=True)
    across = u[c > 1]
    bg = hasher.union(background) if background else _EMPTY
    joined = "\x00".join(background) if background else ""
    cands, drops = {}, {}
    for n, pool in pools.items():
        d = drops[n] = {"in_background": 0, "shared_13gram_within_dataset": 0, "shared_13gram_other_dataset": 0}
        cands[n] = []
        for e, h in zip(pool, hashes[n]):
            if _n_in(h, bg) or (joined and e.key.strip()[:KEY_PROBE_CHARS] in joined):
                d["in_background"] += 1
            elif _n_in(h, within[n]):
                d["shared_13gram_within_dataset"] += 1
            elif _n_in(h, across):
                d["shared_13gram_other_dataset"] += 1
            else:
                cands[n].append(e)
    return cands, drops


def overlap_check(chosen: dict[str, tuple[list[Example], list[Example]]], background: list[str],
                  hasher: NgramHasher | None = None) -> dict:
    """The check recorded in the manifest: per dataset, the most distinct 13-grams one non-member shares with the
    members (of every dataset) and with the background documents of the corpus, and the number of normalised
    field values a non-member shares with a member of its dataset; all must be 0."""
    hasher = hasher or NgramHasher()
    members = hasher.union(e.text for pos, _ in chosen.values() for e in pos)
    bg = hasher.union(background)
    out = {}
    for name, (pos, neg) in chosen.items():
        hs = [hasher(e.text) for e in neg]
        mem_fields = {(f, normalise(str(v))) for e in pos for f, v in e.fields.items()}
        out[name] = {
            "max_shared_13grams_with_members": max((_n_in(h, members) for h in hs), default=0),
            "max_shared_13grams_with_background": max((_n_in(h, bg) for h in hs), default=0),
            "shared_field_values": sum((f, normalise(str(v))) in mem_fields for e in neg for f, v in e.fields.items()),
        }
    total = {k: max((d[k] for d in out.values()), default=0) for k in
             ("max_shared_13grams_with_members", "max_shared_13grams_with_background", "shared_field_values")}
    return {"ngram": hasher.n, "normalisation": "lowercase, whitespace-separated words", **total,
            "passed": not any(total.values()), "datasets": out}
