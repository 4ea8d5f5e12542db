"""Tag&Tab (scorers.tagtab): the formula against a float64 NumPy reference, the keywords chosen in known sentences and
their token positions, the orientation, a text without keyword, ``mia-jax eval`` on the tiny Llama (packed rows)
against per-text float64 references, and the refusals (bad K, K without the method, --window)."""
import json

import jax.numpy as jnp
import numpy as np
import pytest
from reference import ref_token_arrays
from test_acmia import refused

from mia_jax import batching, device_scores, models
from mia_jax.cli import main
from mia_jax.errors import UserError
from mia_jax.scorers import TokenBatch, score_batch, tagtab
from mia_jax.stats import TokenStats

SENTENCE = ("Dr. Henry Jekyll met Mr. Utterson in London on a cold evening. "
            "They talked about the strange case for hours.")


def ref_tag_tab(logprob, mask, keywords) -> np.ndarray:
    """Per row: the float64 mean of logprob over the scored keyword tokens, NaN for none (loops)."""
    out = []
    for lp, m, kw in zip(np.asarray(logprob, np.float64), mask, keywords):
        vals = [float(v) for v, a, b in zip(lp, m, kw) if a and b]
        out.append(sum(vals) / len(vals) if vals else np.nan)
    return np.array(out)


def stats_of(logprob):
    z = np.zeros_like(logprob)
    return TokenStats(logprob, z, z + 1, z, z + 1, logprob)


def test_formula_against_float64_reference():
    rng = np.random.default_rng(0)
    lp = (-rng.exponential(3.0, (5, 13))).astype(np.float32)
    mask = rng.random((5, 13)) < 0.8
    kw = rng.random((5, 13)) < 0.4
    kw[3] = False  # a row without keyword: NaN
    want = ref_tag_tab(lp, mask, kw)
    got = np.asarray(tagtab.tag_tab(jnp.asarray(lp), jnp.asarray(mask), keywords=jnp.asarray(kw)))
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    assert np.isnan(got[3]) and np.isfinite(got[[0, 1, 2, 4]]).all()
    via = device_scores(stats_of(lp), mask, ["tag_tab"], resources={tagtab.RESOURCE: kw})["tag_tab"]
    np.testing.assert_allclose(np.asarray(via), want, rtol=1e-6, equal_nan=True)
    host = score_batch(TokenBatch(stats_of(lp), mask, resources={tagtab.RESOURCE: kw}), ["tag_tab"])["tag_tab"]
    np.testing.assert_allclose(host, want, rtol=1e-6, equal_nan=True)


def test_orientation_higher_loglik_on_keywords_is_member():
    kw = np.array([[False, True, True, False]] * 2)
    lp = np.array([[-5.0, -0.1, -0.2, -5.0], [-0.1, -4.0, -6.0, -0.1]], np.float32)  # member: keywords likely
    got = np.asarray(tagtab.tag_tab(lp, np.ones_like(kw), keywords=kw))
    assert got[0] > got[1]
    np.testing.assert_allclose(got, [-0.15, -5.0], rtol=1e-6)


def test_keywords_chosen_per_sentence_rarest_first():
    spans = tagtab.keyword_spans(SENTENCE, 2)
    words = [w for _, _, w in spans]
    assert words == ["jekyll", "utterson", "talked", "strange"]  # the 2 rarest words of each sentence, in order
    for start, end, word in spans:
        assert tagtab.normalize(SENTENCE[start:end]) == word
    assert all(tagtab.entropy(w) <= tagtab.entropy(o) for w in ("jekyll", "utterson")
               for o in ("dr", "henry", "met", "london", "cold", "evening"))
    # K = 4 takes 4 per sentence; punctuation around a word stays out of its span ("Mr." -> "Mr")
    assert len(tagtab.keyword_spans(SENTENCE, 4)) == 8


def test_keyword_token_positions_on_a_known_sentence(tiny_llama_dir):
    tok = models.load(str(tiny_llama_dir)).tokenizer
    text = "We saw the Aardvark near Zanzibar yesterday morning, and then we went home."
    enc = tok.encode(text)
    mask = tagtab.keyword_masks(2, tok, [text])[0]
    assert mask.shape == (len(enc.ids),)
    spans = tagtab.keyword_spans(text, 2)
    assert [w for _, _, w in spans] == ["aardvark", "zanzibar"]
    want = [j for j, (s, e) in enumerate(enc.offsets) if e > s and any(s < b and e > a for a, b, _ in spans)]
    assert list(np.flatnonzero(mask)) == want and want
    covered = "".join(text[s:e] for (s, e), m in zip(enc.offsets, mask) if m)
    assert "Aardvark" in covered and "Zanzibar" in covered and "saw" not in covered and "," not in covered


