"""DC-PDD (Zhang et al. 2024): the score against a float64 loop of the paper's formula, the token-frequency table
(counting, the file, the tokenizer check, the freq-table command) and the method through the runner on a tiny model."""
import argparse
import json
import math
from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TEXTS, write_tiny_gguf
from reference import scores_x64
from tokenizers import Tokenizer

from mia_jax import batching, models
from mia_jax.methods import freq
from mia_jax.engine import runner, score_step
from mia_jax.commands import freq_table
from mia_jax.data import wikimia
from mia_jax.errors import UserError
from mia_jax.methods.freq import FreqTable, count_tokens, tokenizer_sha256
from mia_jax.scorers import REGISTRY, TokenBatch, score_batch
from mia_jax.scorers.dcpdd import A_CLIP, first_occurrence
from mia_jax.stats import TokenStats

CORPUS = wikimia(64).texts[:40] + TEXTS


def dcpdd_loop(logprob, ids, mask, counts, a=A_CLIP) -> np.ndarray:
    """The paper's beta, written out: first occurrences only, alpha = min(-p log f, a), f add-one smoothed."""
    n_total, v = int(sum(counts)), len(counts)
    out = []
    for lp_row, id_row, m_row in zip(logprob, ids, mask):
        seen, alphas = set(), []
        for lp, t, m in zip(lp_row, id_row, m_row):
            if not m or int(t) in seen:
                continue
            seen.add(int(t))
            f = (int(counts[int(t)]) + 1) / (n_total + v)
            alphas.append(min(math.exp(float(lp)) * math.log(1.0 / f), a))
        out.append(sum(alphas) / len(alphas) if alphas else math.nan)
    return np.array(out)


def dc_pdd_x64(logprob, ids, mask, freq) -> np.ndarray:
    """The registered formula in float64 (under x64)."""
    z = np.zeros_like(logprob)
    return scores_x64(TokenStats(logprob, z, z + 1, z, z + 1, z), mask, ["dc_pdd"], ids=ids,
                      resources={"freq_table": freq})["dc_pdd"]


def batch_of(logprob, ids, mask, resources=None) -> TokenBatch:
    z = np.zeros_like(logprob)
    return TokenBatch(TokenStats(logprob, z, z + 1, z, z + 1, z), mask, ids=ids, resources=resources or {})


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def table(tiny):
    return FreqTable.from_texts(tiny.tokenizer, CORPUS, name=tiny.name)


def test_hand_made_stats_match_the_paper_loop():
    counts = np.array([50, 0, 3, 900, 7, 0, 20, 10, 0, 10])  # N = 1000, V = 10: f(v) = (c + 1) / 1010
    ids = np.array([[3, 2, 3, 3, 9, 0],    # 3 repeats: its later (likely) occurrences must not count
                    [1, 1, 1, 0, 0, 0],    # one distinct token, then padding
                    [4, 6, 7, 5, 8, 2],    # all distinct, padding id values never read
                    [0, 0, 0, 0, 0, 0]])   # no tokens at all
    logprob = np.log(np.array([[1e-4, 2e-3, 0.9, 0.95, 0.5, 0.8],
                               [1e-3, 0.99, 0.99, 0.7, 0.7, 0.7],
                               [0.02, 1e-4, 3e-3, 0.5, 1e-5, 0.9],
                               [0.5] * 6]))
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0], [0] * 6], bool)
    logprob[~mask] = np.array([np.nan, np.inf, -np.inf, 1e3, -1e3, 7.0] * 2)[: (~mask).sum()]  # must not leak in
    want = dcpdd_loop(logprob, ids, mask, counts)
    assert np.isnan(want[3]) and np.all(np.isfinite(want[:3]))
    # row 1 by hand: one kept token, p = 1e-3, f = 1/1010: 1e-3 * log(1010) = 0.00692 (< a, no clip)
    assert want[1] == pytest.approx(1e-3 * math.log(1010), rel=1e-12)
    # clipping is active on row 0 (token 9: 0.5 * log(1010/11) > 0.01) and row 2 (token 5: 0.5 * log(1010) > 0.01)
    assert 0.5 * math.log(1010 / 11) > A_CLIP and 0.5 * math.log(1010) > A_CLIP
    table = FreqTable(counts, "0" * 64)
    got = dc_pdd_x64(logprob, ids, mask, table.probabilities())
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, equal_nan=True)
    via = score_batch(batch_of(logprob, ids, mask, {"freq_table": table}), ["dc_pdd"])["dc_pdd"]
    np.testing.assert_allclose(via, got, rtol=1e-5, equal_nan=True)  # the host path: float32
    with pytest.raises(UserError, match="needs a freq_table"):
        score_batch(batch_of(logprob, ids, mask), ["dc_pdd"])
    arr = score_batch(batch_of(logprob, ids, mask, {"freq_table": table.probabilities()}), ["dc_pdd"])["dc_pdd"]
    np.testing.assert_array_equal(arr, via)  # the probability array itself is accepted too
    # without the first-occurrence rule row 0 would average the clipped repeats of token 3 in
    no_fos = np.mean([min(p * math.log(1010 / (c + 1)), A_CLIP) for p, c in
                      zip([1e-4, 2e-3, 0.9, 0.95, 0.5, 0.8], counts[ids[0]])])
    assert abs(no_fos - got[0]) > 5e-4


