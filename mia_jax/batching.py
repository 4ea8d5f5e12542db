"""Length buckets, batch planning and padding: how token-id lists become fixed-shape ``[rows, t]`` batches.

Every pass over a model (the runner's scoring passes, the neighbour generators' forwards, generation) and the
trainer's input pipeline build their batches here. Batches are padded to a fixed set of bucket lengths (four per
octave: 16, 20, 24, 28, 32, 40, ... up to the context length) with a fixed number of rows (a bucket's last short
batch rounded up to a power of two), so a whole dataset compiles a handful of programs, not one per length.
The LM head's padding is here too: rows at or beyond the tokenizer's vocabulary (``real_vocab_size``).
Plain NumPy: nothing here touches a device.
"""
from __future__ import annotations

from typing import Callable, Literal, Sequence

import numpy as np

MIN_BUCKET = 16
BUCKETS_PER_OCTAVE = 4


def bucket_lengths(max_length: int, smallest: int = MIN_BUCKET, per_octave: int = BUCKETS_PER_OCTAVE) -> list[int]:
    """``per_octave`` evenly spaced lengths in every octave from ``smallest`` (per_octave 4: 16, 20, 24, 28, 32,
    40, 48, ...; 2: 16, 24, 32, 48, ...) below ``max_length``, then ``max_length`` itself. A batch is at most
    1 / (per_octave + 1) padding (a fifth with the default) and a context of 8192 has 37 buckets; a dataset
    compiles one program per (bucket, batch rows) shape it uses (10 for WikiMIA-32 with SmolLM2)."""
    out, t = [], smallest
    while t < max_length:
        out += [b for b in (t + t * j // per_octave for j in range(per_octave)) if b < max_length]
        t *= 2
    return out + [max_length]


def batch_rows(n: int, batch_size: int) -> int:
    """Rows of the padded batch for ``n`` texts: ``batch_size``, or for a bucket's last short batch the
    next power of two (so the dummy rows waste at most half of it, with at most log2(batch_size) shapes)."""
    return min(batch_size, 1 << max(0, n - 1).bit_length())


def bucket_of(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket length that holds ``n`` tokens."""
    return next(b for b in buckets if b >= n)


def plan_batches(lengths: Sequence[int], buckets: Sequence[int], batch_size: int) -> list[tuple[int, list[int]]]:
    """Batches of item indices as (bucket length, indices), sorted by length within a bucket."""
    by_bucket: dict[int, list[int]] = {}
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        by_bucket.setdefault(bucket_of(lengths[i], buckets), []).append(i)
    return [(t, idx[s: s + batch_size]) for t, idx in sorted(by_bucket.items())
            for s in range(0, len(idx), batch_size)]


def batch_shapes(lengths: Sequence[int], max_length: int, batch_size: int) -> list[tuple[int, int, list[int]]]:
    """The batches of items of the given lengths on one device: (bucket length, padded rows, item indices)."""
    return [(t, batch_rows(len(idx), batch_size), idx)
            for t, idx in plan_batches(lengths, bucket_lengths(max_length), batch_size)]


def schedule(plan: Sequence[tuple[int, list[int]]], buckets: Sequence[int], batch_size: int, row_multiple: int,
             done: Callable[[list[int]], bool], gather: Callable | None = None) -> list[tuple[int, int, list[int]]]:
    """The steps every process runs, in the same order with the same shapes: (length, rows, this process's
    indices, possibly none). Per bucket, as many steps as the process with the most batches there; a step's
    rows fit the largest of the processes' batches (``batch_rows``, rounded up to ``row_multiple``). Steps
    complete on every process (``done(indices)``, e.g. after a resume) are dropped. ``gather`` maps this
    process's integer vector to the ``[processes, n]`` array of every process's (``sharding.allgather_ints``);
    None: this process alone."""
    if gather is None:
        gather = lambda v: np.asarray(v, np.int64).reshape(1, -1)  # noqa: E731
    mine: dict[int, list[list[int]]] = {}
    for t, idx in plan:
        mine.setdefault(t, []).append(idx)
    counts = gather([sum(len(b) for b in mine.get(t, [])) for t in buckets])  # [processes, buckets]
    steps = []
    for j, t in enumerate(buckets):
        n_max = int(counts[:, j].max())
        for s in range(-(-n_max // batch_size)):
            biggest = int(np.clip(counts[:, j] - s * batch_size, 0, batch_size).max())
            rows = -(-batch_rows(biggest, batch_size) // row_multiple) * row_multiple
            own = mine.get(t, [])
            steps.append((t, rows, own[s] if s < len(own) else []))
    finished = gather([int(not idx or done(idx)) for _, _, idx in steps]).all(axis=0)
    return [step for step, fin in zip(steps, finished) if not fin]


def pad_ids(seqs: Sequence[Sequence[int]], rows: int, length: int, pad: int,
            side: Literal["right", "left"] = "right") -> tuple[np.ndarray, np.ndarray]:
    """``seqs`` (token-id lists, each at most ``length`` long) as one padded batch: (ids int32 [rows, length],
    mask bool [rows, length], True on real tokens). Row r holds ``seqs[r]``, at the start of the row (``right``
    padding, what the causal scoring passes use: padding after the real tokens never changes their logits) or at
    its end (``left``, for generation: every prompt ends where decoding starts); rows past ``len(seqs)`` are
    all padding."""
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    ids = np.full((rows, length), pad, np.int32)
    mask = np.zeros((rows, length), bool)
    for r, seq in enumerate(seqs):
        span = slice(0, len(seq)) if side == "right" else slice(length - len(seq), length)
        ids[r, span] = seq
        mask[r, span] = True
    return ids, mask


def real_vocab_size(loaded) -> int:
    """Rows of the LM head at or beyond the tokenizer's vocabulary are padding (masked in the stats, never proposed
    or sampled): the real vocabulary of a LoadedModel."""
    return min(loaded.config.vocab_size, loaded.tokenizer.get_vocab_size(with_added_tokens=True))
