"""Real runs killed mid-scoring (SIGKILL, then SIGINT) resume from their finished batches: the batches on
disk at the kill are counted and must not be computed again, and the final files must be byte-identical to
an uninterrupted run's. One test for `mia-jax eval` with a multi-pass method, one for train/contaminate.py."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mia_jax import models, runner
from mia_jax.cli import main
from mia_jax.data import wikimia

REPO = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}


def complete_records(path: Path) -> list[dict]:
    """The records of a passes file that a resume can reuse (a torn last line is not one)."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def start(argv, cwd=REPO, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env or ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def interrupt_when(proc: subprocess.Popen, path: Path, n_lines: int, sig: int, timeout: float = 300) -> str:
    """Send ``sig`` as soon as ``path`` holds ``n_lines`` complete records; returns the process's stderr."""
    deadline = time.monotonic() + timeout
    while len(complete_records(path)) < n_lines:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it could be interrupted:\n{proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} never reached {n_lines} records")
        time.sleep(0.005)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return err


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    ds = wikimia(64)
    path = tmp_path_factory.mktemp("kill") / "wikimia64.jsonl"
    path.write_text("".join(json.dumps({"input": t, "label": y}) + "\n" for t, y in zip(ds.texts, ds.labels)))
    return path, len(ds), [t.lower() for t in ds.texts]


def unfinished_batches(model_dir, texts, done: set, batch_size: int = 2) -> int:
    """Batches of the runner's plan for ``texts`` that hold a text not in ``done``: what a resume must compute."""
    loaded = models.load(str(model_dir))
    lengths = [len(e.ids) for e in runner.encode(loaded, texts)]
    plan = runner.plan_batches(lengths, runner.bucket_lengths(loaded.max_length), batch_size)
    return sum(1 for _, idx in plan if not set(idx) <= done)


def test_eval_killed_then_interrupted_resumes_without_recomputing(tiny_llama_dir, data, tmp_path, capsys):
    path, n, lowered = data
    args = ["eval", "--model", str(tiny_llama_dir), "--data", str(path), "--methods", "loss", "zlib", "lowercase",
            "--batch-size", "2", "--n-bootstrap", "10", "--no-progress", "--no-blind"]
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
    assert passes["main"] == {"texts": n, "reused": n, "computed": 0, "batches_computed": 0, "skipped": 0}
    assert passes["lowercase"]["reused"] == done_lower and passes["lowercase"]["computed"] == n - done_lower
    assert passes["lowercase"]["batches_computed"] == unfinished_batches(tiny_llama_dir, lowered, done_lower_idx)
    for name in ("results.jsonl", "passes/main.jsonl", "passes/lowercase.jsonl", "summary.json"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def test_contaminate_killed_then_interrupted_mid_scoring_resumes(tmp_path, capsys):
    from train import contaminate

    env = ENV | {"MIA_JAX_CACHE": str(tmp_path / "cache")}
    small = ["score.batch_size=2", "score.n_bootstrap=10", "corpus.background_tokens=8000", "corpus.n_positives=8",
             "corpus.n_negatives=8", "train.epochs=1"]
    config = str(REPO / "configs" / "contamination" / "tiny.yaml")
    reference, out = tmp_path / "reference", tmp_path / "run"
    os.environ["MIA_JAX_CACHE"] = env["MIA_JAX_CACHE"]
    try:
        assert contaminate.main(["--config", config, "--out", str(reference), "--no-progress", *small]) == 0
    finally:
        os.environ.pop("MIA_JAX_CACHE")
    n = len((reference / "corpus" / "eval.jsonl").read_text().splitlines())
    cmd = [str(REPO / "train" / "contaminate.py"), "--config", config, "--out", str(out), "--no-progress", *small]

    # 1. SIGKILL while the base model scores the eval set (before training)
    base_main = lambda: next((out / "base_scores").glob("*/passes/main.jsonl"), out / "none")  # noqa: E731
    proc = start(cmd, env=env)
    deadline = time.monotonic() + 300
    while not base_main().exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    interrupt_when(proc, base_main(), 6, signal.SIGKILL)
    done_base = len(complete_records(base_main()))
    assert 6 <= done_base < n and not (out / "train" / "done.json").exists()

    # 2. the same command resumes the base scores, trains, and is interrupted (Ctrl-C) scoring the trained model
    proc = start(cmd, env=env)
    err = interrupt_when(proc, out / "scores" / "trained" / "passes" / "main.jsonl", 6, signal.SIGINT)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert f"resuming from {base_main()}: {done_base} of {n} texts already scored" in err
    assert "interrupted; run the same command again to resume" in err
    done_trained = len(complete_records(out / "scores" / "trained" / "passes" / "main.jsonl"))
    assert 6 <= done_trained < n and (out / "train" / "done.json").exists()

    # 3. once more to the end: nothing finished is computed again, and every file matches the uninterrupted run
    os.environ["MIA_JAX_CACHE"] = env["MIA_JAX_CACHE"]
    try:
        assert contaminate.main(cmd[1:]) == 0
    finally:
        os.environ.pop("MIA_JAX_CACHE")
    scoring = json.loads((out / "run.json").read_text())["scoring"]
    assert scoring["base"]["main"]["reused"] == n and scoring["base"]["main"]["computed"] == 0
    assert scoring["trained"]["main"]["reused"] == done_trained
    assert scoring["trained"]["main"]["computed"] == n - done_trained
    for name in ("table3.md", "table7.md", "metrics.json", "scores/trained/results.jsonl",
                 "scores/trained/passes/lowercase.jsonl", "scores/trained/passes/ref.jsonl"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert base_main().read_bytes() == next((reference / "base_scores").glob("*/passes/main.jsonl")).read_bytes()
