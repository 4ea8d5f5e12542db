"""``python -m train.finetune`` preempted and resumed through the command itself, on 2 processes (JAX's
multi-controller runtime on localhost, through MIA_JAX_DISTRIBUTED and its companions) and on one.

- SIGTERM to process 1 only, once ``batches.jsonl`` has 2 lines: both processes stop after the same step, each with
  the one preemption line as its last line and exit 75 (no traceback), with the checkpoint of that step on disk and
  no model;
- the same 2-process command again resumes from that step and ends as the uninterrupted 2-process run of the same
  command: ``batches.jsonl`` byte for byte, the per-step losses and gradient norms and the exported parameters
  within 1e-5;
  (here byte for byte, the metrics and the model too);
- the same with one process (SIGTERM to it), compared with the same uninterrupted 2-process run (the batches do not
  depend on the number of processes);
- the packed sequences on several processes (``grain_input.packed_records``): process 0 writes them, another process
  opens that file once process 0 is done, or writes its own copy where it has a disk of its own.
"""
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from processes import kill_processes, start_processes, wait_processes

from mia_jax.runs import preemption
from train import grain_input

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # any one command; a healthy run takes seconds
N_TEXTS = 12
OVERRIDES = ["train.seq_len=16", "train.batch_size=2", "train.epochs=2", "train.checkpoint_every=1000",
             "train.lr=3e-3", "train.seed=5"]
PREEMPTED = re.compile(r"preempted after training step (\d+) of (\d+) \(saved\); run the same command "
                       r"to resume$")


def _texts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"text": f"Chapter {i}. The lighthouse keeper counted {i % 7} ships before "
                                                f"the storm of year {1900 + i}."}) + "\n" for i in range(N_TEXTS)))
    return path


def _start(model: Path, texts: Path, out: Path, n: int, logs: Path, tag: str) -> list[subprocess.Popen]:
    """The same ``python -m train.finetune`` command as ``n`` processes on ``out`` (``helpers.start_processes``)."""
    command = ["-m", "train.finetune", "--model", str(model), "--texts", str(texts), "--out", str(out),
               "--no-progress", *OVERRIDES]
    return start_processes([command] * n, logs, tag)


def _wait(procs: list[subprocess.Popen], timeout: float = TIMEOUT) -> list[tuple[int, str, str]]:
    return wait_processes(procs, timeout)


def _lines(path: Path) -> int:
    try:
        return path.read_text().count("\n")
    except FileNotFoundError:
        return 0


def _preempt(runs: list[tuple[list[subprocess.Popen], subprocess.Popen, Path]], at_lines: int = 2,
             timeout: float = TIMEOUT) -> None:
    """For each run (its processes, the one to signal, its ``batches.jsonl``): SIGTERM to that process once the file
    has ``at_lines`` lines (polled together: a run of one process takes milliseconds a step). Fails, every process
    killed, when a run ends first or past ``timeout``."""
    deadline, waiting = time.monotonic() + timeout, list(runs)
    while waiting:
        for run in list(waiting):
            procs, target, batches = run
            if _lines(batches) >= at_lines:
                target.send_signal(signal.SIGTERM)
                waiting.remove(run)
            elif time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                kill_processes([p for r in runs for p in r[0]])
                pytest.fail(f"{batches} did not reach {at_lines} lines (exit codes {[p.poll() for p in procs]})")
        time.sleep(0.005)


@pytest.fixture(scope="module")
def runs(tiny_llama_dir, tmp_path_factory):
    """Every run, overlapped (the command's start-up, JAX and the step's compilation, is most of each run's time):
    the uninterrupted 2-process run, the 2-process run preempted through process 1 and the 1-process run preempted
    start together; each preempted run's resumption starts when it has ended."""
    root = tmp_path_factory.mktemp("train_preemption")
    texts, logs, t0 = _texts(root / "t.jsonl"), root / "logs", time.monotonic()
    logs.mkdir()
    started: list[subprocess.Popen] = []
    res, marks = {}, []

    def start(name, n, tag):
        procs = _start(tiny_llama_dir, texts, root / name, n, logs, tag)
        started.extend(procs)
        return procs

    def mark(what):
        marks.append(f"{what} {time.monotonic() - t0:.1f} s")

    try:
        full, two, one = start("full", 2, "full"), start("two", 2, "two"), start("one", 1, "one")
        _preempt([(two, two[1], root / "two" / "train" / "batches.jsonl"),  # process 1 only
                  (one, one[0], root / "one" / "train" / "batches.jsonl")])
        mark("notices sent")
        res["one"] = _wait(one)
        res["one_after"] = _state(root / "one")
        one_resumed = start("one", 1, "one_resumed")
        mark("one preempted")
        res["two"] = _wait(two)
        res["two_after"] = _state(root / "two")
        two_resumed = start("two", 2, "two_resumed")
        mark("two preempted")
        res["one_resumed"] = _wait(one_resumed)
        mark("one resumed")
        res["full"] = _wait(full)
        mark("full")
        res["two_resumed"] = _wait(two_resumed)
        mark("two resumed")
    finally:
        kill_processes(started)
    res["seconds"] = time.monotonic() - t0
    print("; ".join(marks))
    return root, res


def _state(out: Path) -> dict:
    ckpt = out / "train" / "checkpoints"
    return {"checkpoints": sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.is_dir() else [],
            "batch_lines": _lines(out / "train" / "batches.jsonl"), "model": (out / "model").exists(),
            "train_json": (out / "train.json").exists()}


