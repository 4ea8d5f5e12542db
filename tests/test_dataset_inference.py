"""Dataset inference: calibrated under the null (two halves of one unseen set), powerful on a shifted set, the
t-test as scipy's, bad input refused, and the command end to end (last line `p-value: X`)."""
import json

import numpy as np
import pytest
from scipy import stats

from mia_jax.cli import main
from mia_jax.data import wikimia
from mia_jax.dataset_inference import dataset_inference, load_features
from mia_jax.errors import UserError


def features(n, shift=0.0, seed=0, f=6):
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, f)) @ rng.normal(size=(f, f))  # correlated scores, as MIA scores are
    return base + shift


def test_two_halves_of_one_unseen_set_do_not_reject():
    pvals = []
    for seed in range(60):
        x = features(200, seed=1000 + seed)
        pvals.append(dataset_inference(x[:100], x[100:], seed=seed).p_value)
    assert dataset_inference(*np.split(features(200, seed=7), 2), seed=0).p_value > 0.1
    assert np.mean(np.array(pvals) < 0.05) <= 0.15  # near the nominal 5% under the null
    assert stats.kstest(pvals, "uniform").pvalue > 0.01  # and near uniform


def test_a_member_like_set_is_detected():
    res = dataset_inference(features(200, shift=0.4, seed=1), features(200, seed=2), seed=0)
    assert res.p_value < 0.01 and res.mean_suspect > res.mean_validation and res.n_suspect == 100


def test_the_t_test_is_welchs_one_sided(monkeypatch):
    seen = {}
    real = stats.ttest_ind

    def spy(a, b, **kw):
        seen.update(a=np.asarray(a), b=np.asarray(b), kw=kw)
        return real(a, b, **kw)

    monkeypatch.setattr("mia_jax.dataset_inference.stats.ttest_ind", spy)
    res = dataset_inference(features(60, seed=3), features(60, seed=4), seed=1)
    want = real(seen["a"], seen["b"], equal_var=False, alternative="greater")
    assert seen["kw"] == {"equal_var": False, "alternative": "greater"} and res.p_value == pytest.approx(want.pvalue)


def test_bad_input():
    with pytest.raises(UserError, match="same features"):
        dataset_inference(features(40, f=3), features(40, f=4))
    with pytest.raises(UserError, match="at least 20"):
        dataset_inference(features(15), features(40))
    x = features(40)
    x[:, 2] = np.nan
    with pytest.raises(UserError, match="no finite score"):
        dataset_inference(x, features(40), names=list("abcdef"))
    y = features(40)
    y[:3, 0] = np.inf  # a few texts with a non-finite score: dropped and counted
    assert dataset_inference(y, features(40)).n_dropped == 3


def test_command_end_to_end(tiny_llama_dir, tmp_path, capsys):
    texts = wikimia(32).texts
    for name, part in (("a", texts[:40]), ("b", texts[40:80])):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in part) + "\n")
    out = tmp_path / "di"
    argv = ["dataset-inference", "--suspect", str(tmp_path / "a.jsonl"), "--validation", str(tmp_path / "b.jsonl"),
            "--model", str(tiny_llama_dir), "--methods", "loss", "min_k", "zlib", "--k", "0.2", "0.5",
            "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("p-value: ")
    saved = json.loads((out / "dataset_inference.json").read_text())
    assert float(lines[-1].split()[-1]) == pytest.approx(saved["p_value"], rel=1e-3)
    names, x = load_features(out / "suspect" / "results.jsonl", ["loss", "min_k@0.2", "min_k@0.5", "zlib"])
    assert x.shape == (40, 4) and set(saved["weights"]) == {"loss", "min_k@0.2", "min_k@0.5", "zlib"}
    # the same from the saved scores, without a model
    assert main(["dataset-inference", "--suspect-scores", str(out / "suspect" / "results.jsonl"),
                 "--validation-scores", str(out / "validation" / "results.jsonl"), "--methods", "loss", "min_k",
                 "zlib", "--k", "0.2", "0.5", "--out", str(tmp_path / "again")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == lines[-1]
