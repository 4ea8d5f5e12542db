"""Dataset inference (mia_jax.evaluation.dataset_inference): calibrated under the null (two halves of one unseen set,
synthetic and real scores), powerful on a member-like set, the t-test as scipy's Welch test and as its formula, bad
input refused with one line, results.jsonl read, and the command end to end (last stdout line `p-value: X`)."""
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, snapshot
from scipy import stats

from mia_jax.evaluation import dataset_inference as di
from mia_jax.runs import entry
from mia_jax.cli import main
from mia_jax.commands import dataset_inference as di_command
from mia_jax.data import wikimia
from mia_jax.evaluation.dataset_inference import dataset_inference, load_features, welch_greater
from mia_jax.errors import UserError

REPO = Path(__file__).resolve().parents[1]
# real per-example scores: SmolLM2 before ("base") and after ("trained") continued pretraining on the members
EXAMPLES = REPO / "results/contamination/lr/lr_0.0001/examples.jsonl.gz"
REAL = ["loss", "ppl", "zlib", "min_k@0.2", "max_k@0.2", "min_k_pp@0.2", "entropy", "rank"]


def features(n, shift=0.0, seed=0, f=6):
    """n draws (``seed``) of f correlated scores, as MIA scores are, one of them heavy-tailed (a perplexity); one
    distribution for every seed, moved by ``shift`` in every score."""
    mix = np.random.default_rng(12345).normal(size=(f, f))
    base = np.random.default_rng(seed).normal(size=(n, f)) @ mix
    base[:, 0] = np.exp(base[:, 0] / 2)
    return base + shift


def real(model, label):
    rows = [json.loads(line) for line in gzip.open(EXAMPLES, "rt")]
    return np.array([[r[model][m] for m in REAL] for r in rows if r["label"] == label])


def null_rejections(x, seeds=50):
    """P-values of random splits of one set into suspect / validation halves (a fresh split per seed)."""
    pvals = []
    for seed in range(seeds):
        perm = np.random.default_rng(10_000 + seed).permutation(len(x))
        half = len(x) // 2
        pvals.append(dataset_inference(x[perm[:half]], x[perm[half:]], seed=seed).p_value)
    return np.array(pvals)


def test_two_halves_of_one_unseen_set_do_not_reject_synthetic():
    assert dataset_inference(*np.split(features(200, seed=7), 2), seed=0).p_value > 0.1
    pvals = null_rejections(features(200, seed=3), seeds=50)
    assert np.mean(pvals < 0.05) <= 0.15  # near the nominal 5% under the null
    assert stats.kstest(pvals, "uniform").pvalue > 0.01  # and near uniform
    fresh = np.array([dataset_inference(features(100, seed=1000 + s), features(100, seed=2000 + s), seed=s).p_value
                      for s in range(50)])  # independent draws of the same distribution
    assert np.mean(fresh < 0.05) <= 0.15


def test_two_halves_of_one_unseen_set_do_not_reject_real_scores():
    non = real("trained", 0)  # 400 real texts the trained model did not see, 8 real scores each
    assert non.shape == (400, len(REAL))
    assert dataset_inference(non[::2], non[1::2], REAL, seed=0).p_value > 0.1
    assert np.mean(null_rejections(non, seeds=50) < 0.05) <= 0.15
    # members and non-members under the model *before* it was trained on the members: one unseen distribution
    assert dataset_inference(real("base", 1), real("base", 0), REAL, seed=0).p_value > 0.1


def test_a_member_like_set_is_detected():
    res = dataset_inference(features(200, shift=0.4, seed=1), features(200, seed=2), seed=0)
    assert res.p_value < 0.01 and res.mean_suspect > res.mean_validation
    assert (res.n_suspect, res.n_validation, res.n_train_suspect, res.n_train_validation) == (100, 100, 100, 100)
    # real: the texts the model was trained on, against held-out texts of the same datasets
    res = dataset_inference(real("trained", 1), real("trained", 0), REAL, seed=0)
    assert res.p_value < 0.01 and set(res.weights) == set(REAL)


