"""Packing, length buckets, batch planning and padding: how token-id lists become fixed-shape ``[rows, t]`` batches.

The scoring passes pack texts (``pack``): several texts share a row of a fixed length, each a *segment* (its own
segment id, positions restarting at 0, attention never crossing into another segment), rows grouped into steps of
a token budget (``--tokens-per-batch``), so a dataset of short texts runs one program (two with the last, shorter
step) with almost no padding.

Every pass over a model (the runner's scoring passes, the neighbour generators' forwards, generation) and the
trainer's input pipeline build their batches here. Batches are padded to a fixed set of bucket lengths (four per
octave: 16, 20, 24, 28, 32, 40, ... up to the context length) with a fixed number of rows (a bucket's last short
batch rounded up to a power of two), so a whole dataset compiles a handful of programs, not one per length.
The LM head's padding is here too: rows at or beyond the tokenizer's vocabulary (``real_vocab_size``).
Tokenization (``encode``: the model's tokenizer, prefixes, truncation to the context) is here too. Plain NumPy:
nothing here touches a device.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import numpy as np

from mia_jax.errors import UserError

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


# ----------------------------------------------------------------------------- packing (the scoring passes)

MIN_ROW = 256  # a packed row is at least this long (when the budget allows): short texts fill it with little waste
TOKENS_PER_BATCH = {"cpu": 2048, "gpu": 32768, "tpu": 32768}  # default token budget of one step, per backend


@dataclass
class Step:
    """One device step: ``rows`` rows of ``length`` token slots, at most ``segments`` texts per row.
    ``contents[r]`` lists row r's texts as (item, first slot, token count); rows past ``len(contents)`` are
    empty (padding). ``items`` are every text of the step in row order."""

    rows: int
    length: int
    segments: int
    contents: list[list[tuple[int, int, int]]] = field(default_factory=list)

    @property
    def items(self) -> list[int]:
        """The indices of the texts in this step, row by row."""
        return [item for row in self.contents for item, _, _ in row]

    @property
    def shape(self) -> tuple[int, int, int]:
        """(rows, length, segments): the step's program shape."""
        return self.rows, self.length, self.segments


def row_lengths(longest: int, tokens_per_batch: int, max_length: int) -> list[int]:
    """The candidate lengths of a packed row: every bucket from that of the longest text (at least ``MIN_ROW``
    when the budget allows) up to the budget (and the context). Texts longer than the row get rows of their own."""
    buckets = bucket_lengths(max_length)
    low = bucket_of(min(max(min(longest, tokens_per_batch), min(MIN_ROW, tokens_per_batch)), max_length), buckets)
    return [b for b in buckets if low <= b <= max(low, min(tokens_per_batch, max_length))]


def check_tokens_per_batch(n: int | None, option: str = "--tokens-per-batch") -> int | None:
    """``n`` when it is a usable token budget (None: the backend's default), else a UserError naming ``option``."""
    if n is not None and n < MIN_BUCKET:
        raise UserError(f"{option} must be at least {MIN_BUCKET}, got {n}")
    return n


ATTENTION_WEIGHT = 16384  # a slot of a row of length t costs 1 + t / ATTENTION_WEIGHT: attention grows with t


