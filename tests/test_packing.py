"""Packing texts into rows of a token budget (batching.pack), the packed scoring step (runner / score_step) and the
persistent compilation cache (compilation): packed scores equal each text scored alone, a text's scores do not
depend on what shares its row, a dataset compiles at most two programs, and a second run compiles none."""
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mia_jax import batching, models
from mia_jax.engine import runner
from mia_jax.data import wikimia

METHODS = ["loss", "ppl", "zlib", "min_k@0.2", "max_k@0.2", "min_k_pp@0.2", "entropy", "rank", "gap_k@0.2",
           "camia_slope", "camia_count_1"]


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(2, 300), min_size=1, max_size=80), st.sampled_from([16, 100, 256, 1024, 4096]),
       st.sampled_from([1, 2, 4]))
def test_pack_places_every_item_once_in_at_most_two_shapes(lengths, budget, row_multiple):
    max_length = 300
    steps = batching.pack(lengths, budget, max_length, row_multiple=row_multiple)
    assert steps == batching.pack(lengths, budget, max_length, row_multiple=row_multiple)  # a function of the lengths
    # the candidates pack skips by its lower bound could not have won: the same plan as costing every candidate
    assert steps == batching.pack(lengths, budget, max_length, row_multiple=row_multiple, choose=np.argmin)
    placed = [item for s in steps for item in s.items]
    assert sorted(placed) == list(range(len(lengths)))
    for s in steps:
        assert s.rows % row_multiple == 0 and len(s.contents) <= s.rows
        for row in s.contents:
            assert len(row) <= s.segments
            ends = 0
            for item, start, n in row:  # contiguous, in order, inside the row
                assert start == ends and n == lengths[item]
                ends = start + n
            assert ends <= s.length
    packed = [s for s in steps if s.segments > 1 or len({s.length for s in steps}) == 1]
    assert len({s.shape for s in packed}) <= 2


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=14), st.sampled_from([1, 7, 16, 40, 64]))
def test_each_row_is_filled_as_full_as_the_items_left_allow(lengths, capacity):
    """``_fill_rows``, checked against its rule by brute force: every item once, no row over capacity, each row
    opened by the longest item left (the first in order on a tie) and filled to the largest total that any subset of
    the items left reaches with it (every subset enumerated)."""
    lengths = [min(n, capacity) for n in lengths]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows = batching._fill_rows(order, lengths, capacity)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    left = list(order)
    for row in rows:
        assert row[0] == left[0] and sum(lengths[i] for i in row) <= capacity
        rest = [lengths[i] for i in left[1:]]
        room = capacity - lengths[row[0]]
        best = max(sum(c) for k in range(len(rest) + 1) for c in itertools.combinations(rest, k) if sum(c) <= room)
        assert sum(lengths[i] for i in row[1:]) == best, (row, left)
        left = [i for i in left if i not in row]


def test_short_texts_pack_with_little_padding():
    """Lengths like WikiMIA-32's under SmolLM2's tokenizer (33 to 174 tokens, context 8192): at most two shapes and
    under 1% padding (best-fit decreasing left 2.7%), where one text per row in length buckets needs more programs
    and more slots."""
    lengths = np.random.default_rng(0).integers(33, 175, size=776).tolist()
    steps = batching.pack(lengths, 2048, 8192)
    slots = sum(s.rows * s.length for s in steps)
    assert len({s.shape for s in steps}) <= 2
    assert 1 - sum(lengths) / slots < 0.01
    alone = batching.pack(lengths, 2048, 8192, packed=False, rows=8)
    assert sum(s.rows * s.length for s in alone) > slots and len({s.shape for s in alone}) > 2


def scores_alone(loaded, texts, methods):
    return [runner.score_texts(loaded, [t], methods, progress=False)[0]["scores"] for t in texts]


