"""The n-gram coverage attack (mia_jax.methods.ngram_coverage): the coverage by hand and against a float64 reference
written from the paper's definition, its orientation on a text the model reproduces, the registered method through the
runner and `mia-jax eval` on the tiny random Llama (finite, seeded, sharing SaMIA's samples), and bad options."""
import functools
import json

import numpy as np
import pytest

from mia_jax.engine import generate, runner
from mia_jax.evaluation import metrics
from mia_jax import models
from mia_jax.methods import ngram_coverage as ng
from mia_jax.methods import samia as sm
from mia_jax.cli import main
from mia_jax.errors import UserError
from mia_jax.scorers import MULTI_PASS
from mia_jax.methods import sampling
from reference import ngram_coverage_ref, sliding_window_coverage_ref


# ---- the coverage


def test_coverage_by_hand():
    ref = "the cat sat on the mat".split()
    assert ng.coverage(ref, ref, 3) == 1.0  # the suffix itself: fully covered
    assert ng.coverage("a dog ran off far away".split(), ref, 3) == 0.0  # no shared 3-gram
    assert ng.coverage("the cat sat in a hat".split(), ref, 3) == 3 / 6  # "the cat sat"
    assert ng.coverage("a the cat sat on x".split(), ref, 3) == 4 / 6  # two overlapping 3-grams: words 1..4
    assert ng.coverage("on the mat the cat sat".split(), ref, 3) == 1.0  # both halves, in another order
    assert ng.coverage("the cat sat in a hat".split(), ref, 4) == 0.0  # no 4-gram
    assert ng.coverage("cat sat".split(), ref, 3) == 0.0  # shorter than n (the authors' too_short)
    assert ng.coverage([], ref, 1) == 0.0 and ng.coverage("x".split(), [], 1) == 0.0
    assert ng.coverage("the dog".split(), ref, 1) == 0.5  # n = 1: the shared words
    # whole words only: the authors' character match would also count "the cat sat" inside "the cat satisfied"
    assert ng.coverage("the cat sat".split(), "the cat satisfied".split(), 3) == 0.0


def test_words_are_the_authors_casual_tokens():
    assert ng.words("Hello, world! It's 3.5% :)") == ["Hello", ",", "world", "!", "It's", "3.5", "%", ":)"]
    # punctuation apart: "mat." matches "mat" followed by "."
    assert ng.coverage(ng.words("on the mat."), ng.words("the cat sat on the mat. Then"), 3) == 1.0