def _fill_rows(order: Sequence[int], lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Rows filled one at a time, each as full as the items left allow: the longest item left, then the subset of
    the others whose lengths fill the room best (the room itself when any subset sums to it). The subset is an exact
    subset sum over the distinct lengths left, a Python integer as the bitset of reachable sums (the first length to
    reach a sum, longest first, is kept to rebuild the subset; a length used at most as many times as items have
    it). WikiMIA-32's 776 texts in rows of 384 slots: 102 rows, 0.2% of the slots empty, where best-fit decreasing
    left 105 rows and 3.1% (rows of 512: 77 rows and 0.9% against 79 and 3.4%); a few milliseconds a plan, a
    fraction of a second for 50 000 texts. Items of a length are taken in ``order`` (longest first)."""
    by_len: dict[int, list[int]] = {}
    for i in order:
        by_len.setdefault(lengths[i], []).append(i)
    for items in by_len.values():
        items.reverse()  # popped from the end: in order
    sizes = sorted(by_len, reverse=True)
    rows: list[list[int]] = []

    def take(n: int) -> int:
        item = by_len[n].pop()
        if not by_len[n]:
            del by_len[n]
            sizes.remove(n)
        return item

    while sizes:
        row = [take(sizes[0])]
        room = capacity - lengths[row[0]]
        reach, first_by, full = 1, {}, 1 << room  # bit s of reach: some subset sums to s
        within = (full << 1) - 1
        for n in sizes:
            for _ in range(min(len(by_len[n]), room // n)):  # up to as many copies of n as there are items
                new = (reach << n) & within & ~reach
                if not new:
                    break  # another copy reaches nothing new either
                reach |= new
                while new:
                    low = new & -new
                    first_by[low.bit_length() - 1] = n
                    new ^= low
                if reach & full:
                    break
            if reach & full:
                break
        s = reach.bit_length() - 1
        while s:
            row.append(take(first_by[s]))
            s -= lengths[row[-1]]
        rows.append(row)
    return rows


def pack(lengths: Sequence[int], tokens_per_batch: int, max_length: int, *, row_multiple: int = 1,
         packed: bool = True, longest: int | None = None, choose: Callable | None = None,
         rows: int | None = None) -> list[Step]:
    """The steps that score items of these token ``lengths`` (each at most ``max_length``), deterministic in
    the lengths alone (a resumed run plans exactly what an uninterrupted one did).

    ``packed``: items go into rows of one length (``_fill_rows``: each row as full as the items left allow),
    ``tokens_per_batch // length`` rows per step (the last step: the rows left), rows rounded up to a multiple of
    ``row_multiple`` (the batch shards): two shapes at most, with the ``segments`` of the fullest row. The row
    length is the candidate (``row_lengths``) with the fewest slots, each weighted by 1 + length /
    ``ATTENTION_WEIGHT`` (a longer row may pack tighter but attends further). Items longer than a row, and every
    item when not ``packed`` (passes that need one text per row, e.g. a per-text gradient), get rows of their own
    of their length's bucket, as many per step as the budget holds, or ``rows`` (a bucket's last step rounded up to
    a power of two rows, ``batch_rows``). ``longest``: the row length's reference (default the longest item; the
    longest of every process's items in a multi-process run, so that all plan the same shapes); ``choose``: the
    costs of the candidate row lengths -> the index of the one to use (default the cheapest; a multi-process run
    sums every process's costs)."""
    if tokens_per_batch < 1:
        raise ValueError(f"tokens_per_batch must be at least 1, got {tokens_per_batch}")
    lengths = [int(n) for n in lengths]
    if not lengths:
        return []
    if min(lengths) < 1:
        raise ValueError(f"every length must be at least 1, got {min(lengths)}")
    longest = max(lengths) if longest is None else longest
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if not packed:
        return _plan(order, [], lengths, 0, tokens_per_batch, max_length, row_multiple, rows)
    plans, costs, tokens = [], [], sum(lengths)
    for row in row_lengths(longest, tokens_per_batch, max_length):  # ascending
        if choose is None and costs and tokens * (1 + row / ATTENTION_WEIGHT) >= min(costs):
            break  # every token costs at least this much in rows this long or longer: none of them can win
        plans.append(_plan(order, [i for i in order if lengths[i] <= row], lengths, row, tokens_per_batch,
                           max_length, row_multiple))
        costs.append(sum(s.rows * s.length * (1 + s.length / ATTENTION_WEIGHT) for s in plans[-1]))
    return plans[choose(costs) if choose is not None else int(np.argmin(costs))]


def align(steps: Sequence[Step], max_length: int, gather: Callable, done: Callable[[list[int]], bool]) -> list[Step]:
    """The steps every process runs, in the same order with the same shapes: per length, as many steps as the
    process with the most; step k's rows the most any process has at its step k; segments the most of any step
    of that length. A process with fewer steps runs empty ones. Steps finished on every process (``done(items)``,
    e.g. after a resume) are dropped. ``gather`` maps this process's integer vector to the ``[processes, n]``
    array of every process's (``processes.allgather_ints``)."""
    buckets = bucket_lengths(max_length)
    mine = {t: [s for s in steps if s.length == t] for t in buckets}
    n_max = gather([len(mine[t]) for t in buckets]).max(axis=0)
    slots = [(t, k) for j, t in enumerate(buckets) for k in range(int(n_max[j]))]
    own = [mine[t][k] if k < len(mine[t]) else None for t, k in slots]
    rows = gather([s.rows if s else 0 for s in own]).max(axis=0)
    segments = gather([max([s.segments for s in mine[t]], default=0) for t in buckets]).max(axis=0)
    seg_of = dict(zip(buckets, segments))
    out = [Step(int(r), t, int(seg_of[t]), s.contents if s else []) for (t, _), r, s in zip(slots, rows, own)]
    finished = gather([int(not s.items or done(s.items)) for s in out]).all(axis=0)
    return [s for s, fin in zip(out, finished) if not fin]


def _plan(order, fits, lengths, row, tokens_per_batch, max_length, row_multiple, rows=None) -> list[Step]:
    """``pack``'s steps for one row length: ``fits`` (longest first) packed into rows of ``row`` slots, the rest
    of ``order`` in rows of their own."""
    chosen = set(fits)
    rest = [i for i in order if i not in chosen]

    def grouped(rows_of_items, length, segments, per_step, exact):
        out = []
        for s in range(0, len(rows_of_items), per_step):
            chunk = rows_of_items[s: s + per_step]
            n_rows = len(chunk) if exact else batch_rows(len(chunk), per_step)
            n_rows = -(-n_rows // row_multiple) * row_multiple
            contents = []
            for items in chunk:
                start, placed = 0, []
                for i in items:
                    placed.append((i, start, lengths[i]))
                    start += lengths[i]
                contents.append(placed)
            out.append(Step(n_rows, length, segments, contents))
        return out

    steps = []
    if fits:
        filled = _fill_rows(fits, lengths, row)
        steps += grouped(filled, row, max(len(r) for r in filled), max(1, tokens_per_batch // row), True)
    buckets = bucket_lengths(max_length)
    by_bucket: dict[int, list[int]] = {}
    for i in reversed(rest):  # shortest first within a bucket, as plan_batches
        by_bucket.setdefault(bucket_of(lengths[i], buckets), []).append(i)
    for t, items in sorted(by_bucket.items()):
        steps += grouped([[i] for i in items], t, 1, rows or max(1, tokens_per_batch // t), False)
    return steps


def scoring_lengths(encoded: Sequence[Encoded]) -> list[int]:
    """The slots each text fills in a scoring pass's packed rows: its tokens but the last, which predicts nothing
    (``packed_arrays(..., targets=True)``): what ``pack`` plans a scoring pass with. A text of fewer than 2 tokens
    (never scored) counts 1."""
    return [max(len(e.ids) - 1, 1) for e in encoded]


def packed_arrays(step: Step, ids: Sequence[Sequence[int]], pad: int, *, targets: bool = False,
                  ) -> dict[str, np.ndarray]:
    """A step's host arrays; ``ids[k]`` are the token ids of item k (a mapping or list indexed by item).

    ``targets=True`` (the scoring passes: a step planned on ``scoring_lengths``): a text of n + 1 tokens fills n slots
    with all its tokens but the last (which predicts nothing, so the forward never runs it), and ``targets`` int32
    [rows, length] holds the token each slot predicts (the text's next one). ``ids`` int32 [rows, length] (``pad`` in
    empty slots), ``segment_ids`` int32 [rows, length] (1, 2, ... per text in its row, 0 on padding), ``mask`` bool
    [rows, length] (the slots holding a prediction), ``starts`` / ``spans`` int32 [rows, segments] (each text's first
    slot and number of predictions; 0 / 0 for no text).

    ``targets=False`` (one text's every token in the row, e.g. a pass whose own computation shifts them): a text of
    n tokens fills n slots and its predictions are slots p .. p+n-2 of the shifted [rows, length - 1] layout (slot
    p predicts the token at p + 1): ``mask`` is [rows, length - 1], ``spans`` n - 1, and there is no ``targets``."""
    out = {"ids": np.full((step.rows, step.length), pad, np.int32),
           "segment_ids": np.zeros((step.rows, step.length), np.int32),
           "starts": np.zeros((step.rows, step.segments), np.int32),
           "spans": np.zeros((step.rows, step.segments), np.int32)}
    if targets:
        out["targets"] = np.full((step.rows, step.length), pad, np.int32)
    for r, row in enumerate(step.contents):
        for s, (item, start, n) in enumerate(row):
            seq = ids[item]
            out["ids"][r, start: start + n] = seq[:n]
            out["segment_ids"][r, start: start + n] = s + 1
            out["starts"][r, s] = start
            out["spans"][r, s] = n if targets else n - 1
            if targets:
                if len(seq) != n + 1:
                    raise ValueError(f"item {item} has {len(seq)} tokens for {n} slots (targets: one more than slots)")
                out["targets"][r, start: start + n] = seq[1:]
    seg = out["segment_ids"]
    out["mask"] = seg > 0 if targets else (seg[:, 1:] > 0) & (seg[:, 1:] == seg[:, :-1])
    return out


# ----------------------------------------------------------------------------- tokenization


@dataclass
class Encoded:
    """One text's token ids (its prefix's first, when it has one), whether they were cut to fit the context, and how
    many leading ids are prefix."""
    ids: list[int]
    truncated: bool
    n_context: int = 0  # leading tokens of a prefix: read as context, never scored


def encode_ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Each text's token ids, the tokenizer's defaults (special tokens added). A ``tokenizers.Tokenizer`` uses
    ``encode_batch_fast`` (the same ids without character offsets: a quarter less time on WikiMIA-32); another
    object needs ``encode_batch`` returning encodings with ``.ids``."""
    fast = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    return [enc.ids for enc in fast(list(texts))]


def encode(loaded, texts: Sequence[str], prefixes: Sequence[str] | None = None) -> list[Encoded]:
    """Token ids as the model's tokenizer gives them by default, cut to the context length.

    With ``prefixes``: each text read after its prefix, tokenized apart and joined (the prefix's ids, then the
    text's without the BOS the tokenizer may add), so the text's own tokens are the ones it has alone; the prefix
    tokens are context (``n_context``), its last one predicts the text's first token. When the two do not fit the
    context, the prefix loses tokens from its start (``truncated``); a text that alone exceeds it is cut as
    without a prefix and read with no context."""
    texts = list(texts)
    if prefixes is None:
        return [Encoded(ids[: loaded.max_length], len(ids) > loaded.max_length)
                for ids in encode_ids(loaded.tokenizer, texts)]
    if len(prefixes) != len(texts):
        raise ValueError(f"{len(prefixes)} prefixes for {len(texts)} texts")
    bos, out = (loaded.bos_token_id if loaded.add_bos else None), []
    for whole, ctx in zip(encode_ids(loaded.tokenizer, texts), encode_ids(loaded.tokenizer, prefixes)):
        ids = whole
        if bos is not None and ids[:1] == [bos]:
            ids = ids[1:]
        room = loaded.max_length - len(ids)
        if room <= 0:
            out.append(Encoded(whole[: loaded.max_length], True))
            continue
        n_keep = min(room, len(ctx))
        lead = 1 if n_keep < len(ctx) and bos is not None and ctx[:1] == [bos] else 0  # a cut prefix keeps its BOS
        keep = ctx[:lead] + ctx[len(ctx) - (n_keep - lead):]
        out.append(Encoded(keep + ids, len(keep) < len(ctx), len(keep)))
    return out


def pow2(n: int) -> int:
    """The least power of two >= ``n`` (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def stable_steps(steps: list[Step], tokens_per_batch: int, row_length: int, segments: int,
                 row_multiple: int = 1) -> list[Step]:
    """``steps`` padded with empty rows and segments to shapes that plans of other texts share: the rows of a full
    step of their length (``tokens_per_batch // length``, then a multiple of ``row_multiple``), segments a power of
    two, at least ``segments`` in rows of ``row_length``. A corpus scored a window at a time then runs one or two
    compiled programs, whatever its size."""
    out = []
    for s in steps:
        rows = max(s.rows, tokens_per_batch // s.length, 1)
        seg = max(pow2(s.segments), segments if s.length == row_length else 1)
        out.append(Step(-(-rows // row_multiple) * row_multiple, s.length, seg, s.contents))
    return out
