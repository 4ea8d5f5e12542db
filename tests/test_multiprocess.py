"""`mia-jax score` on several processes, run as a pod runs it: the same command on every process (JAX's
multi-controller runtime on localhost, through MIA_JAX_DISTRIBUTED and its companions), checked against one
process's output.

- one claim: process 1 started 3 s before process 0 on a shared --out; a refusal reaches every process as one line
- streaming: N processes write passes/main/index.json and the same results.jsonl, byte for byte, as one process
- one disk per host: each process its own --out path (the same folder name on different disks)
- preemption: SIGTERM to one process stops both at one step with one line and exit 75; the same command resumes
- a lost process: SIGKILL of either process ends the other within the stated bound, without a traceback; the
  rerun reuses every finished shard
"""
import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from processes import start_processes, wait_processes

from mia_jax.runs import processes
from mia_jax.runs import preemption
from mia_jax.cli import main

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 240
WORDS = "the cat sat on a mat and dog ran far away from home under tree while birds sang".split()
ARGS = ["--stream-window", "500", "--tokens-per-batch", "64", "--no-progress", "--compilation-cache", "off"]


def _texts(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 30))),
                                        "label": i % 2}) + "\n" for i in range(n)))
    return path


def _command(model, data, out) -> list[str]:
    return ["-m", "mia_jax.cli", "score", "--model", str(model), "--data", str(data), "--out", str(out), *ARGS]


def _start(model, data, outs, delays=None, logs=None) -> list[subprocess.Popen]:
    """One process per entry of ``outs`` (its --out; ``helpers.start_processes``), logs beside the first."""
    logs = Path(logs or Path(outs[0]).parent)
    return start_processes([_command(model, data, out) for out in outs], logs, f"{Path(outs[0]).name}.{time.time_ns()}",
                           delays)


def _wait(procs, timeout=TIMEOUT) -> list[tuple[int, str]]:
    """(exit code, stderr without gloo's notes) of each process."""
    return [(rc, err) for rc, _, err in wait_processes(procs, timeout)]