def test_a_scoring_row_holds_every_token_but_each_texts_last():
    """``packed_arrays(..., targets=True)``: a text of n + 1 tokens fills n slots (its last token predicts nothing
    and is never fed), each slot's target is the text's next token, and every slot of a text is a scored prediction;
    the shifted layout (``targets=False``) keeps every token and predicts the next slot's."""
    ids = {0: [5, 6, 7, 8], 1: [9, 10], 2: [11, 12, 13]}
    lengths = batching.scoring_lengths([batching.Encoded(ids[i], False) for i in range(3)])
    assert lengths == [3, 1, 2]
    assert batching.scoring_lengths([batching.Encoded([7], False)]) == [1]  # never scored: planned as one slot
    with pytest.raises(ValueError, match="at least 1"):
        batching.pack([3, 0], 64, 64)
    step = batching.Step(2, 5, 2, [[(0, 0, 3), (1, 3, 1)], [(2, 0, 2)]])
    a = batching.packed_arrays(step, ids, 0, targets=True)
    np.testing.assert_array_equal(a["ids"], [[5, 6, 7, 9, 0], [11, 12, 0, 0, 0]])
    np.testing.assert_array_equal(a["targets"], [[6, 7, 8, 10, 0], [12, 13, 0, 0, 0]])
    np.testing.assert_array_equal(a["segment_ids"], [[1, 1, 1, 2, 0], [1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(a["mask"], a["segment_ids"] > 0)
    np.testing.assert_array_equal(a["starts"], [[0, 3], [0, 0]])
    np.testing.assert_array_equal(a["spans"], [[3, 1], [2, 0]])
    with pytest.raises(ValueError, match="one more than slots"):
        batching.packed_arrays(batching.Step(1, 5, 1, [[(0, 0, 4)]]), ids, 0, targets=True)
    shifted = batching.packed_arrays(batching.Step(1, 6, 2, [[(1, 0, 2), (2, 2, 3)]]), ids, 0)
    assert "targets" not in shifted
    np.testing.assert_array_equal(shifted["ids"], [[9, 10, 11, 12, 13, 0]])
    np.testing.assert_array_equal(shifted["mask"], [[True, False, True, True, False]])
    np.testing.assert_array_equal(shifted["spans"], [[1, 2]])


def test_packed_scores_equal_each_text_alone(tiny):
    texts = wikimia(32).texts[:20] + ["short one", "x"]
    report = {}
    packed = runner.score_texts(tiny, texts, METHODS, tokens_per_batch=256, progress=False, report=report)
    assert report["scoring_programs"] <= 2 and report["batches_computed"] < len(texts) / 2  # several texts per row
    # every token but each text's last (which predicts nothing) runs through the model
    assert report["tokens"] == sum(r["n_tokens"] - 1 for r in packed if "skip_reason" not in r)
    for rec, alone in zip(packed, scores_alone(tiny, texts, METHODS)):
        for m in METHODS:
            if alone[m] is None:
                assert rec["scores"][m] is None, m
            else:
                np.testing.assert_allclose(rec["scores"][m], alone[m], rtol=2e-5, atol=2e-6, err_msg=m)


POOL = wikimia(64).texts[:40]


@settings(max_examples=6, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(POOL) - 1), st.integers(1, 60)), min_size=1, max_size=12))
def test_a_texts_scores_do_not_depend_on_its_row_neighbours(tiny_llama_dir, picks):
    """The first text is scored beside random others (random lengths: word prefixes of WikiMIA texts); its scores
    are those it gets alone."""
    loaded = _cached(tiny_llama_dir)
    target = POOL[0]
    others = [" ".join(POOL[i].split()[:n]) for i, n in picks]
    together = runner.score_texts(loaded, [target] + others, METHODS[:8], tokens_per_batch=512, progress=False)
    alone = runner.score_texts(loaded, [target], METHODS[:8], tokens_per_batch=512, progress=False)
    for m in METHODS[:8]:
        np.testing.assert_allclose(together[0]["scores"][m], alone[0]["scores"][m], rtol=2e-5, atol=2e-6, err_msg=m)


_LOADED = {}


def _cached(path):
    if str(path) not in _LOADED:
        _LOADED[str(path)] = models.load(str(path))
    return _LOADED[str(path)]


def test_a_second_run_compiles_nothing(tiny_llama_dir, tmp_path):
    """``mia-jax score`` twice with one cache folder: the second run reads every scoring program back."""
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in wikimia(32).texts[:30]))
    cache = tmp_path / "cache"
    env = dict(os.environ, MIA_JAX_COMPILATION_CACHE=str(cache))
    runs = []
    for name in ("first", "second"):
        out = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "mia_jax.cli", "score", "--model", str(tiny_llama_dir),
                               "--data", str(data), "--text-field", "text", "--out", str(out), "--no-progress",
                               "--tokens-per-batch", "512"], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads((out / "run.json").read_text()))
    first, second = (r["compile"] for r in runs)
    assert first["scoring_programs"] >= 1 and first["compiled"] == first["scoring_programs"]
    assert second["scoring_programs"] == first["scoring_programs"]
    assert second["compiled"] == 0 and second["cache_hits"] == second["scoring_programs"]
    assert runs[0]["packing"] == runs[1]["packing"] and runs[0]["packing"]["tokens"] <= runs[0]["packing"]["slots"]
    assert any(cache.iterdir())