def test_random_batches_match_the_loop_and_first_occurrence_is_exact():
    rng = np.random.default_rng(0)
    b, t, v = 12, 50, 17
    counts = rng.integers(0, 40, size=v)
    ids = rng.integers(0, v, size=(b, t))
    lengths = rng.integers(0, t + 1, size=b)
    lengths[:2] = [0, t]
    mask = np.arange(t) < lengths[:, None]
    mask[3, :5] = False  # a masked context before the text (a prefix): not a first occurrence either
    logprob = -rng.exponential(4.0, size=(b, t))
    want = dcpdd_loop(logprob, ids, mask, counts)
    got = dc_pdd_x64(logprob, ids, mask, FreqTable(counts, "x").probabilities())
    np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)
    first = first_occurrence(ids, mask)
    for r in range(b):
        seen, expect = set(), []
        for i in range(t):
            expect.append(bool(mask[r, i]) and ids[r, i] not in seen)
            if mask[r, i]:
                seen.add(ids[r, i])
        assert first[r].tolist() == expect


def test_dc_pdd_is_oriented_higher_is_member():
    """Confidently predicted tokens that are rare in the corpus: a member; the same tokens unlikely: a non-member."""
    rng = np.random.default_rng(1)
    v, t = 64, 30
    ids = np.tile(rng.permutation(v)[:t], (2, 1))
    logprob = np.stack([np.log(rng.uniform(0.3, 0.9, t)), np.log(rng.uniform(1e-5, 1e-3, t))])
    table = FreqTable(rng.integers(0, 1000, size=v), "x")
    got = score_batch(batch_of(logprob, ids, np.ones((2, t), bool), {"freq_table": table}), ["dc_pdd"])["dc_pdd"]
    assert got[0] > got[1] and REGISTRY["dc_pdd"].doc


def test_ids_outside_the_table_are_refused():
    ids, mask = np.array([[1, 5, 2]]), np.ones((1, 3), bool)
    table = {"freq_table": FreqTable(np.ones(4, np.int64), "x")}
    with pytest.raises(UserError, match="outside the frequency table's vocabulary of 4.*another tokenizer"):
        score_batch(batch_of(np.zeros((1, 3)), ids, mask, table), ["dc_pdd"])
    padding = batch_of(np.zeros((1, 3)), ids, np.array([[1, 0, 1]], bool), {"freq_table": np.full(4, 0.25)})
    assert score_batch(padding, ["dc_pdd"])["dc_pdd"][0] > 0  # a padding id is never read


