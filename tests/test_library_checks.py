"""The library's argument checks (``mia_jax.checks``): what the scorers, the kernel and ``mia_jax.score`` cannot score
is one UserError, never a plausible number; and a NaN logit makes its text's every score NaN."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mia_jax
from mia_jax import scorers, scores_from_logits
from mia_jax.errors import UserError
from mia_jax import models
from mia_jax.scorers import LOGIT_METHODS, MULTI_PASS, REGISTRY
from mia_jax.scorers.base import register, register_multi_pass


def logits_case(seed=0, b=3, t=9, v=30):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, t, v)).astype(np.float32) * 2, rng.integers(0, v, (b, t)),
            np.ones((b, t), np.int32))


@pytest.mark.parametrize("k", [1.5, 0.0, -0.1, float("nan"), True, "0.2"])
def test_every_scorer_with_a_fraction_checks_it_itself(k):
    """Called directly (not through a method name), each formula that takes k refuses one outside (0, 1]; before
    this, min_k(k=1.5) of -1..-5 returned -2.142857 (the right answer for any k in (0, 1] is at least -3)."""
    logprob = jnp.array([[-1.0, -2.0, -3.0, -4.0, -5.0]])
    mask = jnp.ones((1, 5), bool)
    takes_k = [s for s in REGISTRY.values() if s.takes_k]
    assert {"min_k", "max_k", "min_k_pp", "gap_k"} <= {s.name for s in takes_k}
    for s in takes_k:
        arrays = {"logprob": logprob, "mask": mask, "mu": logprob * 0 - 3, "var": logprob * 0 + 1,
                  "max_logprob": logprob * 0 - 0.5, "entropy": logprob * 0 + 3, "rank": jnp.ones((1, 5), jnp.int32),
                  "ids": jnp.ones((1, 5), jnp.int32)}
        with pytest.raises(UserError, match="fraction in"):
            s.fn(*(arrays[a] for a in s.arrays), k=k)
    assert float(scorers.min_k(logprob, mask, k=1.0)[0]) == -3.0
    with pytest.raises(UserError, match=r"fraction in \(0, 1\]"):
        scores_from_logits(*logits_case(), methods=["min_k@1.5"])


@pytest.mark.parametrize("bad", ["int_logits", "float_ids", "negative_id", "id_too_large", "float_mask", "bool_ids"])
def test_scores_from_logits_refuses_what_it_cannot_score(bad):
    logits, ids, am = logits_case()
    if bad == "int_logits":
        logits = logits.astype(np.int32)
    elif bad == "float_ids":
        ids = ids.astype(np.float32)
    elif bad == "negative_id":
        ids[1, 4] = -3  # would wrap around to the vocabulary's end
    elif bad == "id_too_large":
        ids[0, 2] = 30
    elif bad == "float_mask":
        am = am.astype(np.float32)
    else:
        ids = ids > 3
    match = {"int_logits": "logits must be a floating", "float_ids": "ids must be an integer",
             "negative_id": r"token id -3, outside the vocabulary \[0, 30\)", "id_too_large": "token id 30",
             "float_mask": "attention_mask must be an integer or bool", "bool_ids": "ids must be an integer"}[bad]
    with pytest.raises(UserError, match=match):
        scores_from_logits(logits, ids, am, methods=["loss"])
    # an id out of range where the mask is 0 is padding: accepted
    if bad == "negative_id":
        am[1, 4] = 0
        assert np.isfinite(np.asarray(scores_from_logits(logits, ids, am, methods=["loss"])["loss"])).all()


def test_device_scores_checks_its_arrays():
    stats = mia_jax.token_stats(jnp.zeros((2, 4, 5)), jnp.zeros((2, 4), jnp.int32))
    mask = np.ones((2, 4), bool)
    for kwargs, match in [({"mask": mask.astype(np.float32)}, "mask must be an integer or bool"),
                          ({"stats": stats._replace(logprob=jnp.zeros((2, 4), jnp.int32))}, "stats.logprob must be"),
                          ({"ids": np.zeros((2, 4), np.float32), "methods": ["camia_calibrated"]}, "ids must be"),
                          ({"stats": stats._replace(mu=jnp.zeros((2, 3)))}, r"stats.mu has shape \(2, 3\)"),
                          ({"methods": []}, "methods is empty")]:
        args = {"stats": stats, "mask": mask, "methods": ["loss"], **kwargs}
        with pytest.raises(UserError, match=match):
            mia_jax.device_scores(args.pop("stats"), args.pop("mask"), args.pop("methods"), **args)


def test_a_nan_logit_makes_its_texts_every_score_nan():
    """One NaN logit (in a vocabulary row the text never uses): that text's every score is NaN, Min-K% included
    (a sort would have moved the NaN past the k lowest, a log-sum-exp that skipped it would have been finite); the
    other texts' scores are unchanged; also under jax.jit."""
    logits, ids, am = logits_case(1)
    clean = scores_from_logits(logits, ids, am)
    logits[1, 3, 29] = np.nan
    fn = jax.jit(scores_from_logits, static_argnames=("methods",))
    for got in (scores_from_logits(logits, ids, am), fn(logits, ids, am, methods=LOGIT_METHODS)):
        assert set(got) == set(LOGIT_METHODS)
        for m, v in got.items():
            v = np.asarray(v)
            assert np.isnan(v[1]), m
            np.testing.assert_allclose(v[[0, 2]], np.asarray(clean[m])[[0, 2]], rtol=1e-6, err_msg=m)
    am[1, 4] = 0  # the NaN predicts position 4, which is no longer scored (nor is position 5, whose context it was)
    am[1, 5:] = 0
    assert np.isfinite(np.asarray(scores_from_logits(logits, ids, am)["min_k@0.2"])).all()