def _ok(res) -> None:
    for rc, out, err in res:
        assert rc == 0 and "Traceback" not in out + err, f"exit {rc}:\n{err[-3000:]}"


def _preempted_at(res, state) -> int:
    """The step every process stopped after (one preemption line, the last, on each; exit 75; no traceback)."""
    steps = set()
    for rc, out, err in res:
        assert rc == preemption.EXIT_CODE, f"exit {rc}:\n{err[-3000:]}"
        assert "Traceback" not in out + err, err[-3000:]
        lines = [x for x in err.splitlines() if x.strip()]
        assert sum("preempted" in x for x in lines) == 1, err[-3000:]
        assert lines[-1].startswith("python -m train.finetune: preempted after training step"), err[-3000:]
        assert "run the same command to resume" in lines[-1]
        found = PREEMPTED.search(lines[-1])
        assert found, lines[-1]
        steps.add((int(found.group(1)), int(found.group(2))))
    assert len(steps) == 1, steps  # every process stopped after the same step
    (step, total), = steps
    assert 2 <= step < total
    # the checkpoint of that step, the batches up to it, no model and no train.json
    assert step in state["checkpoints"] and max(state["checkpoints"]) == step, state
    assert state["batch_lines"] == step and not state["model"] and not state["train_json"], state
    return step


def _same_as_full(root: Path, name: str, exact: bool) -> None:
    """``name``'s run ended as the uninterrupted 2-process run: the same batches.jsonl, per-step losses and gradient
    norms and exported parameters within 1e-5; with ``exact`` (the same number of processes) byte for byte."""
    full, run = root / "full", root / name
    assert (run / "train" / "batches.jsonl").read_bytes() == (full / "train" / "batches.jsonl").read_bytes()
    if exact:
        for file in ("train/metrics.jsonl", "model/model.safetensors"):
            assert (run / file).read_bytes() == (full / file).read_bytes(), file
    a, b = ([json.loads(x) for x in (r / "train" / "metrics.jsonl").read_text().splitlines()] for r in (full, run))
    assert [(m["step"], m["tokens"], m["lr"]) for m in a] == [(m["step"], m["tokens"], m["lr"]) for m in b]
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5) and x["grad_norm"] == pytest.approx(y["grad_norm"],
                                                                                                   rel=1e-5)
    pa, pb = (load_file(str(r / "model" / "model.safetensors")) for r in (full, run))
    assert pa.keys() == pb.keys()
    for k in pa:
        np.testing.assert_allclose(pb[k].astype(np.float64), pa[k].astype(np.float64), rtol=1e-5, atol=1e-6)


def test_sigterm_to_process_1_stops_both_at_one_step_and_the_same_command_resumes_exactly(runs):
    root, res = runs
    _ok(res["full"])
    step = _preempted_at(res["two"], res["two_after"])
    _ok(res["two_resumed"])
    info = json.loads((root / "two" / "train.json").read_text())
    assert info["resumed_from"] == step
    assert info["steps"] == json.loads((root / "full" / "train.json").read_text())["steps"] > step
    _same_as_full(root, "two", exact=True)
    data = sorted(p.name for p in (root / "two" / "train" / "data").iterdir())
    assert data == ["sequences.array_record", "sequences.json"]  # no temporary left by either process
    print(f"2 processes: preempted after step {step} of {info['steps']}; {res['seconds']:.1f} s for every run")


def test_sigterm_to_one_process_stops_it_and_the_same_command_resumes_exactly(runs):
    root, res = runs
    step = _preempted_at(res["one"], res["one_after"])
    _ok(res["one_resumed"])
    info = json.loads((root / "one" / "train.json").read_text())
    assert info["resumed_from"] == step
    _same_as_full(root, "one", exact=False)  # the batches do not depend on the number of processes
    print(f"1 process: preempted after step {step} of {info['steps']}")


def test_packed_records_on_a_process_other_than_0(tiny_llama_dir, tmp_path, monkeypatch):
    """Process 1's side of ``packed_records`` (process 0's turn done beforehand, its digest broadcast): on a shared
    folder it opens process 0's file and writes nothing; on a disk of its own (no file) it writes its copy."""
    tok = Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))
    docs = [f"Chapter {i}. The keeper counted {i % 7} ships." for i in range(30)]
    shared = tmp_path / "shared"
    written = grain_input.packed_records(shared, docs, tok, 16, 0)  # process 0 (the only process here)
    mtime = (shared / grain_input.RECORDS).stat().st_mtime_ns
    broadcast = []
    monkeypatch.setattr(grain_input.processes, "is_main_process", lambda: False)
    monkeypatch.setattr(grain_input.processes, "broadcast_json", lambda obj: broadcast.append(obj) or written.sha256)
    real_write = grain_input.write_records

    def no_write(*args, **kwargs):
        raise AssertionError("process 1 wrote the file on a shared folder")

    monkeypatch.setattr(grain_input, "write_records", no_write)
    opened = grain_input.packed_records(shared, docs, tok, 16, 0)
    assert broadcast == [None] and opened == written and (shared / grain_input.RECORDS).stat().st_mtime_ns == mtime
    monkeypatch.setattr(grain_input, "write_records", real_write)
    own = grain_input.packed_records(tmp_path / "own", docs, tok, 16, 0)  # one disk per host: its own copy
    assert own.sha256 == written.sha256 and own.path == tmp_path / "own" / grain_input.RECORDS
    assert (own.path.read_bytes(), (tmp_path / "own" / grain_input.META).read_text()) == \
        (written.path.read_bytes(), (shared / grain_input.META).read_text())
