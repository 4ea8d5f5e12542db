"""EM-MIA: the iterations against a float64 reference of the authors' update rules (a hand-checked case too) and a
transcription of their loop, seeded blocks, orientation, the prefix pass's matrix against the model, and the command
line (finite scores, bad options refused with one line)."""
import json

import numpy as np
import pytest

from mia_jax.evaluation import metrics
from mia_jax import models
from mia_jax.engine import runner
from mia_jax.data import wikimia
from mia_jax.errors import UserError
from mia_jax.methods import em_mia as em
from tests.reference import em_mia_ref
from tests.test_recall import conditional_loss

DATA = wikimia(32)
TEXTS = [" ".join(t.split()[:6]) for t in DATA.texts[:6]]  # short: a text after another fits the tiny model's 64
LABELS = DATA.labels[:6]

HAND_R = np.array([[5., 6., 1., 2.], [1., 2., 5., 6.], [3., 3., 3., 3.], [2., 1., 2., 1.]])
HAND_INIT = np.array([4., 3., 2., 1.])


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


def test_hand_checked_rounds():
    # f0 = [4, 3, 2, 1]: pseudo-members {0, 1}; r = [1, 0, 1/2 (all ties), 1/2] -> f1 = -r
    np.testing.assert_allclose(em.em_iterations(HAND_R, HAND_INIT, 1), [-1, 0, -0.5, -0.5], atol=0)
    # f1's median is -1/2, so only text 1 is above it: r = [1, 1/3, 1/2, 1/6]
    np.testing.assert_allclose(em.em_iterations(HAND_R, HAND_INIT, 2), [-1, -1 / 3, -0.5, -1 / 6], rtol=1e-15)
    np.testing.assert_allclose(em_mia_ref(HAND_R, HAND_INIT, 2), [-1, -1 / 3, -0.5, -1 / 6], rtol=1e-15)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_iterations_match_the_float64_reference(seed):
    rng = np.random.default_rng(seed)
    n = 15
    ratio = 1 + 0.2 * rng.standard_normal((n, n))
    ratio[rng.random((n, n)) < 0.05] = np.nan  # no conditional score: left out of its row's AUROC
    ratio[3, :] = 1.0  # a prefix that changes nothing: all ties
    init = rng.standard_normal(n)
    init[2] = np.nan
    for t in (1, 3, 10):
        np.testing.assert_allclose(em.em_iterations(ratio, init, t), em_mia_ref(ratio, init, t), rtol=0, atol=1e-12)


def authors_loop(recall_all_scores, init, max_iter):
    """The update loop of gyuwankim/em-mia ``emmia.py`` (NegPref, AUC-ROC), as written there, on a matrix."""
    from sklearn.metrics import auc, roc_curve

    def calc_auc(scores, labels):
        return auc(*roc_curve(labels, scores)[:2])

    membership_scores = np.array(init, np.float64)
    membership_scores[np.isnan(membership_scores)] = 0
    for _ in range(max_iter):
        prefix_scores = np.array([calc_auc(recall_all_scores[idx], membership_scores > np.median(membership_scores))
                                  for idx in range(len(recall_all_scores))])
        membership_scores = -prefix_scores
        membership_scores[np.isnan(membership_scores)] = 0
    return membership_scores


def test_same_scores_as_the_authors_loop():
    rng = np.random.default_rng(7)
    n = 40
    member = rng.random(n) < 0.5
    ratio = 1 + 0.1 * rng.standard_normal((n, n)) + 0.05 * np.outer(~member, member)
    init = rng.standard_normal(n) + member
    np.testing.assert_allclose(em.em_iterations(ratio, init, 10), authors_loop(ratio, init, 10), rtol=0, atol=1e-6)


def synthetic(n=30, seed=0):
    """Members and non-members; a non-member prefix lowers members' likelihood (ReCaLL: higher ratio), a member
    prefix helps them (lower ratio); the initial scores are weak."""
    rng = np.random.default_rng(seed)
    member = np.arange(n) % 2 == 1
    effect = np.where(member[:, None], -0.3, 0.3) * np.where(member[None, :], 1.0, 0.0)
    ratio = 1 + effect + 0.1 * rng.standard_normal((n, n))
    init = 0.5 * member + rng.standard_normal(n)
    return ratio, init, member


def test_orientation_and_convergence():
    ratio, init, member = synthetic()
    before = metrics.auroc(member.astype(int), init)
    f = em.em_iterations(ratio, init, 10)
    assert metrics.auroc(member.astype(int), f) > max(0.95, before)  # members score higher
    np.testing.assert_array_equal(f, em.em_iterations(ratio, init, 11))  # a fixed point
    np.testing.assert_array_equal(f, em.em_iterations(ratio.copy(), init.copy(), 10))  # deterministic