def random_cases(seed: int, max_vocab: int, max_words: int, count: int = 400):
    """``count`` seeded (candidate, reference, n) cases: word lists over a small vocabulary (so n-grams repeat)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(1, 5))
        vocab = [f"w{i}" for i in range(int(rng.integers(2, max_vocab)))]
        cand = list(rng.choice(vocab, int(rng.integers(0, max_words))))
        yield cand, list(rng.choice(vocab, int(rng.integers(0, max_words)))), n


def test_coverage_matches_the_float64_reference():
    for cand, ref, n in random_cases(0, 6, 14):
        assert ng.coverage(cand, ref, n) == pytest.approx(ngram_coverage_ref(cand, ref, n), abs=1e-15), (cand, ref, n)


def test_coverage_equals_the_authors_sliding_window():
    """Their span search records the union of the matching n-grams (for every end, the longest match ending there):
    the same coverage, on word-sequence matches."""
    for cand, ref, n in random_cases(1, 5, 16):
        assert ng.coverage(cand, ref, n) == pytest.approx(sliding_window_coverage_ref(cand, ref, n), abs=1e-15), \
            (cand, ref, n)


def test_from_samples_takes_the_maximum():
    refs = ["the cat sat on the mat", "one two three four", "x y z"]
    samples = [["a dog ran off far away", "the cat sat in a hat", "the cat sat on x y"], ["five six"], []]
    got = ng.ngram_coverage_from_samples(samples, refs)
    np.testing.assert_array_equal(got, [max(0.0, 3 / 6, 4 / 6), 0.0, np.nan])
    assert got.dtype == np.float64
    assert ng.ngram_coverage_from_samples([["one two three"]], ["one two three four"], min_n=4)[0] == 0.0
    with pytest.raises(ValueError):
        ng.ngram_coverage_from_samples([[]], refs)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3", None])
def test_bad_min_n(bad):
    with pytest.raises(UserError, match="minimum n-gram length"):
        ng.coverage(["a"], ["a"], bad)
    with pytest.raises(UserError):
        sampling.resolve("ngram_coverage", {"min_n": bad})


def test_resolve_defaults_and_unknown_options():
    drawn, scored = sampling.resolve("ngram_coverage", {"n_samples": 4})
    assert drawn == {**ng.DEFAULT_SAMPLING, "n_samples": 4} and scored == {"min_n": 3}
    samia_drawn, _ = sampling.resolve("samia", None)
    assert samia_drawn["top_k"] == 50 and samia_drawn["top_p"] is None and samia_drawn["n_samples"] == 10
    with pytest.raises(UserError, match="unknown ngram_coverage option"):
        sampling.resolve("ngram_coverage", {"n": 3})
    with pytest.raises(UserError, match="unknown samia option"):
        sampling.resolve("samia", {"min_n": 3})


# ---- on the tiny random Llama (context 64)

TEXTS = [
    "The film was released in the United States by a small studio in the spring",
    "He was born in the city of London and studied history at the university there",
    "The station opened in the year after the war and closed again some decades later on",
    "Alone",  # one word: no prefix
]


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


def test_top_p_reaches_the_sampler(loaded):
    """The nucleus filter the authors sample with: a tiny top-p keeps only the most likely token (greedy)."""
    texts = TEXTS[:2]
    want = generate.generate(loaded, [sm.split_prefix(t)[0] for t in texts], max_new_tokens=6)
    got = sm.sample_continuations(loaded, texts, n_samples=2, max_new_tokens=6, top_k=None, top_p=1e-6,
                                  progress=False)
    assert got.samples == [[w, w] for w in want]
    nucleus = sm.sample_continuations(loaded, texts, n_samples=2, max_new_tokens=6, top_k=None, top_p=0.95,
                                      progress=False)
    assert nucleus.samples != got.samples


def test_orientation_a_reproduced_suffix_scores_higher(loaded):
    """A text whose suffix is the model's own greedy continuation of its prefix (a text it reproduces) is covered
    fully; the same prefix with another suffix is not: higher = member."""
    prefix = "The film was released in the United States by"
    cont = generate.generate(loaded, [prefix], max_new_tokens=12)[0]
    k, c = len(prefix.split()), len(cont.split())
    assert len(ng.words(cont)) >= 3
    member = prefix + " " + cont
    other = prefix + " " + " ".join(["zebra", "quietly", "under", "blue", "lamps"][:c] * 3)
    ratio = (k + 0.5) / (k + c)  # the prefix is exactly its k words
    opts = {"n_samples": 2, "top_k": 1, "max_new_tokens": 12, "prefix_ratio": ratio}
    recs = runner.score_dataset(loaded, [member, other], ["ngram_coverage"], progress=False,
                                pass_options={"ngram_coverage": opts})
    got = metrics.scores_by_method(recs, ["ngram_coverage"])["ngram_coverage"]
    assert got[0] == 1.0 and got[1] < got[0]


def test_runner_equals_the_library_and_shares_samia_samples(loaded, monkeypatch):
    calls = []
    draw = sm.sample_continuations
    counted = functools.wraps(draw)(lambda *a, **kw: calls.append(kw) or draw(*a, **kw))  # its signature: draw's
    monkeypatch.setattr(sm, "sample_continuations", counted)
    opts = {"n_samples": 3, "seed": 1}
    both = ["samia", "samia_zlib", "ngram_coverage"]
    report = {}
    recs = runner.score_dataset(loaded, TEXTS, both, progress=False, batch_size=2, report=report,
                                pass_options={"samia": opts, "ngram_coverage": {**sampling.resolve("samia", opts)[0]}})
    batches = report["samia"]["batches_computed"]
    assert sorted(report) == ["main", "samia"] and len(calls) == batches >= 2  # one draw a batch for the three
    drawn = draw(loaded, TEXTS, progress=False, **sampling.resolve("samia", opts)[0])
    got = metrics.scores_by_method(recs, both)
    np.testing.assert_allclose(got["samia"], sm.samia_from_samples(drawn.samples, drawn.references), rtol=1e-12)
    np.testing.assert_allclose(got["ngram_coverage"], ng.ngram_coverage_from_samples(drawn.samples, drawn.references),
                               rtol=1e-12)
    assert np.isnan(got["ngram_coverage"][3]) and "too few" in recs[3]["nan_reasons"]["ngram_coverage"]
    calls.clear()
    again = {}
    alone = runner.score_dataset(loaded, TEXTS, ["samia", "ngram_coverage"], progress=False, batch_size=2,
                                 pass_options={"samia": opts, "ngram_coverage": {"n_samples": 2}}, report=again)
    assert len(calls) == 2 * again["samia"]["batches_computed"]  # other options: two draws a batch
    assert {c["top_p"] for c in calls} == {None, 0.95}
    assert np.all(np.isfinite(metrics.scores_by_method(alone, ["ngram_coverage"])["ngram_coverage"][:3]))


def test_bad_sampling_option_is_a_user_error(loaded):
    with pytest.raises(UserError, match="top_p"):
        runner.score_dataset(loaded, TEXTS[:2], ["ngram_coverage"], progress=False,
                             pass_options={"ngram_coverage": {"top_p": 1.5, "n_samples": 1}})


# ---- mia-jax eval


def _data(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"input": t, "label": i % 2}) for i, t in enumerate(TEXTS[:3] * 2)) + "\n")
    return data


def _eval(tiny_llama_dir, data, out, *extra):
    return main(["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "ngram_coverage",
                 "--out", str(out), "--no-progress", "--no-blind", "--n-bootstrap", "10", *extra])


def _scores(out):
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return [r["scores"]["ngram_coverage"] for r in recs]


def test_eval_finite_seeded_and_fingerprinted(tiny_llama_dir, tmp_path, capsys):
    data = _data(tmp_path)
    opts = ("--ngram-samples", "2", "--ngram-seed", "5")
    assert _eval(tiny_llama_dir, data, tmp_path / "a", *opts) == 0
    assert _eval(tiny_llama_dir, data, tmp_path / "b", *opts) == 0
    a, b = _scores(tmp_path / "a"), _scores(tmp_path / "b")
    assert len(a) == 6 and all(s is not None and 0 <= s <= 1 for s in a)
    assert a == b  # the same seed, the same samples
    fp = json.loads((tmp_path / "a" / "run.json").read_text())["method_resources"]["fingerprint"]["ngram_coverage"]
    assert fp == {**ng.DEFAULT_SAMPLING, "n_samples": 2, "seed": 5, "min_n": 3}
    capsys.readouterr()
    assert _eval(tiny_llama_dir, data, tmp_path / "a", "--ngram-samples", "3", "--ngram-seed", "5") == 2
    assert "different" in capsys.readouterr().err.lower()


def test_eval_help_and_bad_options(tiny_llama_dir, tmp_path, capsys):
    assert main(["eval", "--help"]) == 0
    text = capsys.readouterr().out
    assert "ngram_coverage" in text and "--ngram-samples" in text and "--ngram-min-n" in text
    data = _data(tmp_path)
    bad = [("--ngram-min-n", "0"), ("--ngram-samples", "-1"), ("--ngram-sampling", "greedy"),
           ("--ngram-sampling", "samia", "--ngram-seed", "1")]
    for i, extra in enumerate(bad):
        assert _eval(tiny_llama_dir, data, tmp_path / f"bad{i}", *extra) == 2, extra
        assert capsys.readouterr().err.strip()
        assert not (tmp_path / f"bad{i}").exists()
    argv = ["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "loss", "--ngram-min-n", "4",
            "--out", str(tmp_path / "c"), "--no-progress", "--no-blind"]
    assert main(argv) == 2 and "'ngram_coverage' is not among --methods" in capsys.readouterr().err


def test_registered_like_samia():
    method = MULTI_PASS["ngram_coverage"]
    assert method.kinds == MULTI_PASS["samia"].kinds and "3-grams" in method.doc
    col = np.array([[0.1, 2.0, 0.7], [np.nan, np.nan, np.nan]])
    scores, _ = method.combine(np.zeros(2), col, ["a", "b"])
    np.testing.assert_array_equal(scores, [0.7, np.nan])
