"""The scripts under scripts/ and scripts/bench/ (other than reproduce_wikimia.py and detectors.py, tested beside their
modules) follow the entry convention: a bad count or a missing input is one line and exit 2 at parse time, in-process,
with nothing written; compare_runs.py reads its results files strictly."""
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, snapshot

from mia_jax.runs import entry

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BENCH = SCRIPTS / "bench"  # the measurement scripts and their helper module (bench_tools)
_LOADED = {}


def script(name: str):
    if name not in _LOADED:
        folder = BENCH if (BENCH / f"{name}.py").is_file() else SCRIPTS
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
        spec = importlib.util.spec_from_file_location(f"_script_{name}", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED[name] = module
    return _LOADED[name]


def results_file(path: Path, n: int = 24, shift: float = 0.0) -> Path:
    rng = np.random.default_rng(0)
    path.write_text("".join(json.dumps({"index": i, "label": i % 2, "scores": {
        "loss": float(rng.normal() + i % 2 + shift), "zlib": float(rng.normal())}}) + "\n" for i in range(n)))
    return path


# (script, argv, words of the one line); "FILE" is an existing file, "FOLDER" an empty folder, "PREP" a prepared model
# folder, "MISSING" a path that does not exist
CASES = [
    ("compare_runs", ["FILE", "FILE", "--n-bootstrap", "0"], ["argument --n-bootstrap"]),
    ("compare_runs", ["MISSING", "FILE"], ["MISSING: no such file"]),
    ("published_loop", ["--limit", "0"], ["argument --limit"]),
    ("published_loop", ["--compare", "MISSING", "FILE"], ["MISSING: no such file"]),
    ("published_loop", ["--length", "48"], ["WikiMIA has lengths"]),
    ("published_loop", ["--out", "MISSING/x.jsonl"], ["argument --out", "does not exist"]),
    ("random_model", ["build", "OUT", "PREP", "--layers", "-5"], ["argument --layers"]),
    ("random_model", ["build", "OUT", "MISSING"], ["MISSING: no such folder"]),
    ("random_model", ["build", "OUT", "."], ["has no config.json"]),
    ("random_model", ["prepare", "FILE"], ["existing file"]),
    ("audits_demo", ["--out", "OUT", "--books-per-domain", "0"], ["argument --books-per-domain"]),
    ("audits_demo", ["--out", "OUT", "--pile", "MISSING"], ["MISSING: no such folder"]),
    ("audits_demo", ["--out", "OUT", "--books-per-domain", "4"], ["leaves no book to audit"]),
    ("gpu_suite", ["--limit", "0"], ["argument --limit"]),
    ("gpu_suite", ["--budget-s", "-5"], ["argument --budget-s"]),
    ("gpu_suite", ["--json", "MISSING/suite.json"], ["argument --json"]),
    ("load_memory", ["--devices", "0"], ["argument --devices"]),
    ("load_memory", ["--synthetic", "1024,16"], ["argument --synthetic", "D,L,V"]),
    ("benchmark", ["--repeats", "0"], ["argument --repeats"]),
    ("benchmark", ["--json", "MISSING/b.json"], ["argument --json"]),
    ("benchmark_eval", ["--tokens-per-batch", "1024", "-5"], ["argument --tokens-per-batch"]),
    ("benchmark_long", ["--tokens", "0"], ["argument --tokens"]),
    ("benchmark_long", ["--source", "MISSING"], ["MISSING: no such file"]),
    ("benchmark_stats", ["--dim", "0"], ["argument --dim"]),
    ("benchmark_stats", ["--shapes", "8,128"], ["argument --shapes"]),
    ("benchmark_train", ["--steps", "0"], ["argument --steps"]),
    ("benchmark_train", ["--json", "FOLDER"], ["is a folder"]),
]


@pytest.mark.parametrize("name, argv, needles", CASES, ids=[f"{n} {' '.join(a)}" for n, a, _ in CASES])
def test_bad_count_or_missing_input_is_one_line(name, argv, needles, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("{}\n")
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "PREP").mkdir()  # as random_model.py prepare leaves a folder
    (tmp_path / "PREP" / "config.json").write_text("{}")
    (tmp_path / "PREP" / "tokenizer.json").write_text("{}")
    mod = script(name)
    before = snapshot(tmp_path)
    rc = mod.main(argv)
    assert_clean_error(rc, capsys.readouterr().err, mod.PROG, *needles)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", sorted({n for n, _, _ in CASES}))
def test_script_follows_the_entry_convention(name, capsys):
    mod = script(name)
    assert isinstance(mod.PROG, str) and mod.PROG.startswith("python scripts/")
    assert isinstance(mod.build_parser(), entry.ArgumentParser)
    assert mod.main(["--help"]) == 0
    assert mod.PROG in capsys.readouterr().out


def test_compare_runs_reads_strictly_and_counts_nans(tmp_path, capsys):
    mod = script("compare_runs")
    a = results_file(tmp_path / "a.jsonl")
    run = tmp_path / "run"
    run.mkdir()
    b = results_file(run / "results.jsonl", shift=0.1)
    lines = b.read_text().splitlines()
    rec = json.loads(lines[2])
    rec["scores"]["zlib"] = None  # a text without a score: counted
    b.write_text("\n".join([*lines[:2], json.dumps(rec), *lines[3:]]) + "\n")
    assert mod.main([str(a), str(run), "--n-bootstrap", "20"]) == 0
    out = capsys.readouterr().out
    assert "| loss |" in out and "| 0, 1 |" in out and "NaN/inf A, B" in out
    torn = tmp_path / "torn.jsonl"
    torn.write_text(a.read_text()[:-20])
    rc = mod.main([str(a), str(torn)])
    assert_clean_error(rc, capsys.readouterr().err, "torn.jsonl line 24: not valid JSON")
    rc = mod.main([str(a), str(tmp_path)])  # a folder without results.jsonl
    assert_clean_error(rc, capsys.readouterr().err, "no results.jsonl there")