def test_blocks_are_seeded_and_cover_every_text_once():
    parts = em.blocks(70, 32, seed=3)
    assert [b.size for b in parts] == [24, 23, 23]
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(70))
    assert all(np.array_equal(a, b) for a, b in zip(parts, em.blocks(70, 32, seed=3)))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, em.blocks(70, 32, seed=4)))
    assert [b.tolist() for b in em.blocks(5, 32, seed=3)] == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("kw, message", [({"n_prefixes": 3}, "--em-mia-prefixes"), ({"iterations": 0}, "iterations"),
                                         ({"seed": -1}, "--em-mia-seed")])
def test_bad_options_are_user_errors(kw, message):
    with pytest.raises(UserError, match=message):
        em.check_options(**{"n_prefixes": 8, "iterations": 10, "seed": 0, **kw})


def test_pass_matrix_is_the_models_conditional_likelihood(tiny, tmp_path):
    report = {}
    recs = runner.score_dataset(tiny, TEXTS, ["loss", "em_mia"], out_dir=tmp_path, progress=False, report=report,
                                pass_options={"em_mia": {"n_prefixes": 4, "iterations": 10, "seed": 0}})
    s = metrics.scores_by_method(recs, ["loss", "em_mia"])
    assert np.isfinite(s["em_mia"]).all()
    parts = em.blocks(len(TEXTS), 4, 0)
    assert [b.size for b in parts] == [3, 3] and report[em.PASS_KIND]["texts"] == 18  # 3 x 3 pairs per block
    pairs = [json.loads(line) for line in (tmp_path / "passes" / f"{em.PASS_KIND}.jsonl").read_text().splitlines()]
    cond = np.array([p["scores"]["loss"] for p in sorted(pairs, key=lambda r: r["index"])])
    start = 0
    for b in parts:
        block = cond[start: start + b.size ** 2].reshape(b.size, b.size).T  # [prefix, text]
        start += b.size ** 2
        want = [[conditional_loss(tiny, TEXTS[p], TEXTS[x]) for x in b] for p in b]
        np.testing.assert_allclose(block, want, rtol=1e-5)
        np.testing.assert_allclose(s["em_mia"][b], em_mia_ref(block / s["loss"][b][None, :], s["loss"][b], 10),
                                   atol=1e-12)


def write_data(tmp_path):
    from mia_jax.runs.files import write_jsonl

    data = tmp_path / "eval.jsonl"
    write_jsonl(data, [{"input": t, "label": y} for t, y in zip(TEXTS, LABELS)])
    return data


def test_eval_on_the_command_line(tiny_llama_dir, tmp_path, capsys):
    from mia_jax.cli import main

    usage = _help(main, capsys)
    assert "--em-mia-prefixes" in usage and "--em-mia-iterations" in usage and "em_mia" in usage
    out = tmp_path / "run"
    argv = ["eval", "--model", str(tiny_llama_dir), "--data", str(write_data(tmp_path)), "--methods", "loss",
            "em_mia", "--em-mia-prefixes", "6", "--out", str(out), "--n-bootstrap", "10", "--no-progress",
            "--no-blind"]
    assert main(argv) == 0
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 6 and all(np.isfinite(r["scores"]["em_mia"]) for r in recs)
    meta = json.loads((out / "run.json").read_text())
    assert meta["method_resources"]["fingerprint"]["em_mia"] == {"n_prefixes": 6, "iterations": 10, "seed": 0}


def _help(main, capsys) -> str:
    capsys.readouterr()
    assert main(["eval", "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--methods", "em_mia", "--em-mia-prefixes", "2"], "--em-mia-prefixes must be at least 4"),
    (["--methods", "loss", "--em-mia-iterations", "3"], "'em_mia' is not among --methods"),
])
def test_bad_options_exit_2_with_one_line(tiny_llama_dir, tmp_path, capsys, extra, message):
    from mia_jax.cli import main

    out = tmp_path / "run"
    capsys.readouterr()
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(write_data(tmp_path)), "--out", str(out),
                 "--no-progress", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not out.exists()


def test_a_text_that_conditions_nothing_has_no_score_and_says_why():
    cond = np.log(np.full((4, 4), 0.5)) * np.array([1.0, 1.1, 0.9, 1.2])[None, :]
    cond[2] = np.nan  # no text of the block could be read after text 2
    loss = np.log(np.full(4, 0.4))
    scores, reasons = em.em_mia(loss, em.PrefixMatrix([np.arange(4)], [cond], 10), ["a", "b", "c", "d"])
    assert np.isnan(scores[2]) and "could be read after it" in reasons[2]
    assert np.isfinite(scores[[0, 1, 3]]).all() and set(reasons) == {2}


def test_a_text_that_fills_the_context_still_scores_as_a_prefix(tiny):
    long_text = " ".join(DATA.texts[40:60])  # over the tiny model's 64 tokens alone: read after no prefix
    texts = TEXTS[:4] + [long_text]
    recs = runner.score_dataset(tiny, texts, ["loss", "em_mia"], progress=False)
    assert np.isfinite(metrics.scores_by_method(recs, ["em_mia"])["em_mia"]).all()
    assert not any("nan_reasons" in r for r in recs)