def test_cache_can_be_turned_off(monkeypatch, tmp_path):
    from mia_jax.engine import compilation

    monkeypatch.setenv(compilation.ENV, "off")
    assert compilation.resolve() is None
    assert compilation.resolve(str(tmp_path)) == tmp_path  # the option wins over the variable
    monkeypatch.delenv(compilation.ENV)
    assert compilation.resolve() == compilation.default_dir()


def test_bfloat16_forward_moves_scores_little(tiny_llama_dir):
    """``--dtype bfloat16``: parameters and forward in bfloat16, statistics in float32. On the tiny model every
    score stays within 2% of float32 (at most 0.6% measured) and the texts' order by score is kept (Spearman >
    0.99); the figures for SmolLM2 on WikiMIA-32 are in BENCHMARKS.md."""
    from scipy.stats import spearmanr

    texts = wikimia(32).texts[:40]
    f32 = runner.score_texts(models.load(str(tiny_llama_dir)), texts, METHODS[:8], progress=False)
    bf16 = runner.score_texts(models.load(str(tiny_llama_dir), dtype="bfloat16"), texts, METHODS[:8],
                              progress=False)
    for m in METHODS[:8]:
        a = np.array([r["scores"][m] for r in f32])
        b = np.array([r["scores"][m] for r in bf16])
        assert np.all(np.isfinite(b)), m
        assert not np.array_equal(a, b), m  # the forward really ran in bfloat16
        assert np.max(np.abs(a - b) / np.maximum(1, np.abs(a))) < 0.02, m
        assert spearmanr(a, b).statistic > 0.99, m


@pytest.mark.parametrize("broken", ["norm", "embedding_row"])
def test_nan_logits_null_every_score_and_are_reported(tmp_path, capsys, broken):
    """A checkpoint whose final norm holds a NaN gives NaN logits, and so does one NaN row of a tied embedding (one
    NaN logit per position, at a token no text uses; before, the log-sum-exp dropped it and every score came out
    finite and wrong): every score of every text is null (rank too, which would otherwise read as a perfect
    -log 1 = 0), the record says why, and eval warns under its table. A NaN in a padding row changes nothing."""
    from safetensors.numpy import load_file, save_file

    from tokenizers import Tokenizer

    from helpers import write_tiny_llama
    from mia_jax.cli import main

    folder = tmp_path / "nan_llama"
    write_tiny_llama(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    texts = wikimia(32).texts[:12]
    if broken == "norm":
        tensors["model.norm.weight"][3] = np.nan
    else:
        loaded, tok = models.load(str(folder)), Tokenizer.from_file(str(folder / "tokenizer.json"))
        used = {i for t in texts for i in tok.encode(t).ids}
        n_real = tok.get_vocab_size()
        clean = runner.score_texts(loaded, texts, METHODS[:8], progress=False)
        tensors["model.embed_tokens.weight"][n_real + 2] = np.nan  # a padding row: masked, never looked up
        save_file(tensors, str(folder / "model.safetensors"))
        padded = runner.score_texts(models.load(str(folder)), texts, METHODS[:8], progress=False)
        assert [r["scores"] for r in padded] == [r["scores"] for r in clean]
        tensors["model.embed_tokens.weight"][min(set(range(n_real)) - used)] = np.nan
    save_file(tensors, str(folder / "model.safetensors"))
    recs = runner.score_texts(models.load(str(folder)), texts, METHODS[:8], progress=False)
    assert all(r["scores"][m] is None for r in recs for m in METHODS[:8])
    assert all(r["skip_reason"].startswith(runner.NONFINITE) for r in recs)

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": t, "label": i % 2}) + "\n" for i, t in enumerate(texts)))
    assert main(["eval", "--model", str(folder), "--data", str(data), "--out", str(tmp_path / "run"),
                 "--n-bootstrap", "10", "--no-progress", "--no-blind"]) == 0
    printed = capsys.readouterr()
    assert "logits are NaN or infinite for 12 texts (the first: text 0)" in printed.out + printed.err, printed
    assert json.loads((tmp_path / "run" / "run.json").read_text())["nonfinite_logits"] == list(range(12))
