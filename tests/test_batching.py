"""Length buckets, batch planning and padding (mia_jax.batching)."""
import numpy as np
import pytest

from mia_jax import batching


def test_bucket_lengths_are_a_fixed_small_set():
    assert batching.bucket_lengths(2048, per_octave=2) == [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
                                                         1536, 2048]
    assert batching.bucket_lengths(160) == [16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160]
    assert batching.bucket_lengths(100) == [16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 100]
    assert len(batching.bucket_lengths(8192)) == 37
    assert batching.bucket_lengths(8) == [8]
    assert batching.bucket_lengths(16) == [16]
    # no bucket wastes more than a fifth of its length on padding
    b = batching.bucket_lengths(8192)
    assert all((hi - lo) / hi <= 1 / 5 for lo, hi in zip(b, b[1:]))


def test_short_batches_round_up_to_powers_of_two():
    assert [batching.batch_rows(n, 32) for n in (1, 2, 3, 5, 9, 17, 32)] == [1, 2, 4, 8, 16, 32, 32]
    assert [batching.batch_rows(n, 6) for n in (1, 3, 5, 6)] == [1, 4, 6, 6]


def one_process(v):
    return np.asarray(v, np.int64).reshape(1, -1)


def test_align_drops_finished_steps():
    steps = batching.pack([5, 6, 7, 30], 16, 64, packed=False)
    assert batching.align(steps, 64, one_process, lambda idx: False) == steps
    finished = set(steps[0].items)
    kept = batching.align(steps, 64, one_process, lambda idx: set(idx) <= finished)
    assert kept == steps[1:]  # a finished step is not run again


def test_align_keeps_the_processes_in_step():
    """Another process has two steps of length 16 where this one has one, with more rows and segments: this one
    runs a second step with no texts of its own, every step takes the larger shape, and a step stays while any
    process has it unfinished."""
    mine = [batching.Step(2, 16, 1, [[(0, 0, 5)]])]
    answers = iter([[2, 0, 0, 0, 0, 0], [4, 2], [3, 0, 0, 0, 0, 0], [0, 0]])  # the other: steps per length,
    # rows per step, segments per length, finished flags (lengths: bucket_lengths(40), six of them)

    def gather(v):
        return np.stack([np.asarray(v, np.int64), np.asarray(next(answers), np.int64)])

    steps = batching.align(mine, 40, gather, lambda idx: True)
    assert [s.shape for s in steps] == [(4, 16, 3), (2, 16, 3)]
    assert steps[0].contents == [[(0, 0, 5)]] and steps[1].contents == []


def test_batch_shapes_follow_the_plan():
    lengths = [3, 40, 17, 5, 16]
    shapes = batching.batch_shapes(lengths, 64, 2)
    assert shapes == [(16, 2, [0, 3]), (16, 1, [4]), (20, 1, [2]), (40, 1, [1])]
    assert sorted(i for _, _, idx in shapes for i in idx) == list(range(len(lengths)))


@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_ids_fills_rows_and_mask(side):
    seqs = [[5, 6, 7], [8], []]
    ids, mask = batching.pad_ids(seqs, 4, 5, pad=0, side=side)
    assert ids.dtype == np.int32 and mask.dtype == bool and ids.shape == mask.shape == (4, 5)
    if side == "right":
        np.testing.assert_array_equal(ids, [[5, 6, 7, 0, 0], [8, 0, 0, 0, 0], [0] * 5, [0] * 5])
    else:
        np.testing.assert_array_equal(ids, [[0, 0, 5, 6, 7], [0, 0, 0, 0, 8], [0] * 5, [0] * 5])
    np.testing.assert_array_equal(mask.sum(1), [3, 1, 0, 0])
    np.testing.assert_array_equal(ids[mask], [5, 6, 7, 8])
    assert (ids[~mask] == 0).all()


def test_pad_ids_refuses_an_unknown_side():
    with pytest.raises(ValueError, match="side"):
        batching.pad_ids([[1]], 1, 2, 0, side="middle")


def test_encode_ids_are_the_tokenizers_ids_without_offsets():
    """The fast path (``encode_batch_fast``: no character offsets) gives exactly ``encode_batch``'s ids, special
    tokens included; a tokenizer object without it is read through ``encode_batch``."""
    from types import SimpleNamespace

    from helpers import tiny_tokenizer

    tok = tiny_tokenizer(96)
    texts = ["The quick brown fox.", "", "jumps over\nthe lazy dog " * 7, "ünïcödé ✓"]
    want = [e.ids for e in tok.encode_batch(texts)]
    assert batching.encode_ids(tok, texts) == want
    seen = []

    class Plain:  # only encode_batch, as a tokenizer wrapper may have
        def encode_batch(self, batch):
            seen.append(list(batch))
            return [SimpleNamespace(ids=[len(t)]) for t in batch]

    assert batching.encode_ids(Plain(), texts) == [[len(t)] for t in texts] and seen == [texts]
