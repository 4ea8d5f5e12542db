"""Every bad input of the command line, built for real: exit code 2, one line `mia-jax: error: ...` without a
traceback, and a run folder given as --out (holding a finished run) left exactly as it was.

The library-level checks of each failure (the exact messages, more variants) are in test_bad_data.py
(data files, configs, prompts) and test_bad_checkpoints.py (GGUF, safetensors, config.json, tokenizers)."""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from helpers import ENV, REPO, write_tiny_gguf

from mia_jax.cli import main

ROWS = [{"input": f"text number {i} about a thing that happened", "label": i % 2} for i in range(8)]


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def finished(tiny_llama_dir, tmp_path_factory):
    """A finished eval run: the folder every bad command below is pointed at."""
    base = tmp_path_factory.mktemp("finished")
    (base / "data.jsonl").write_bytes(jsonl(ROWS))
    out = base / "run"
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(base / "data.jsonl"), "--methods", "loss",
                 "--n-bootstrap", "10", "--no-blind", "--no-progress", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama_dir, tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_llama_dir)


def snapshot(folder):
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def write(path, content: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return str(path)


def model_copy(tiny_llama_dir, tmp_path, file: str, content: bytes) -> str:
    folder = shutil.copytree(tiny_llama_dir, tmp_path / "model")
    (folder / file).write_bytes(content)
    return str(folder)


def gguf_cut(tiny_gguf, tmp_path, n_bytes) -> str:
    return write(tmp_path / "cut.gguf", tiny_gguf.read_bytes()[:n_bytes])


def mamba_gguf(tmp_path) -> str:
    import gguf

    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def with_data(name: str, content: bytes, *extra: str):
    """An argv builder: the tiny model and a data file ``name`` holding ``content``."""
    return lambda m, g, t: ["--model", str(m), "--data", write(t / name, content), *extra]


# (id, argv builder (tiny_llama_dir, tiny_gguf, tmp_path) -> the arguments after `eval --out DIR`, expected text)
CASES = [
    ("json-line", with_data("d.jsonl", jsonl(ROWS[:2]) + b'{"input": "x",\n'), "d.jsonl: line 3 is not valid JSON"),
    ("json-column", with_data("d.jsonl", b'  {"input": "\xc3\xa9\xc3\xa9" "label": 1}\n'),
     "line 1 is not valid JSON (Expecting ',' delimiter at column 18)"),  # characters, from 1
    ("missing-field", with_data("d.jsonl", jsonl([{"body": "a b", "label": 1}])),
     "row 1 has neither a 'text' nor an 'input' field (fields: body, label)"),
    ("missing-label", with_data("d.jsonl", jsonl([{"input": "a b", "lbl": 1}])), "row 1 has no field 'label'"),
    ("label-2", with_data("d.jsonl", jsonl([{"input": "a b", "label": 2}])), "row 1 has label 2; labels must be 0"),
    ("text-not-string", with_data("d.jsonl", jsonl([{"input": 5, "label": 1}])),
     "field 'input' is int, expected a string"),
    ("no-rows", with_data("d.jsonl", b"\n"), "no rows"),
    ("missing-data", lambda m, g, t: ["--model", str(m), "--data", str(t / "nope.jsonl")], "nope.jsonl: no such file"),
    ("latin1-jsonl", with_data("d.jsonl", b'{"input": "caf\xe9", "label": 1}\n'),
     "d.jsonl: line 1 is not valid utf-8 (byte 0xe9 at file offset 14); re-save the file as UTF-8 or pass"),
    ("latin1-csv", with_data("d.csv", b"input,label\ncaf\xe9,1\n"), "d.csv: line 2 is not valid utf-8 (byte 0xe9"),
    ("latin1-tsv", with_data("d.tsv", b"input\tlabel\nna\xefve\t0\n"), "d.tsv: line 2 is not valid utf-8 (byte 0xef"),
    ("unknown-encoding", with_data("d.jsonl", jsonl(ROWS), "--encoding", "klingon"), "unknown text encoding 'klingon'"),
    ("unknown-method", lambda m, g, t: ["--model", str(m), "--methods", "loss", "minkprob"],
     "unknown method 'minkprob'"),
    ("batch-size-0", lambda m, g, t: ["--model", str(m), "--batch-size", "0"], "--batch-size: must be at least 1"),
    ("k-1.5", lambda m, g, t: ["--model", str(m), "--methods", "min_k", "--k", "1.5"], "fraction"),
    ("length-48", lambda m, g, t: ["--model", str(m), "--length", "48"], "WikiMIA has lengths"),
    ("limit-0", lambda m, g, t: ["--model", str(m), "--limit", "0"], "--limit: must be at least 1"),
    ("no-model", lambda m, g, t: ["--model", str(t / "no_model_here"), "--limit", "2"], "no such local path"),
    ("hub-id", lambda m, g, t: ["--model", "someorg/somemodel", "--limit", "2"], "--allow-download"),
    ("mamba-gguf", lambda m, g, t: ["--model", mamba_gguf(t), "--limit", "2"], "mamba"),
    ("gguf-garbage", lambda m, g, t: ["--model", write(t / "g.gguf", b"GGUF" + bytes(range(256)) * 8), "--limit", "2"],
     "g.gguf"),
    ("gguf-header-short", lambda m, g, t: ["--model", gguf_cut(g, t, 10), "--limit", "2"], "cut.gguf"),
    ("gguf-truncated", lambda m, g, t: ["--model", gguf_cut(g, t, g.stat().st_size * 3 // 4), "--limit", "2"],
     "truncated or corrupt GGUF"),
    ("config-not-object", lambda m, g, t: ["--model", model_copy(m, t, "config.json", b"[1, 2]"), "--limit", "2"],
     "config.json: expected a JSON object"),
    ("config-missing-key", lambda m, g, t: ["--model", model_copy(m, t, "config.json", json.dumps(
        {k: v for k, v in json.loads((m / "config.json").read_text()).items() if k != "hidden_size"}).encode()),
        "--limit", "2"], "required key 'hidden_size' is missing"),
    ("safetensors-random", lambda m, g, t: ["--model", model_copy(m, t, "model.safetensors", struct.pack("<Q", 40)
                                                                   + os.urandom(4000)), "--limit", "2"],
     "model.safetensors: not a valid safetensors file"),
    ("tokenizer-not-tokenizer", lambda m, g, t: ["--model", model_copy(m, t, "tokenizer.json", b'{"hello": 1}'),
                                                 "--limit", "2"], "tokenizer.json: not a valid tokenizer.json"),
]


@pytest.mark.parametrize("build, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_eval_bad_input(finished, tiny_llama_dir, tiny_gguf, tmp_path, capsys, build, expected):
    out = shutil.copytree(finished, tmp_path / "run")
    before = snapshot(out)
    capsys.readouterr()
    rc = main(["eval", "--out", str(out), "--no-progress", *build(tiny_llama_dir, tiny_gguf, tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(("mia-jax: error: ", "mia-jax eval: error: argument ")), err
    assert "Traceback" not in err, err
    assert expected in err, err
    assert snapshot(out) == before


def test_a_different_run_is_refused_and_the_folder_kept(finished, tiny_llama_dir, tmp_path, capsys):
    out = shutil.copytree(finished, tmp_path / "run")
    data = tmp_path / "data.jsonl"
    data.write_bytes(jsonl([dict(r, flipped=1 - r["label"]) for r in ROWS]))
    before = snapshot(out)
    capsys.readouterr()
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "loss",
                 "--label-field", "flipped", "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "holds a different run" in err and "label_field" in err
    assert snapshot(out) == before


def test_out_that_is_a_file(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "results.txt"
    out.write_text("my notes")
    assert main(["eval", "--model", str(tiny_llama_dir), "--out", str(out), "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert err == (f"mia-jax eval: error: argument --out: {out} is an existing file, not a folder; give a folder "
                   "path (see mia-jax eval --help)\n")
    assert out.read_text() == "my notes"


def test_a_second_process_on_the_same_folder(finished, tiny_llama_dir, tmp_path):
    """Two real processes: the second is refused at once with the first's PID; the folder is unchanged."""
    out = shutil.copytree(finished, tmp_path / "run")
    before = snapshot(out)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom mia_jax.runs import rundir\n"
         "with rundir.claim(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n", str(out)],
        stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "held"
        data = finished.parent / "data.jsonl"
        second = subprocess.run([sys.executable, "-m", "mia_jax.cli", "eval", "--model", str(tiny_llama_dir),
                                 "--data", str(data), "--methods", "loss", "--n-bootstrap", "10", "--no-blind",
                                 "--no-progress", "--out", str(out)], cwd=REPO, env=ENV, capture_output=True, text=True)
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 2
    assert second.stderr.splitlines() == [f"mia-jax: error: {out} is in use by another process (PID {holder.pid}); "
                                          "wait for it to finish, or use another --out"]
    after = snapshot(out)
    assert after.pop(".lock")[0] == f"{holder.pid}\n".encode()  # the holder's (killed: it could not remove it)
    assert after == before


def test_generate_empty_prompt(tiny_llama_dir, capsys):
    assert main(["generate", "--model", str(tiny_llama_dir), "--prompt", "hello", "--prompt", ""]) == 2
    assert capsys.readouterr().err == "mia-jax: error: prompt 2 is empty: give some text to continue\n"


@pytest.mark.parametrize("override, expected", [
    ("train.batch_size=abc", "override train.batch_size=abc: expected an int"),
    ("train.lrr=1", "unknown key 'train.lrr'"),
])
def test_contaminate_bad_override_in_a_run_folder(finished, tmp_path, capsys, override, expected):
    from train.contaminate import main as contaminate

    out = shutil.copytree(finished, tmp_path / "run")
    before = snapshot(out)
    capsys.readouterr()
    assert contaminate(["--config", str(REPO / "configs/contamination/tiny.yaml"), "--out", str(out), override]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("python train/contaminate.py: error: "), err
    assert expected in err, err
    assert snapshot(out) == before
