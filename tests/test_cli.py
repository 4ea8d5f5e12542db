"""`mia-jax eval` / `score` end to end on a tiny model, and one clear message for each bad input."""
import csv
import json
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, ctrl_c_at_batch
from sklearn.metrics import roc_auc_score

from mia_jax import batching, models
from mia_jax.evaluation import blind, metrics
from mia_jax.cli import main
from mia_jax.data import wikimia


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def labeled(tmp_path_factory):
    ds = wikimia(32)
    pairs = list(zip(ds.texts, ds.labels))  # 10 members and 10 non-members: the fewest a metric is reported on
    chosen = [p for p in pairs if p[1] == 1][:10] + [p for p in pairs if p[1] == 0][:10]
    rows = [{"input": t, "label": y} for t, y in chosen]
    rows.append({"input": "  ", "label": 1})  # empty: recorded as skipped, counted as NaN
    return write_jsonl(tmp_path_factory.mktemp("data") / "small.jsonl", rows)


def test_eval_writes_every_output(tiny_llama_dir, labeled, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["eval", "--model", str(tiny_llama_dir), "--data", str(labeled), "--methods", "loss", "zlib", "min_k",
               "min_k_pp", "--k", "0.1", "0.2", "--batch-size", "4", "--out", str(out), "--n-bootstrap", "50",
               "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    methods = ["loss", "zlib", "min_k@0.1", "min_k@0.2", "min_k_pp@0.1", "min_k_pp@0.2"]
    for m in methods:
        assert re.search(rf"\| {re.escape(m)} \|", printed), m
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 21 and [r["index"] for r in records] == list(range(21))
    assert set(records[0]) >= {"index", "label", "n_tokens", "scores"} and list(records[0]["scores"]) == methods
    assert records[20]["skip_reason"] and records[20]["scores"]["loss"] is None
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == methods
    labels = [r["label"] for r in records[:20]]
    for m in methods:
        s = summary[m]
        auroc = roc_auc_score(labels, [r["scores"][m] for r in records[:20]])  # float64 reference, NaN row left out
        assert s["auroc"] == pytest.approx(auroc, abs=1e-12) and s["n_nan"] == 1 and s["n_scored"] == 20
        assert s["auroc_ci"][0] <= s["auroc"] <= s["auroc_ci"][1]
    with open(out / "summary.csv") as f:
        assert [row["method"] for row in csv.DictReader(f)] == methods
    assert (out / "roc.png").stat().st_size > 10_000
    run = json.loads((out / "run.json").read_text())
    assert run["package_version"] and run["model"]["files"] and list(run["data"]["files"].values())[0]
    tiny = models.load(str(tiny_llama_dir))
    assert run["model"]["add_bos"] == tiny.add_bos and run["model"]["files"] == tiny.files
    n_truncated = sum(1 for r in records if r.get("truncated"))
    assert n_truncated == 20 and run["n_truncated"] == 20  # WikiMIA-32 texts are longer than 64 tokens
    assert (f"Truncated to the model's context of 64 tokens: {n_truncated} texts. Exact duplicates of an earlier "
            "text: 0 texts.") in (out / "summary.md").read_text()
    # bold: the best AUROC and every method the paired bootstrap (same texts, same seed) does not place below it
    md = (out / "summary.md").read_text()
    scores = {m: np.array([r["scores"][m] for r in records[:20]]) for m in methods}
    best = max(methods, key=lambda m: summary[m]["auroc"])
    others = [m for m in methods if m != best]  # each against the best, 2000 resamples, Holm over the comparisons
    pairs = [metrics.paired_bootstrap(labels, scores[best], scores[m], n_bootstrap=2000, seed=0)["auroc"]
             for m in others]
    p = np.array([c["p"] for c in pairs])
    order = np.argsort(p, kind="stable")
    holm = np.empty_like(p)
    holm[order] = np.minimum(1, np.maximum.accumulate(p[order] * (len(p) - np.arange(len(p)))))
    want = {best} | {m for m, c, ph in zip(others, pairs, holm) if not (c["ci"][0] > 0 and ph < 0.05)}
    got = {m for m in methods if re.search(rf"\| {re.escape(m)} \| \*\*", md)}
    assert got == want and "Bold AUROC" in md
    assert {m for m in methods if re.search(rf"\| {re.escape(m)} \| \*\*", printed)} == want


def test_score_unlabeled(tiny_llama_dir, tmp_path):
    data = write_jsonl(tmp_path / "u.jsonl", [{"text": "hello there, general"}, {"text": "one two three four"}])
    out = tmp_path / "s"
    assert main(["score", "--model", str(tiny_llama_dir), "--data", str(data), "--text-field", "text",
                 "--methods", "loss", "--out", str(out), "--no-progress"]) == 0
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and "label" not in recs[0] and np.isfinite(recs[0]["scores"]["loss"])
    assert not (out / "summary.json").exists()


def run_error(argv, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    return err


def test_readme_example_runs():
    """The README's library examples are executed as written: ``mia_jax.score`` on SmolLM2, ``scores_from_logits``
    inside jit, then a formula's gradient (which reuses the second block's names)."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) >= 3 and "mia_jax.score(" in blocks[0] and "scores_from_logits" in blocks[1], \
        "README lost its python examples"
    names: dict = {}
    for block in blocks[:3]:
        exec(compile(block, "README.md", "exec"), names)
    assert set(names["scores"]) == {"loss", "min_k@0.2", "min_k_pp@0.2"} and names["scores"]["loss"].shape == (2,)


def test_interrupted_run_resumes_and_another_job_is_refused(tiny_llama_dir, labeled, tmp_path, capsys,
                                                             monkeypatch):
    rows = [json.loads(line) for line in labeled.read_text().splitlines()]
    data = write_jsonl(tmp_path / "data.jsonl", [dict(r, text=r["input"][::-1], flipped=1 - r["label"]) for r in rows])
    argv = ["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--text-field", "input", "--methods", "loss",
            "--tokens-per-batch", "64", "--n-bootstrap", "20", "--no-progress"]
    tiny = models.load(str(tiny_llama_dir))
    steps = batching.pack(batching.scoring_lengths(batching.encode(tiny, [r["input"] for r in rows[:20]])), 64,
                          tiny.max_length)
    first_two = len(steps[0].items) + len(steps[1].items)
    assert main(argv + ["--out", str(tmp_path / "full")]) == 0
    out = tmp_path / "run"
    capsys.readouterr()
    with ctrl_c_at_batch(3):  # Ctrl-C while the third step is being scored
        assert main(argv + ["--out", str(out)]) == 130
    assert "run the same command again to resume" in capsys.readouterr().err
    assert not (out / "results.jsonl").exists()
    kept = len((out / "passes" / "main.jsonl").read_text().splitlines())
    assert kept == 1 + first_two  # the skipped text and two finished steps
    assert main(argv + ["--out", str(out)]) == 0
    assert "resuming the run" in capsys.readouterr().err
    passes = json.loads((out / "run.json").read_text())["passes"]
    assert passes["main"]["reused"] == first_two and passes["main"]["computed"] == 20 - first_two
    assert (out / "results.jsonl").read_bytes() == (tmp_path / "full" / "results.jsonl").read_bytes()

    # the same file by a relative path is the same run; another text field, label field or method is not
    monkeypatch.chdir(tmp_path)
    assert main(argv[:4] + [data.name] + argv[5:] + ["--out", "run"]) == 0
    assert "resuming the run" in capsys.readouterr().err
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for bad, field in ((["--text-field", "text"], "text_field"), (["--label-field", "flipped"], "label_field"),
                       (["--methods", "zlib"], "methods")):
        err = run_error(argv + bad + ["--out", str(out)], capsys)
        assert "holds a different run" in err and field in err and "--overwrite" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert main(argv + ["--methods", "zlib", "--out", str(out), "--overwrite"]) == 0
    assert list(json.loads((out / "summary.json").read_text())) == ["zlib"]


def test_every_option_is_fingerprinted_or_explained():
    from mia_jax.cli import build_parser
    from mia_jax.commands.scoring import NOT_IN_FINGERPRINT

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in ("eval", "score"):
        dests = {a.dest for a in sub.choices[name]._actions if a.dest != "help"}
        in_fingerprint = {"encoding", "text_field", "label_field", "limit", "batch_size", "tokens_per_batch",
                          "chunk_size", "dtype", "mesh", "methods"}
        assert dests - in_fingerprint - set(NOT_IN_FINGERPRINT) == set(), name


def test_blind_baseline_is_reported_beside_the_detectors(tiny_llama_dir, labeled, tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(labeled), "--methods", "loss", "blind_bow",
                 "--out", str(out), "--n-bootstrap", "20", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "Blind baseline (blind_bow" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["loss", "blind_bow"]
    labels = [r["label"] for r in map(json.loads, labeled.read_text().splitlines())]
    blind_scores = blind.blind_bow_scores([json.loads(line)["input"] for line in labeled.read_text().splitlines()],
                                          labels, seed=0)
    assert summary["blind_bow"]["auroc"] == pytest.approx(roc_auc_score(labels, blind_scores), abs=1e-12)
    assert "Blind baseline" in (out / "summary.md").read_text()
    assert json.loads((out / "run.json").read_text())["blind_baseline"]["auroc"] == summary["blind_bow"]["auroc"]


def test_blind_baseline_runs_while_the_model_loads(tiny_llama_dir, labeled, tmp_path, monkeypatch):
    """The model-free baseline needs only the texts and labels: eval starts it on a thread of its own before the
    model loads (the load here waits until it has begun), and the report takes its result."""
    import threading

    began, seen = threading.Event(), {}
    real_scores, real_load = blind.blind_bow_scores, models.load

    def scores(*args, **kwargs):
        seen["thread"] = threading.current_thread().name
        began.set()
        return real_scores(*args, **kwargs)

    def load(*args, **kwargs):
        seen["began_during_load"] = began.wait(timeout=60)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(blind, "blind_bow_scores", scores)
    monkeypatch.setattr(models, "load", load)
    out = tmp_path / "b"
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(labeled), "--methods", "loss",
                 "--out", str(out), "--n-bootstrap", "20", "--no-progress"]) == 0
    assert seen["began_during_load"] and seen["thread"] != threading.main_thread().name
    assert json.loads((out / "run.json").read_text())["blind_baseline"]["auroc"] is not None


def test_blind_baseline_of_a_large_set_comes_from_a_child_process(tiny_llama_dir, labeled, tmp_path, monkeypatch,
                                                                   capsys):
    """From ``blind.CHILD_MIN_TEXTS`` texts (0 here) the eval computes the baseline's scores in a child process: this
    process's ``blind_bow_scores``, made to fail, is not called, and the AUROC is the one computed here. A child
    that fails otherwise than by a UserError, or stalls, leaves a note, and the baseline is computed in the eval's
    process."""
    rows = [json.loads(line) for line in labeled.read_text().splitlines()]
    labels = [r["label"] for r in rows]
    real = blind.blind_bow_scores
    expected = roc_auc_score(labels, real([r["input"] for r in rows], labels, seed=0))

    def refuse(*args, **kwargs):
        raise AssertionError("the blind baseline was computed in the eval's process")

    monkeypatch.setattr(blind, "CHILD_MIN_TEXTS", 0)
    monkeypatch.setattr(blind, "blind_bow_scores", refuse)
    command = ["eval", "--model", str(tiny_llama_dir), "--data", str(labeled), "--methods", "loss",
               "--n-bootstrap", "20", "--no-progress"]
    assert main([*command, "--out", str(tmp_path / "child")]) == 0
    assert json.loads((tmp_path / "child" / "run.json").read_text())["blind_baseline"]["auroc"] == pytest.approx(
        expected, abs=1e-12)
    monkeypatch.setattr(blind, "blind_bow_scores", real)
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # the child exits 1 at once
    capsys.readouterr()
    assert main([*command, "--out", str(tmp_path / "failed")]) == 0
    assert "note: the blind baseline's process exited with code 1" in capsys.readouterr().err
    assert json.loads((tmp_path / "failed" / "run.json").read_text())["blind_baseline"]["auroc"] == pytest.approx(
        expected, abs=1e-12)
    stalled = tmp_path / "stalled.sh"  # a child that never answers: it sleeps, its CPU time still
    stalled.write_text("#!/bin/sh\nexec sleep 300\n")
    stalled.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stalled))
    monkeypatch.setattr(blind, "STALL_S", 1.0)
    assert main([*command, "--out", str(tmp_path / "stalled")]) == 0
    assert "note: the blind baseline's process made no progress for 1 s (stalled; killed)" in capsys.readouterr().err
    assert json.loads((tmp_path / "stalled" / "run.json").read_text())["blind_baseline"]["auroc"] == pytest.approx(
        expected, abs=1e-12)


def test_wikimia_concat_needs_a_window(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["eval", "--benchmark", "wikimia-concat", "--model", str(tiny_llama_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "add --window" in err[0]
    assert not out.exists()


# ----------------------------------------------------------------------------- --overwrite replaces a run, nothing else


def _state(folder: Path) -> dict:
    """Every entry under ``folder`` and the folder itself: its bytes (a file), target (a link) or None (a folder),
    with its mtime: what 'nothing changed' is checked against."""
    return {str(p.relative_to(folder)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None,
                                         p.lstat().st_mtime_ns) for p in [folder, *sorted(folder.rglob("*"))]}


def _eval(model, data, out, *more) -> list[str]:
    return ["eval", "--model", str(model), "--data", str(data), "--methods", "loss", "--out", str(out),
            "--n-bootstrap", "20", "--no-progress", *more]


@pytest.fixture(scope="module")
def finished(tiny_llama_dir, labeled, tmp_path_factory):
    """A finished eval run (loss), copied by the tests that change it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(_eval(tiny_llama_dir, labeled, out)) == 0
    return out


def test_overwrite_refuses_a_folder_of_data_holding_the_input(tiny_llama_dir, labeled, tmp_path, capsys):
    """The reported loss: --data DIR/s48.jsonl --out DIR --overwrite emptied DIR. Now exit 2, one line, every file
    as it was (bytes and mtimes)."""
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(labeled, folder / "s48.jsonl")
    (folder / "s64.jsonl").write_bytes(labeled.read_bytes())
    before = _state(folder)
    rc = main(_eval(tiny_llama_dir, folder / "s48.jsonl", folder, "--overwrite"))
    assert_clean_error(rc, capsys.readouterr().err, f"--overwrite: {folder} holds {folder / 's48.jsonl'}",
                       "an input of this run", "nothing was removed")
    assert _state(folder) == before


def test_overwrite_refuses_a_folder_that_holds_no_run(tiny_llama_dir, labeled, tmp_path, capsys):
    """A model folder (its config.json is no run description) and a folder of notes: refused untouched."""
    model = tmp_path / "other_model"
    shutil.copytree(tiny_llama_dir, model)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine\n")
    for folder in (model, notes):
        before = _state(folder)
        rc = main(_eval(tiny_llama_dir, labeled, folder, "--overwrite"))
        assert_clean_error(rc, capsys.readouterr().err, f"--overwrite: {folder} holds no run of mia_jax")
        assert _state(folder) == before


def test_overwrite_refuses_a_folder_inside_a_run(tiny_llama_dir, labeled, finished, tmp_path, capsys):
    """RUN/passes (no run of its own) and RUN/sub (a run, but inside another): refused, the run untouched."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    shutil.copytree(finished, run / "sub")
    before = _state(run)
    for folder in (run / "passes", run / "sub"):
        rc = main(_eval(tiny_llama_dir, labeled, folder, "--overwrite"))
        assert_clean_error(rc, capsys.readouterr().err, f"--overwrite: {folder} is inside the run in {run}")
        assert _state(run) == before
    assert (run / "passes" / "main.jsonl").read_bytes() == (finished / "passes" / "main.jsonl").read_bytes()


def test_overwrite_replaces_a_finished_run(tiny_llama_dir, labeled, finished, tmp_path):
    """A finished run (with a file of its own added) is replaced by the new one: the same files, byte for byte in
    its records, as the same command into a new folder."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / "old_notes.txt").write_text("from the old run\n")
    assert main(_eval(tiny_llama_dir, labeled, run, "--methods", "zlib", "--overwrite")) == 0
    assert main(_eval(tiny_llama_dir, labeled, tmp_path / "fresh", "--methods", "zlib")) == 0
    names = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    assert names == sorted(str(p.relative_to(tmp_path / "fresh")) for p in (tmp_path / "fresh").rglob("*"))
    assert list(json.loads((run / "summary.json").read_text())) == ["zlib"]
    for name in ("results.jsonl", "passes/main.jsonl"):
        assert (run / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes(), name