def test_text_without_keyword_sentence_falls_back_then_nan():
    # no sentence of 7-40 words: the whole text is one sentence (a score); no word at all: no keyword (NaN)
    assert [w for _, _, w in tagtab.keyword_spans("Zanzibar. Quokka!", 4)] == ["zanzibar", "quokka"]
    assert tagtab.keyword_spans("... !!! ,", 4) == [] and tagtab.keyword_spans("", 4) == []


def test_bad_k_and_missing_mask_are_user_errors(tiny_llama_dir):
    tok = models.load(str(tiny_llama_dir)).tokenizer
    for bad in (0, -1, 2.5, "3", True):
        with pytest.raises(UserError, match="integer >= 1"):
            tagtab.keyword_masks(bad, tok, ["a text"])
    lp = np.zeros((1, 3), np.float32)
    with pytest.raises(UserError, match="keyword mask"):
        device_scores(stats_of(lp), np.ones((1, 3), bool), ["tag_tab"])
    with pytest.raises(UserError, match="tag_tab_keywords"):
        device_scores(stats_of(lp), np.ones((1, 3), bool), ["tag_tab"], resources={tagtab.RESOURCE: np.ones((1, 4))})


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    texts = [SENTENCE, "A short line.", "Quokkas live on Rottnest Island near Perth in Western Australia, people say.",
             "The committee approved the budget after a long debate about schools and roads in the northern district."
             " Critics said the plan ignored rural towns.", "Hi there"]
    rows = [{"input": t, "label": i % 2} for i, t in enumerate(texts * 3)]
    path = tmp_path_factory.mktemp("tagtab") / "small.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, [r["input"] for r in rows]


def test_eval_end_to_end_against_per_text_reference(tiny_llama_dir, data_file, tmp_path, capsys):
    path, texts = data_file
    out = tmp_path / "run"
    base = ["eval", "--model", str(tiny_llama_dir), "--data", str(path), "--n-bootstrap", "10", "--no-blind",
            "--no-progress"]
    assert main([*base, "--methods", "tag_tab", "loss", "--tag-tab-k", "2", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert json.loads((out / "config.json").read_text())[tagtab.RESOURCE] == 2
    loaded = models.load(str(tiny_llama_dir))
    vocab = batching.real_vocab_size(loaded)
    for text, rec in zip(texts, records):
        ids = loaded.tokenizer.encode(text).ids[: loaded.max_length]
        logits = np.asarray(loaded.model(jnp.asarray([ids], jnp.int32)), np.float64)[:, :-1]
        lp = ref_token_arrays(logits, np.asarray(ids[1:])[None], vocab_size=vocab)[0]
        kw = tagtab.keyword_masks(2, loaded.tokenizer, [text])[0][1: len(ids)][None]
        want = ref_tag_tab(lp, np.ones_like(kw), kw)[0]
        assert np.isfinite(rec["scores"]["tag_tab"]), text  # every text here has a word past its first token
        np.testing.assert_allclose(rec["scores"]["tag_tab"], want, rtol=1e-4, atol=1e-5, err_msg=text)
    default = tmp_path / "default"
    assert main([*base, "--methods", "tag_tab", "--out", str(default)]) == 0
    assert json.loads((default / "config.json").read_text())[tagtab.RESOURCE] == tagtab.DEFAULT_K
    refused(capsys, [*base, "--methods", "loss", "--tag-tab-k", "2", "--out", str(tmp_path / "x")],
            "--tag-tab-k is given but 'tag_tab' is not among --methods")
    refused(capsys, [*base, "--methods", "tag_tab", "--tag-tab-k", "0", "--out", str(tmp_path / "y")],
            "--tag-tab-k")
    refused(capsys, [*base, "--methods", "tag_tab", "--window", "8", "--out", str(tmp_path / "z")],
            "--window does not score tag_tab")
    assert not any((tmp_path / d).exists() for d in "xyz")
    capsys.readouterr()
    main(["eval", "--help"])
    assert "--tag-tab-k" in capsys.readouterr().out