def _when(path: Path, timeout=TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def corpus(tiny_llama_dir, tmp_path_factory):
    """Two corpora (1 200 texts: 3 windows; 3 000: 6 windows) and one process's results of each, from the same
    command called here."""
    root = tmp_path_factory.mktemp("multiprocess")
    small, large = _texts(root / "small.jsonl", 1200, 0), _texts(root / "large.jsonl", 3000, 1)
    for name, data in (("small", small), ("large", large)):
        assert main(["score", "--model", str(tiny_llama_dir), "--data", str(data), "--out", str(root / f"one-{name}"),
                     *ARGS]) == 0
    return root, small, large


def _same_as_one(out: Path, one: Path) -> None:
    assert json.loads((out / "passes" / "main" / "index.json").read_text())["n_texts"] > 500  # the streaming path
    assert (out / "results.jsonl").read_bytes() == (one / "results.jsonl").read_bytes()
    assert not [p.name for p in out.rglob("*") if "partial" in p.name or "process" in p.name]


def test_process_1_first_on_a_shared_out_streams_and_writes_what_one_process_writes(tiny_llama_dir, corpus):
    root, small, _ = corpus
    out = root / "shared"
    res = _wait(_start(tiny_llama_dir, small, [out, out], delays=[3.0, 0.0]))
    assert [rc for rc, _ in res] == [0, 0], res
    _same_as_one(out, root / "one-small")
    assert json.loads((out / "run.json").read_text())["n_processes"] == 2


def test_four_processes_one_disk_each_write_what_one_process_writes(tiny_llama_dir, corpus):
    """Four processes, each its own --out (as one disk per host: the same folder on four machines): process 0's
    folder holds the run, the others' only their own (by then removed) records of each window."""
    root, small, _ = corpus
    outs = [root / f"host{i}" / "run" for i in range(4)]
    res = _wait(_start(tiny_llama_dir, small, outs, logs=root))
    assert [rc for rc, _ in res] == [0] * 4, res
    _same_as_one(outs[0], root / "one-small")
    for other in outs[1:]:
        assert not [p for p in other.rglob("*") if p.is_file()]


def test_a_refused_out_is_one_line_on_every_process_and_nothing_changes(tiny_llama_dir, corpus):
    root, small, _ = corpus
    out = root / "notes"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    res = _wait(_start(tiny_llama_dir, small, [out, out], delays=[2.0, 0.0]))
    assert [rc for rc, _ in res] == [2, 2], res
    lines = [err.strip().splitlines() for _, err in res]
    assert lines[0] == lines[1] and len(lines[0]) == 1 and "holds no run description" in lines[0][0], lines
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine\n"


def test_sigterm_to_one_process_stops_both_at_one_step_and_the_same_command_resumes(tiny_llama_dir, corpus):
    root, _, large = corpus
    out = root / "preempted"
    procs = _start(tiny_llama_dir, large, [out, out])
    _when(out / "passes" / "main" / "00001.jsonl")
    procs[1].send_signal(signal.SIGTERM)
    res = _wait(procs)
    assert [rc for rc, _ in res] == [preemption.EXIT_CODE] * 2, res
    last = [err.strip().splitlines()[-1] for _, err in res]
    assert last[0] == last[1] and last[0].startswith("mia-jax: preempted after ") and "of 6 windows" in last[0]
    assert last[0].endswith("(saved); run the same command to resume")
    assert not any("Traceback" in err for _, err in res)
    finished = len(json.loads((out / "passes" / "main" / "index.json").read_text())["shards"])
    assert 1 < finished < 6
    res = _wait(_start(tiny_llama_dir, large, [out, out]))
    assert [rc for rc, _ in res] == [0, 0], res
    assert f"{finished} of 6 shards finished" in res[0][1] and "resuming the run in" in res[1][1]
    assert json.loads((out / "run.json").read_text())["passes"]["main"]["shards_reused"] == finished
    _same_as_one(out, root / "one-large")


def test_a_killed_process_ends_the_other_in_bounded_time_with_one_line_and_a_rerun_reuses_every_shard(
        tiny_llama_dir, corpus):
    """SIGKILL of process 1 (a lost host): process 0 ends within ``processes.HEARTBEAT_S`` (at once: the peer's
    connections are closed), without a Python traceback: with this project's one line and exit 1 when its failed
    collective is seen first, else by JAX's runtime, which aborts the process with its own log lines when its
    coordination service reports the lost task; the same command then reuses every shard finished before the kill
    (counted) and ends as one process does."""
    root, _, large = corpus
    out = root / "killed"
    procs = _start(tiny_llama_dir, large, [out, out])
    _when(out / "passes" / "main" / "00001.jsonl")
    procs[1].kill()
    t0 = time.monotonic()
    res = _wait(procs, timeout=processes.HEARTBEAT_S + 30)
    assert time.monotonic() - t0 < processes.HEARTBEAT_S
    assert res[1][0] == -signal.SIGKILL and res[0][0] in (1, -signal.SIGABRT) and "Traceback" not in res[0][1], res
    if res[0][0] == 1:  # this project's line came before the runtime's own abort (a race: see README)
        last = res[0][1].strip().splitlines()[-1]
        assert "another process of this run failed or was lost" in last
        assert last.endswith("run the same command on every host to resume")
    finished = len(json.loads((out / "passes" / "main" / "index.json").read_text())["shards"])
    res = _wait(_start(tiny_llama_dir, large, [out, out]))
    assert [rc for rc, _ in res] == [0, 0], res
    assert json.loads((out / "run.json").read_text())["passes"]["main"]["shards_reused"] == finished >= 1
    _same_as_one(out, root / "one-large")


def test_a_killed_coordinator_ends_the_other_process_in_bounded_time(tiny_llama_dir, corpus):
    """SIGKILL of process 0, the coordinator: JAX's runtime ends process 1 itself (its own log lines, then exit 1
    when this project's line comes first or SIGABRT), without a Python traceback, within ``processes.HEARTBEAT_S``."""
    root, small, _ = corpus
    out = root / "coordinator"
    procs = _start(tiny_llama_dir, small, [out, out])
    _when(out / "passes" / "main" / "00000.jsonl")
    procs[0].kill()
    t0 = time.monotonic()
    res = _wait(procs, timeout=processes.HEARTBEAT_S + 30)
    assert time.monotonic() - t0 < processes.HEARTBEAT_S
    assert res[1][0] in (1, -signal.SIGABRT) and "Traceback" not in res[1][1], res