def test_seeded_and_deterministic():
    s, v = features(80, shift=0.2, seed=5), features(90, seed=6)
    a, b = dataset_inference(s, v, seed=3), dataset_inference(s, v, seed=3)
    assert a == b
    assert dataset_inference(s, v, seed=4).p_value != a.p_value  # another split


def test_the_t_test_is_welchs_one_sided_by_hand():
    a, b = [3.1, 2.4, 4.0, 3.3, 2.9], [2.0, 2.6, 1.7, 2.2, 3.0, 1.9, 2.4]
    ma, mb, va, vb = np.mean(a), np.mean(b), np.var(a, ddof=1), np.var(b, ddof=1)
    se2 = va / len(a) + vb / len(b)
    t = (ma - mb) / np.sqrt(se2)
    df = se2**2 / ((va / len(a)) ** 2 / (len(a) - 1) + (vb / len(b)) ** 2 / (len(b) - 1))
    got = welch_greater(a, b)
    assert got == pytest.approx((t, stats.t.sf(t, df), df), rel=1e-12)
    ref = stats.ttest_ind(a, b, equal_var=False, alternative="greater")
    assert got[:2] == pytest.approx((ref.statistic, ref.pvalue), rel=1e-12)
    assert welch_greater(b, a)[1] == pytest.approx(1 - got[1])  # one-sided: the other direction is not evidence


def test_the_p_value_is_the_t_test_of_the_held_out_scores(monkeypatch):
    seen = {}

    def spy(a, b):
        seen.update(a=np.asarray(a), b=np.asarray(b))
        return welch_greater(a, b)

    monkeypatch.setattr(di, "welch_greater", spy)
    res = dataset_inference(features(60, seed=3), features(64, seed=4), seed=1)
    assert (len(seen["a"]), len(seen["b"])) == (30, 32)
    assert res.mean_suspect == pytest.approx(seen["a"].mean())
    assert res.mean_validation == pytest.approx(seen["b"].mean())
    assert res.p_value == pytest.approx(stats.ttest_ind(seen["a"], seen["b"], equal_var=False,
                                                        alternative="greater").pvalue)


def test_bad_input():
    with pytest.raises(UserError, match="same features"):
        dataset_inference(features(40, f=3), features(40, f=4))
    with pytest.raises(UserError, match="same features"):
        dataset_inference(np.zeros(40), np.zeros(40))
    with pytest.raises(UserError, match="at least 20 scored texts per set"):
        dataset_inference(features(15), features(40))
    x = features(40)
    x[:, 2] = np.nan
    with pytest.raises(UserError, match="no finite score in the suspect set: c"):
        dataset_inference(x, features(40), names=list("abcdef"))
    with pytest.raises(UserError, match="every feature is constant"):
        dataset_inference(np.ones((40, 3)), np.ones((40, 3)))
    with pytest.raises(UserError, match="6 features but names"):
        dataset_inference(features(40), features(40), names=["a"])


def test_non_finite_scores_are_dropped_and_counted():
    y = features(40)
    y[:3, 0] = np.inf  # a few texts with a non-finite score: dropped and counted
    y[5, 1] = np.nan
    res = dataset_inference(y, features(40))
    assert (res.n_dropped_suspect, res.n_dropped_validation, res.nonfinite) == (4, 0, {"f0": 3, "f1": 1})
    assert res.n_suspect + res.n_train_suspect == 36
    assert "Dropped for a non-finite score: 4 suspect" in res.to_markdown()
    y[:22, 4] = np.nan  # too many: the message names the culprit
    with pytest.raises(UserError, match="non-finite score.*'f4': 22"):
        dataset_inference(y, features(40))


def test_to_markdown():
    md = dataset_inference(features(60, shift=1.0, seed=8), features(60, seed=9), names=list("abcdef")).to_markdown()
    assert "one-sided Welch t" in md and "| Feature | Weight |" in md and md.count("\n| ") == 7


def write_results(path, rows, methods):
    path.write_text("".join(json.dumps({"index": i, "n_tokens": 9, "scores": dict(zip(methods, r))}) + "\n"
                            for i, r in enumerate(rows)))


