"""The same command on several processes, as a pod runs it: JAX's multi-controller runtime on localhost (imported by
the tests as ``from processes import ...``)."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_processes(commands: list[list[str]], logs: Path, tag: str, delays=None) -> list[subprocess.Popen]:
    """One process per command (the arguments after ``python``; one CPU device each), joined by JAX's
    multi-controller runtime on localhost (``MIA_JAX_DISTRIBUTED`` and its companions) when there are several,
    process i started ``delays[i]`` seconds after the first (in the order of the delays). Each one's stdout and stderr
    go to files under ``logs`` (a pipe nobody reads could fill); :func:`wait_processes` reads them."""
    n, port = len(commands), free_port()
    delays = delays or [0.0] * n
    procs: list = [None] * n
    t0 = time.monotonic()
    for i in sorted(range(n), key=lambda i: delays[i]):
        time.sleep(max(0.0, t0 + delays[i] - time.monotonic()))
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
                   PYTHONPATH=str(REPO))
        env.pop("MIA_JAX_DISTRIBUTED", None)
        if n > 1:
            env.update(MIA_JAX_DISTRIBUTED="1", MIA_JAX_COORDINATOR=f"127.0.0.1:{port}", MIA_JAX_NUM_PROCESSES=str(n),
                       MIA_JAX_PROCESS_ID=str(i))
        paths = (logs / f"{tag}.p{i}.out", logs / f"{tag}.p{i}.err")
        files = [path.open("w") for path in paths]
        procs[i] = subprocess.Popen([sys.executable, *commands[i]], env=env, cwd=REPO, stdout=files[0],
                                    stderr=files[1])
        procs[i].logs, procs[i].files = paths, files
    return procs


def wait_processes(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr without gloo's connection notes) of each process of :func:`start_processes`; every
    process killed past ``timeout`` (and the test failed)."""
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the processes did not end within {timeout} s")
    finally:
        kill_processes(procs)
    res = []
    for p in procs:
        out, err = (path.read_text() for path in p.logs)
        res.append((p.returncode, out, "\n".join(x for x in err.splitlines() if not x.startswith("[Gloo]"))))
    return res


def kill_processes(procs) -> None:
    """Kill and reap every process of :func:`start_processes` still running; close their log files."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
        for f in p.files:
            if not f.closed:
                f.close()