def test_counting_equals_a_counter_over_encode(tiny):
    tok = tiny.tokenizer
    counts = count_tokens(tok, CORPUS, freq.tokenizer_vocab_size(tok))
    want = Counter(i for text in CORPUS for i in tok.encode(text).ids)
    assert counts.dtype == np.int64 and counts.shape == (tok.get_vocab_size(with_added_tokens=True),)
    assert {i: int(c) for i, c in enumerate(counts) if c} == dict(want)
    cut = count_tokens(tok, CORPUS, counts.size, max_tokens=3)
    want_cut = Counter(i for text in CORPUS for i in tok.encode(text).ids[:3])
    assert {i: int(c) for i, c in enumerate(cut) if c} == dict(want_cut)
    table = FreqTable.from_texts(tok, CORPUS)
    np.testing.assert_array_equal(table.counts, counts)
    p = table.probabilities()
    np.testing.assert_allclose(p, (counts + 1) / (counts.sum() + counts.size), rtol=1e-15)
    assert p.sum() == pytest.approx(1.0, abs=1e-12) and table.total == counts.sum()
    with pytest.raises(ValueError, match="outside a vocabulary of 5"):
        count_tokens(tok, CORPUS, 5)


def test_save_load_round_trip_and_bad_files(table, tiny, tmp_path):
    path = table.save(tmp_path / "t.npz")
    back = FreqTable.load(path, tiny.tokenizer, tiny.name)
    np.testing.assert_array_equal(back.counts, table.counts)
    np.testing.assert_array_equal(back.probabilities(), table.probabilities())
    assert back.sha256() == table.sha256() and back.tokenizer_sha256 == tokenizer_sha256(tiny.tokenizer)
    assert (back.tokenizer_name, back.total, back.vocab_size, back.path) == (tiny.name, table.total,
                                                                           table.vocab_size, str(path))
    assert freq.for_model(path, tiny).sha256() == table.sha256()
    with pytest.raises(UserError, match="not found"):
        freq.load(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a table")
    with pytest.raises(UserError, match="not a token-frequency table"):
        freq.load(tmp_path / "junk.npz")
    np.savez_compressed(tmp_path / "other.npz", counts=np.ones(3, np.int64), meta=np.array(json.dumps({"a": 1})))
    with pytest.raises(UserError, match="not a token-frequency table"):
        freq.load(tmp_path / "other.npz")
    meta = {**table.to_meta(), "total": table.total + 1}
    np.savez_compressed(tmp_path / "bad.npz", counts=table.counts, meta=np.array(json.dumps(meta)))
    with pytest.raises(UserError, match="do not match the recorded totals"):
        freq.load(tmp_path / "bad.npz")


def test_a_table_from_another_tokenizer_is_refused(table, tiny, tmp_path):
    other = Tokenizer.from_str(tiny.tokenizer.to_str())
    assert tokenizer_sha256(other) == table.tokenizer_sha256  # the identity is the tokenizer's content
    other.add_special_tokens(["<|other|>"])
    path = table.save(tmp_path / "t.npz")
    with pytest.raises(UserError, match=rf"{path}.* the tokenizer of '{tiny.name}'.*model 'gpt-x' has a different "
                                        "tokenizer.*freq-table --model gpt-x"):
        FreqTable.load(path, other, "gpt-x")
    with pytest.raises(UserError, match="different tokenizer"):
        table.check_tokenizer(other)
    table.check_tokenizer(tiny.tokenizer)


def test_missing_table_is_refused_before_scoring(tiny, tmp_path):
    out = tmp_path / "r.jsonl"
    for resources in (None, {}, {"freq_table": None}):
        with pytest.raises(UserError, match=r"'dc_pdd' needs a freq_table: make one with `mia-jax freq-table "
                                            r"--model M --corpus FILE --out T.npz`.*--freq-table T.npz"):
            runner.score_texts(tiny, ["some text here"], ["loss", "dc_pdd"], out_path=out, resources=resources)
        assert not out.exists()
    with pytest.raises(UserError, match="needs a freq_table"):
        runner.score_dataset(tiny, ["some text here"], ["dc_pdd"])


def test_runner_scores_match_the_loop_on_a_tiny_model(tiny, table):
    texts = wikimia(32).texts[:5] + ["the the the the the the", "x"]
    records = runner.score_texts(tiny, texts, ["dc_pdd", "loss"], batch_size=4, progress=False,
                                 resources={"freq_table": table})
    stats_fn = score_step.make_stats_fn(tiny)
    from flax import nnx

    _, state = nnx.split(tiny.model)
    for text, rec in zip(texts, records):
        ids = batching.encode(tiny, [text])[0].ids
        if len(ids) < 2:
            assert rec["scores"]["dc_pdd"] is None and rec.get("skip_reason")
            continue
        lp = np.asarray(stats_fn(state, jnp.asarray([ids])).logprob, np.float64)
        want = dcpdd_loop(lp, np.array([ids[1:]]), np.ones_like(lp, bool), table.counts)[0]
        assert rec["scores"]["dc_pdd"] == pytest.approx(want, rel=1e-5, abs=1e-9)
        assert 0 < rec["scores"]["dc_pdd"] <= A_CLIP


def _freq_args(argv):
    parser = argparse.ArgumentParser(prog="mia-jax")
    freq_table.add_arguments(parser.add_subparsers(dest="command", required=True).add_parser(freq_table.NAME))
    return parser.parse_args(argv)


def test_freq_table_command_end_to_end(tiny_llama_dir, tiny, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"body": t}) + "\n" for t in CORPUS))
    out = tmp_path / "t.npz"
    args = _freq_args(["freq-table", "--model", str(tiny_llama_dir), "--corpus", str(corpus), "--text-field", "body",
                       "--out", str(out), "--no-progress"])
    made = freq_table.run(args)
    line = capsys.readouterr().out.strip()
    want = Counter(i for text in CORPUS for i in tiny.tokenizer.encode(text).ids)
    assert line == (f"freq-table: {len(CORPUS)} documents, {sum(want.values())} tokens, {len(want)} distinct tokens "
                    f"(of {made.vocab_size}) counted with the tokenizer of {tiny.name} -> {out}")
    back = freq.for_model(out, tiny)
    assert {i: int(c) for i, c in enumerate(back.counts) if c} == dict(want)
    assert back.corpus_files == {str(corpus.resolve()): made.corpus_files[str(corpus.resolve())]}
    assert back.meta["n_documents"] == len(CORPUS) and back.meta["text_field"] == "body"
    with pytest.raises(UserError, match="neither a 'text' nor an 'input' field"):
        freq_table.run(_freq_args(["freq-table", "--model", str(tiny_llama_dir), "--corpus", str(corpus), "--out",
                                 str(out), "--no-progress"]))
    with pytest.raises(SystemExit):  # a count below 1: refused when parsed (entry.positive_int)
        _freq_args(["freq-table", "--model", str(tiny_llama_dir), "--max-tokens", "0", "--out", str(out)])
    assert "--max-tokens: must be" in capsys.readouterr().err
    with pytest.raises(UserError, match="is a folder"):
        freq_table.run(_freq_args(["freq-table", "--model", str(tiny_llama_dir), "--out", str(tmp_path)]))