def test_load_features(tmp_path):
    write_results(tmp_path / "results.jsonl", [[1.0, None], [2.5, 3.0]], ["loss", "min_k@0.2"])
    names, x = load_features(tmp_path)  # a run folder or its results.jsonl
    assert names == ["loss", "min_k@0.2"] and np.array_equal(x, [[1.0, np.nan], [2.5, 3.0]], equal_nan=True)
    assert load_features(tmp_path / "results.jsonl", ["min_k@0.2"])[1].shape == (2, 1)
    with pytest.raises(UserError, match="no score for zlib"):
        load_features(tmp_path / "results.jsonl", ["zlib"])
    with pytest.raises(UserError, match="not found"):
        load_features(tmp_path / "nothing.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"index": 0, "scores": {"loss": 1.0}}\n{"index": 1\n')
    with pytest.raises(UserError, match="line 2: not valid JSON"):
        load_features(tmp_path / "bad.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"index": 0, "score": 1.0}\n')
    with pytest.raises(UserError, match="line 1 has no 'scores'"):
        load_features(tmp_path / "bad.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"index": 0, "scores": {"loss": "x"}}\n')
    with pytest.raises(UserError, match="not a number"):
        load_features(tmp_path / "bad.jsonl")


def run_command(argv):
    """The command as cli.main runs it: the entry parser from add_arguments (a usage error: one line on stderr, exit 2),
    UserError -> one line (on stdout here) and exit 2."""
    parser = entry.ArgumentParser(prog="mia-jax")
    di_command.add_arguments(parser.add_subparsers(dest="command", required=True).add_parser(di_command.NAME))
    try:
        di_command.run(parser.parse_args(argv))
    except SystemExit as e:
        return e.code
    except UserError as e:
        print(f"mia-jax: error: {e}")
        return 2
    return 0


def test_command_end_to_end(tiny_llama_dir, tmp_path, capsys):
    texts = wikimia(32).texts
    for name, part in (("a", texts[:40]), ("b", texts[40:80])):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in part) + "\n")
    out = tmp_path / "di"
    argv = ["dataset-inference", "--suspect", str(tmp_path / "a.jsonl"), "--validation", str(tmp_path / "b.jsonl"),
            "--model", str(tiny_llama_dir), "--methods", "loss", "min_k", "zlib", "--k", "0.2", "0.5",
            "--out", str(out), "--no-progress"]
    assert run_command(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("p-value: ") and lines[0].startswith("## Dataset inference")
    saved = json.loads((out / "dataset_inference.json").read_text())
    assert float(lines[-1].split()[-1]) == pytest.approx(saved["p_value"], rel=1e-5)
    assert saved["methods"] == ["loss", "min_k@0.2", "min_k@0.5", "zlib"] and saved["n_shared_texts"] == 0
    assert (out / "dataset_inference.md").read_text().strip().splitlines()[-1] == lines[-1]
    names, x = load_features(out / "suspect", saved["methods"])
    assert x.shape == (40, 4) and np.isfinite(x).all()
    # again: both runs resume (nothing rescored), the same answer
    assert run_command(argv) == 0
    again = capsys.readouterr()
    assert again.out.strip().splitlines()[-1] == lines[-1] and "resuming the validation run" in again.err
    # from the saved scores, without a model (every method both files have), through the wired cli
    assert main(["dataset-inference", "--suspect-scores", str(out / "suspect" / "results.jsonl"),
                 "--validation-scores", str(out / "validation"), "--out", str(tmp_path / "again")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == lines[-1]
    # a validation set that shares texts with the suspect set is reported
    argv[argv.index(str(tmp_path / "b.jsonl"))] = str(tmp_path / "a.jsonl")
    argv[argv.index(str(out))] = str(tmp_path / "same")
    assert run_command(argv) == 0
    assert "Warning: 40 distinct texts are in both sets" in capsys.readouterr().out


def test_command_refuses_bad_input(tiny_llama_dir, tmp_path, capsys, monkeypatch):
    write_results(tmp_path / "r.jsonl", features(30).tolist(), list("abcdef"))
    monkeypatch.chdir(tmp_path)
    for name in ("x.jsonl", "y.jsonl"):
        (tmp_path / name).write_text('{"text": "a text"}\n')
    cases = [
        (["--suspect-scores", str(tmp_path / "r.jsonl")], "exactly one of --validation"),
        (["--suspect", "x.jsonl", "--suspect-scores", "y", "--validation-scores", "z"], "exactly one of --suspect"),
        (["--suspect", "x.jsonl", "--validation", "y.jsonl", "--methods", "recall"], "itself, not recall"),
        (["--suspect", "x.jsonl", "--validation", "y.jsonl", "--methods", "dc_pdd"], "itself, not dc_pdd"),
        (["--suspect", "x.jsonl", "--validation", "y.jsonl", "--methods", "ref"], "needs a reference model"),
        (["--suspect", "x.jsonl", "--validation", "y.jsonl", "--methods", "nope"], "nope"),
        (["--suspect-scores", str(tmp_path / "r.jsonl"), "--validation-scores", str(tmp_path / "r.jsonl"),
          "--methods", "loss"], "no score for loss"),
        (["--suspect", str(tmp_path / "missing.jsonl"), "--validation", "y.jsonl", "--model", str(tiny_llama_dir)],
         "no such file"),
        (["--suspect", "x.jsonl", "--validation", "y.jsonl", "--seed", "-1"], "--seed"),
        (["--suspect", "x.jsonl", "--validation", "y.jsonl", "--k", "1.5"], "--k"),
        (["--suspect", "x.jsonl", "--validation", "y.jsonl", "--batch-size", "0"], "--batch-size"),
        (["--suspect", "x.jsonl", "--validation", "y.jsonl", "--out", "x.jsonl"], "existing file"),
    ]
    for extra, message in cases:
        assert run_command(["dataset-inference", "--out", str(tmp_path / "o"), *extra]) == 2
        cap = capsys.readouterr()
        err = (cap.out + cap.err).strip().splitlines()
        assert len(err) == 1 and message in err[0], (extra, err)
    assert not (tmp_path / "o").exists()  # nothing written before every input is checked


def test_command_refuses_scores_of_two_models(tmp_path, capsys):
    for side, sha in (("s", "aa"), ("v", "bb")):
        (tmp_path / side).mkdir()
        write_results(tmp_path / side / "results.jsonl", features(30, seed=len(side)).tolist(), list("abcdef"))
        (tmp_path / side / "config.json").write_text(json.dumps({"model_files": {"/m/model.safetensors": sha},
                                                                 "ref_model_files": None, "dtype": "float32"}))
    argv = ["dataset-inference", "--suspect-scores", str(tmp_path / "s"), "--validation-scores", str(tmp_path / "v"),
            "--out", str(tmp_path / "o")]
    assert run_command(argv) == 2 and "scored by different models" in capsys.readouterr().out
    (tmp_path / "v" / "config.json").write_text(json.dumps({"model_files": {"/elsewhere/m.safetensors": "aa"},
                                                            "ref_model_files": None, "dtype": "float32"}))
    assert run_command(argv) == 0  # the same files under another path: the same model
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("p-value: ")


def test_command_refuses_another_runs_folder(tmp_path, capsys):
    """--out holding another run (here a committed unlearning audit) is refused untouched, one line and exit 2."""
    write_results(tmp_path / "r.jsonl", features(30).tolist(), list("abcdef"))
    other = tmp_path / "other"
    shutil.copytree(Path(__file__).resolve().parents[1] / "results" / "audits" / "unlearning", other)
    before = snapshot(other)
    capsys.readouterr()
    rc = main(["dataset-inference", "--suspect-scores", str(tmp_path / "r.jsonl"), "--validation-scores",
               str(tmp_path / "r.jsonl"), "--out", str(other)])
    assert_clean_error(rc, capsys.readouterr().err, str(other), "refusing to write into it")
    assert snapshot(other) == before
