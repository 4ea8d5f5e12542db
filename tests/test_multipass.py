"""Multi-pass methods: the same scoring path on lowercased text (lowercase) or another model (ref)."""
import json

import numpy as np
import pytest
from helpers import write_tiny_llama

from mia_jax.evaluation import metrics
from mia_jax import models
from mia_jax.engine import runner
from mia_jax.data import wikimia
from mia_jax.errors import UserError
from mia_jax.scorers import score_batch

TEXTS = wikimia(32).texts[:6] + ["all lower case words here", "12345 67890 !!"]


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A reference model with another vocabulary size and tokenizer."""
    path = tmp_path_factory.mktemp("ref_llama")
    write_tiny_llama(path, seed=7, vocab_size=400, hidden_size=48, num_attention_heads=6, num_key_value_heads=3)
    return models.load(str(path))


def loss_of(loaded, texts):
    return metrics.scores_by_method(runner.score_texts(loaded, texts, ["loss"], progress=False), ["loss"])["loss"]


def test_lowercase_is_the_log_ppl_ratio(tiny, tmp_path):
    recs = runner.score_dataset(tiny, TEXTS, ["min_k@0.2", "lowercase"], out_dir=tmp_path, progress=False)
    want = (-loss_of(tiny, [t.lower() for t in TEXTS])) / (-loss_of(tiny, TEXTS))
    got = metrics.scores_by_method(recs, ["lowercase"])["lowercase"]
    np.testing.assert_allclose(got[:6], want[:6], rtol=1e-6)
    for i in (6, 7):  # nothing to lowercase: NaN, with the reason on the record
        assert (
            recs[i]["scores"]["lowercase"] is None
            and "lowercasing changes nothing" in recs[i]["nan_reasons"]["lowercase"]
        )
        assert recs[i]["scores"]["min_k@0.2"] is not None
    assert list(recs[0]["scores"]) == ["min_k@0.2", "lowercase"]  # the helper 'loss' pass is not reported
    assert {p.name for p in (tmp_path / "passes").iterdir()} == {"main.jsonl", "lowercase.jsonl"}
    assert [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()] == recs


def test_ref_uses_each_models_own_tokenizer(tiny, other):
    assert other.tokenizer.encode(TEXTS[0]).ids != tiny.tokenizer.encode(TEXTS[0]).ids
    recs = runner.score_dataset(tiny, TEXTS, ["loss", "ref"], ref=other, progress=False)
    got = metrics.scores_by_method(recs, ["ref"])["ref"]
    np.testing.assert_allclose(got, loss_of(tiny, TEXTS) - loss_of(other, TEXTS), rtol=1e-6)


def test_ref_needs_a_reference_model(tiny):
    with pytest.raises(UserError, match="reference model"):
        runner.score_dataset(tiny, TEXTS, ["ref"], progress=False)


def test_multipass_methods_are_not_single_pass():
    with pytest.raises(UserError, match="second pass"):
        score_batch(None, ["lowercase"])