def test_register_refuses_a_taken_name_and_a_missing_docstring():
    before = dict(REGISTRY), dict(MULTI_PASS)

    def shadow(logprob, mask):
        """Not the built-in."""
        return logprob.sum(-1)

    def undocumented(logprob, mask):
        return logprob.sum(-1)

    for name, fn, match in [("min_k", shadow, "'min_k' is already registered"),
                            ("lowercase", shadow, "'lowercase' is already registered"),
                            ("fresh_name", undocumented, "has no docstring"),
                            ("a@b", shadow, "without '@'")]:
        with pytest.raises(UserError, match=match):
            register(name)(fn)
    with pytest.raises(UserError, match="'loss' is already registered"):
        register_multi_pass("loss", pass_kind="lowercase")(shadow)
    assert (dict(REGISTRY), dict(MULTI_PASS)) == before  # nothing replaced, nothing half-registered


def test_score_takes_any_iterable_of_strings_and_refuses_the_rest(tiny_llama_dir):
    model = models.load(str(tiny_llama_dir))
    texts = ["The cat sat on the mat.", "Colorless green ideas sleep furiously."]
    want = mia_jax.score(model, texts, methods=["loss"])["loss"]
    for given in ((t for t in texts), tuple(texts), np.array(texts)):
        np.testing.assert_array_equal(mia_jax.score(model, given, methods=["loss"])["loss"], want)
    for texts_, methods, match in [("one text", ["loss"], "a single string"), ([1, 2], ["loss"], "text 0 is a int"),
                                   (5, ["loss"], "got int"), (texts, [], "methods is empty"),
                                   (texts, ["min_k"], None)]:
        if match is None:  # a bare min_k becomes one method per k
            assert set(mia_jax.score(model, texts_, methods=methods, k=[0.5])) == {"min_k@0.5"}
            with pytest.raises(UserError, match=r"fraction in 'min_k@1.5'"):
                mia_jax.score(model, texts_, methods=methods, k=[1.5])
            continue
        with pytest.raises(UserError, match=match):
            mia_jax.score(model, texts_, methods=methods)
