"""mia_jax.methods.samia: the prefix split, ROUGE-1 recall (by hand and against the rouge-score package with the
authors' whitespace tokens), the mean over samples, and sampling on a tiny random Llama: shapes, seeds, skipped texts,
greedy / top-1 equal to mia_jax.engine.generate, and a text's samples independent of the other texts in its batch."""
import numpy as np
import pytest

from mia_jax.engine import generate as G
from mia_jax.methods import samia
from mia_jax.errors import UserError
from mia_jax.models import checkpoint


def test_split_prefix():
    assert samia.split_prefix("a b  c\nd e", 0.5) == ("a b", "c d e")
    assert samia.split_prefix("one two three four", 0.25) == ("one", "two three four")
    assert samia.split_prefix("single", 0.5) == ("", "single")
    assert samia.split_prefix("", 0.5) == ("", "")
    for bad in (0, 1, 1.5):
        with pytest.raises(UserError, match="prefix ratio"):
            samia.split_prefix("a b", bad)
    assert samia.skip_reason("a b", 0.5) is None and samia.skip_reason("   ") == "samia: the text has no words"
    assert samia.skip_reason("a b", 0.3).startswith("samia: the text has 2 words, too few") and "at least 4" in \
        samia.skip_reason("a b", 0.3)
    assert samia.skip_reason("a b c d", 0.3) is None


PAIRS = [  # (candidate, reference, hand-computed recall)
    ("the cat sat on the mat", "the cat is on the the mat .", 5 / 8),  # 'the' clipped at 2 of 3
    ("The Cat", "the cat", 0.0),  # case-sensitive, as the authors' code
    ("mat. on", "on the mat.", 2 / 3),  # punctuation stays attached to its word
    ("a a a a", "a b", 1 / 2),
    ("", "a b", 0.0),
]


def test_rouge1_recall_by_hand():
    for cand, ref, want in PAIRS:
        assert samia.rouge1_recall(cand, ref) == pytest.approx(want, abs=1e-15), (cand, ref)
    assert samia.rouge1_recall("a b", "") == 0.0


def test_rouge1_recall_equals_rouge_score_with_whitespace_tokens():
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")

    class Whitespace:
        def tokenize(self, text):
            return text.split()

    scorer = rouge_scorer.RougeScorer(["rouge1"], tokenizer=Whitespace())
    rng = np.random.default_rng(0)
    vocab = ["the", "The", "cat", "mat.", "on", "a", ",", "sat", "dog"]
    pairs = [(c, r) for c, r, _ in PAIRS if c] + [
        (" ".join(rng.choice(vocab, rng.integers(1, 12))), " ".join(rng.choice(vocab, rng.integers(1, 12))))
        for _ in range(50)]
    for cand, ref in pairs:
        want = scorer.score(ref, cand)["rouge1"].recall  # score(target, prediction)
        assert samia.rouge1_recall(cand, ref) == pytest.approx(want, abs=1e-12), (cand, ref)


def test_samia_from_samples():
    refs = ["alpha beta gamma delta", "one two three", "x y"]
    samples = [["alpha beta gamma delta"] * 3, ["four five", "six"], []]
    np.testing.assert_array_equal(samia.samia_from_samples(samples, refs), [1.0, 0.0, np.nan])
    mixed = [["alpha beta", "alpha beta gamma delta", "zzz"]]
    assert samia.samia_from_samples(mixed, refs[:1])[0] == pytest.approx((0.5 + 1 + 0) / 3)
    z = samia.samia_from_samples(mixed, refs[:1], zlib=True)[0]
    assert z == pytest.approx((0.5 * samia.zlib_length("alpha beta") + samia.zlib_length(mixed[0][1])) / 3)
    assert samia.zlib_length("a  b\n") == samia.zlib_length("a b") > 0
    with pytest.raises(ValueError):
        samia.samia_from_samples([[]], refs)


# ---- sampling on a tiny random Llama (context 64)

