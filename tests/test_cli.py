"""`mia-jax eval` / `score` end to end on a tiny model, and one clear message for each bad input."""
import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from mia_jax.cli import main
from mia_jax.data import wikimia


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def labeled(tmp_path_factory):
    ds = wikimia(32)
    rows = [{"input": t, "label": y} for t, y in zip(ds.texts[:10], ds.labels[:10])]
    rows += [{"input": t, "label": y} for t, y in zip(ds.texts[-10:], ds.labels[-10:])]
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
    for m in methods:
        s = summary[m]
        assert 0 <= s["auroc"] <= 1 and s["n_nan"] == 1 and s["n_scored"] == 20
        assert s["auroc_ci"][0] <= s["auroc"] <= s["auroc_ci"][1]
    with open(out / "summary.csv") as f:
        assert [row["method"] for row in csv.DictReader(f)] == methods
    assert (out / "roc.png").stat().st_size > 10_000
    run = json.loads((out / "run.json").read_text())
    assert run["package_version"] and run["model"]["files"] and list(run["data"]["files"].values())[0]
    assert run["model"]["add_bos"] in (True, False)


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


def bad_file(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("content, expected", [
    ('{"input": "a b c", "label": 1}\n{"input": "d e f", "label": 0}\n{"input": "g h", "label": 1\n',
     r"line 3 is not valid JSON"),
    ('{"input": "a b c", "label": 1}\n{"text": "d e f", "label": 0}\n', r"row 2 has no field 'input'"),
    ('{"input": "a b c", "label": 1}\n{"input": "d e f", "label": 2}\n', r"row 2 has label 2; labels must be 0"),
    ('{"input": "a b c", "label": "yes"}\n', r"row 1 has label 'yes'"),
    ('{"input": 5, "label": 1}\n', r"field 'input' is int, expected a string"),
    ('\n', r"no rows"),
])
def test_bad_data(tiny_llama_dir, tmp_path, capsys, content, expected):
    data = bad_file(tmp_path, "bad.jsonl", content)
    err = run_error(["eval", "--model", str(tiny_llama_dir), "--data", data, "--out", str(tmp_path / "o")], capsys)
    assert re.search(expected, err), err


def test_missing_data_file(tmp_path, capsys):
    err = run_error(["eval", "--data", str(tmp_path / "nope.jsonl")], capsys)
    assert "data file not found" in err and "nope.jsonl" in err


def test_unknown_method_lists_known(capsys):
    err = run_error(["eval", "--methods", "loss", "minkprob"], capsys)
    assert "unknown method 'minkprob'" in err and "min_k_pp@K" in err and "zlib" in err


def test_nonexistent_model(tmp_path, capsys):
    err = run_error(["eval", "--model", str(tmp_path / "no_model_here"), "--limit", "2"], capsys)
    assert "no_model_here" in err


def test_unsupported_gguf_architecture(tmp_path, capsys):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    err = run_error(["eval", "--model", str(path), "--limit", "2"], capsys)
    assert "mamba" in err and "llama" in err


def test_bad_numbers(capsys):
    assert "--batch-size" in run_error(["eval", "--batch-size", "0"], capsys)
    assert "fraction" in run_error(["eval", "--methods", "min_k", "--k", "1.5"], capsys)
    assert "lengths" in run_error(["eval", "--length", "48"], capsys)


def test_readme_example_runs():
    """The README's library example is executed as written."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "README has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {})


def test_rerun_with_same_out_resumes_and_refuses_another_job(tiny_llama_dir, labeled, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["eval", "--model", str(tiny_llama_dir), "--data", str(labeled), "--methods", "loss", "--out", str(out),
            "--n-bootstrap", "20", "--no-progress"]
    assert main(argv) == 0
    first = (out / "results.jsonl").read_bytes()
    capsys.readouterr()
    assert main(argv) == 0
    assert "resuming" in capsys.readouterr().err
    assert (out / "results.jsonl").read_bytes() == first
    err = run_error(argv[:-6] + ["zlib", "--out", str(out), "--no-progress"], capsys)
    assert "different run" in err and "methods" in err
    assert main(argv[:-6] + ["zlib", "--out", str(out), "--overwrite", "--no-progress"]) == 0
    assert list(json.loads((out / "summary.json").read_text())) == ["zlib"]


def test_blind_baseline_is_reported_beside_the_detectors(tiny_llama_dir, labeled, tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(labeled), "--methods", "loss", "blind_bow",
                 "--out", str(out), "--n-bootstrap", "20", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "Blind baseline (blind_bow" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["loss", "blind_bow"] and 0 <= summary["blind_bow"]["auroc"] <= 1
    assert "Blind baseline" in (out / "summary.md").read_text()
    assert json.loads((out / "run.json").read_text())["blind_baseline"]["auroc"] == summary["blind_bow"]["auroc"]
