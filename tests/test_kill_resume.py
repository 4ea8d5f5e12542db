"""Real runs killed mid-scoring (SIGKILL, then SIGINT) resume from their finished batches: the batches on
disk at the kill are counted and must not be computed again, and the final files must be byte-identical to
an uninterrupted run's. `mia-jax eval` with a multi-pass method here; train/contaminate.py in test_contaminate.py
(it shares that module's uninterrupted run). The helpers are used by both."""
import json
import signal

import pytest
from helpers import complete_records, interrupt_when, start

from mia_jax import batching, models
from mia_jax.cli import main
from mia_jax.data import wikimia


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    ds = wikimia(64)
    path = tmp_path_factory.mktemp("kill") / "wikimia64.jsonl"
    path.write_text("".join(json.dumps({"input": t, "label": y}) + "\n" for t, y in zip(ds.texts, ds.labels)))
    return path, len(ds), [t.lower() for t in ds.texts]


def unfinished_batches(model_dir, texts, done: set, tokens_per_batch: int = 128) -> int:
    """Steps of the runner's plan for ``texts`` that hold a text not in ``done``: what a resume must compute."""
    loaded = models.load(str(model_dir))
    lengths = batching.scoring_lengths(batching.encode(loaded, texts))
    steps = batching.pack(lengths, tokens_per_batch, loaded.max_length)
    return sum(1 for s in steps if not set(s.items) <= done)


def test_eval_killed_then_interrupted_resumes_without_recomputing(tiny_llama_dir, data, tmp_path, capsys):
    path, n, lowered = data
    args = ["eval", "--model", str(tiny_llama_dir), "--data", str(path), "--methods", "loss", "zlib", "lowercase",
            "--tokens-per-batch", "128", "--n-bootstrap", "10", "--no-progress", "--no-blind"]
    reference = tmp_path / "reference"
    assert main(args + ["--out", str(reference)]) == 0

    out = tmp_path / "run"
    cmd = ["-m", "mia_jax.cli", *args, "--out", str(out)]
    # 1. SIGKILL in the middle of the main pass
    interrupt_when(start(cmd), out / "passes" / "main.jsonl", 20, signal.SIGKILL)
    done_main = len(complete_records(out / "passes" / "main.jsonl"))
    assert 20 <= done_main < n and not (out / "results.jsonl").exists()

    # 2. the same command resumes; Ctrl-C (SIGINT) in the middle of the lowercase pass
    proc = start(cmd)
    err = interrupt_when(proc, out / "passes" / "lowercase.jsonl", 20, signal.SIGINT)
    assert proc.returncode == 130, err
    assert "resuming the run" in err
    assert f"scoring: resuming from {out / 'passes' / 'main.jsonl'}: {done_main} of {n} texts already scored" in err
    assert "interrupted; every finished batch is in the output folder's passes/" in err
    assert "Traceback" not in err
    done_lower_idx = {r["index"] for r in complete_records(out / "passes" / "lowercase.jsonl")}
    done_lower = len(done_lower_idx)
    assert 20 <= done_lower < n
    assert len(complete_records(out / "passes" / "main.jsonl")) == n

    # 3. the same command again finishes: only the missing batches are computed
    capsys.readouterr()
    assert main(args + ["--out", str(out)]) == 0
    passes = json.loads((out / "run.json").read_text())["passes"]
    assert passes["main"] == {"texts": n, "reused": n, "computed": 0, "batches_computed": 0, "skipped": 0,
                              "slots": 0, "tokens": 0, "scoring_programs": 0}
    assert passes["lowercase"]["reused"] == done_lower and passes["lowercase"]["computed"] == n - done_lower
    assert passes["lowercase"]["batches_computed"] == unfinished_batches(tiny_llama_dir, lowered, done_lower_idx)
    for name in ("results.jsonl", "passes/main.jsonl", "passes/lowercase.jsonl", "summary.json"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