def test_freq_table_command_default_corpus_is_the_pile_sample(tiny_llama_dir, tmp_path, capsys):
    args = _freq_args(["freq-table", "--model", str(tiny_llama_dir), "--out", str(tmp_path / "p.npz"),
                       "--max-tokens", "1024", "--no-progress"])
    table = freq_table.run(args)
    assert list(table.corpus_files) == [str(freq.default_corpus().resolve())]
    assert table.meta["n_documents"] == 600 and table.meta["max_tokens"] == 1024
    assert capsys.readouterr().out.startswith("freq-table: 600 documents, ")


def test_tokenizer_alone_is_the_models_tokenizer(tiny_llama_dir, tiny, tmp_path):
    tok, name = freq.load_tokenizer(str(tiny_llama_dir))
    assert tokenizer_sha256(tok) == tokenizer_sha256(tiny.tokenizer) and name == tiny.name
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_llama_dir)
    from_gguf = models.load(str(gguf_path))
    tok, name = freq.load_tokenizer(str(gguf_path))
    assert tokenizer_sha256(tok) == tokenizer_sha256(from_gguf.tokenizer) and name == from_gguf.name
    tok, _ = freq.load_tokenizer(str(gguf_path), tokenizer_path=str(tiny_llama_dir / "tokenizer.json"))
    assert tokenizer_sha256(tok) == tokenizer_sha256(tiny.tokenizer)
    with pytest.raises(UserError, match="no such local path"):
        freq.load_tokenizer(str(tmp_path / "nowhere"))