TEXTS = [
    "The film was released in the United States by a small studio in the spring",
    "He was born in the city of London and studied history at the university there",
    "",  # no words
    "Alone",  # one word: no prefix
    "The station opened in the year after the war and closed again some decades later on",
]


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return checkpoint.load(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def drawn(loaded):
    return samia.sample_continuations(loaded, TEXTS, n_samples=3, batch_size=2, seed=0, progress=False)


def test_scores_shapes_and_skipped_texts(loaded, drawn):
    scores, reasons = samia.samia_scores(loaded, TEXTS, n_samples=3, batch_size=2, seed=0, progress=False)
    assert set(scores) == set(samia.METHODS)
    for v in scores.values():
        assert v.shape == (len(TEXTS),) and v.dtype == np.float64
        assert set(np.flatnonzero(np.isnan(v))) == {2, 3}
        assert np.all(v[[0, 1, 4]] >= 0)
    assert reasons == {2: "samia: the text has no words",
                       3: "samia: the text has 1 word, too few for a prefix of 0.5 of its words (needs at least 2)"}
    assert drawn.reasons == reasons
    np.testing.assert_array_equal(scores["samia"], samia.samia_from_samples(drawn.samples, drawn.references))
    for i in (0, 1, 4):
        assert len(drawn.samples[i]) == 3 and drawn.budgets[i] >= 1
        prefix, ref = samia.split_prefix(TEXTS[i])
        assert (drawn.prefixes[i], drawn.references[i]) == (prefix, ref)
        tok = loaded.tokenizer
        assert drawn.budgets[i] == len(tok.encode(prefix + " " + ref).ids) - len(tok.encode(prefix).ids)
        assert all(1 <= n <= drawn.budgets[i] for n in drawn.n_tokens[i])
        assert len(set(drawn.samples[i])) > 1  # one key per sample
    assert drawn.samples[2] == drawn.samples[3] == [] and drawn.budgets[2] == drawn.budgets[3] == 0


def test_seeds(loaded, drawn):
    again = samia.sample_continuations(loaded, TEXTS, n_samples=3, batch_size=2, seed=0, progress=False)
    assert again.samples == drawn.samples
    other = samia.sample_continuations(loaded, TEXTS, n_samples=3, batch_size=2, seed=1, progress=False)
    assert all(other.samples[i] != drawn.samples[i] for i in (0, 1, 4))


def test_batch_does_not_change_a_texts_samples(loaded, drawn):
    for i in (0, 1, 4):  # alone (another batch size, prompt length and loop length) and in another order
        alone = samia.sample_continuations(loaded, [TEXTS[i]], n_samples=3, seed=0, progress=False)
        assert alone.samples[0] == drawn.samples[i]
    shuffled = samia.sample_continuations(loaded, TEXTS[::-1], n_samples=3, batch_size=3, seed=0, progress=False)
    assert shuffled.samples[::-1] == drawn.samples


def test_greedy_and_top1_equal_generate(loaded):
    texts = [TEXTS[0], TEXTS[4]]
    prefixes = [samia.split_prefix(t)[0] for t in texts]
    want = G.generate(loaded, prefixes, max_new_tokens=6)
    for kw in (dict(temperature=0.0), dict(temperature=1.0, top_k=1)):
        got = samia.sample_continuations(loaded, texts, n_samples=2, max_new_tokens=6, progress=False, **kw)
        assert got.samples == [[w, w] for w in want], kw


def test_long_text_budget_and_bad_options(loaded):
    long = " ".join(["history"] * 80)  # the reference alone exceeds half the context
    drawn = samia.sample_continuations(loaded, [long], n_samples=1, progress=False)
    assert drawn.budgets == [32] and drawn.n_tokens[0][0] <= 32
    for bad in (dict(n_samples=0), dict(batch_size=0), dict(max_new_tokens=64), dict(top_k=0),
                dict(temperature=-1.0), dict(prefix_ratio=1.0)):
        with pytest.raises(UserError):
            samia.sample_continuations(loaded, TEXTS, progress=False, **bad)
    with pytest.raises(UserError, match="not one string"):
        samia.samia_scores(loaded, TEXTS[0], progress=False)
