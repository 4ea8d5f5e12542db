"""mia_jax.rundir: the lock, the fingerprint decision, and that nothing is written before it."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mia_jax import entry, rundir
from mia_jax.errors import UserError


def snapshot(folder):
    """Every file under ``folder`` with its bytes and mtime: what 'nothing changed' is checked against."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_new_folder_is_claimed_and_released(tmp_path):
    out = tmp_path / "run"
    with rundir.claim(out, {"a": 1}) as resume:
        assert resume is False
        assert json.loads((out / "config.json").read_text()) == {"a": 1}
        assert (out / rundir.LOCK).read_text().strip() == str(os.getpid())
    assert not (out / rundir.LOCK).exists()
    with rundir.claim(out, {"a": 1}) as resume:  # the same fingerprint: resumed
        assert resume is True


def test_different_fingerprint_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    with rundir.claim(out, {"a": 1, "b": {"c": 2}}):
        (out / "results.jsonl").write_text("{}\n")
    before = snapshot(out)
    with pytest.raises(UserError, match=r"differs in: b\.c: 2 -> 3") as e:
        with rundir.claim(out, {"a": 1, "b": {"c": 3}}):
            pass
    assert "\n" not in str(e.value)
    assert snapshot(out) == before


def test_overwrite_empties_the_folder(tmp_path):
    out = tmp_path / "run"
    with rundir.claim(out, {"a": 1}):
        (out / "passes").mkdir()
        (out / "passes" / "main.jsonl").write_text("{}\n")
    with rundir.claim(out, {"a": 2}, overwrite=True) as resume:
        assert resume is False and not (out / "passes").exists()
        assert json.loads((out / "config.json").read_text()) == {"a": 2}


def test_a_file_or_a_foreign_folder_is_refused(tmp_path):
    file = tmp_path / "out.txt"
    file.write_text("mine")
    with pytest.raises(UserError, match="existing file, not a folder"):
        with rundir.claim(file, {"a": 1}):
            pass
    assert file.read_text() == "mine"
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    before = snapshot(foreign)
    with pytest.raises(UserError, match="holds no run description"):
        with rundir.claim(foreign, {"a": 1}):
            pass
    assert snapshot(foreign) == before


def test_claims_nest_within_a_process(tmp_path):
    out = tmp_path / "run"
    with rundir.claim(out, {"sweep": 1}):
        with rundir.claim(out, {"run": 1}, file="run_config.json") as resume:
            assert resume is False and (out / "run_config.json").exists()
        assert (out / rundir.LOCK).exists()  # still held by the outer claim
    assert not (out / rundir.LOCK).exists()


def test_a_second_process_is_refused_with_the_first_ones_pid(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom mia_jax import rundir\n"
         "with rundir.claim(sys.argv[1], {'a': 1}):\n    print('held', flush=True)\n    time.sleep(60)\n", str(out)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(out)
        with pytest.raises(UserError, match=f"in use by another process \\(PID {holder.pid}\\)"):
            with rundir.claim(out, {"a": 1}):
                pass
        assert snapshot(out) == before
    finally:
        holder.kill()
        holder.wait()
    # the lock died with its process: the folder can be claimed at once
    with rundir.claim(out, {"a": 1}) as resume:
        assert resume is True


def test_a_swallowed_ctrl_c_is_raised_again_at_the_next_check(tmp_path):
    """Python drops a KeyboardInterrupt raised inside a GC callback; the claim remembers it for the next batch."""
    with rundir.claim(tmp_path / "run", {"a": 1}):
        entry.check_interrupted()  # nothing pressed yet
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass  # swallowed, as in a GC callback
        with pytest.raises(KeyboardInterrupt):
            entry.check_interrupted()
    entry.check_interrupted()  # forgotten once the run is over
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_later_ctrl_c_during_a_claim_do_not_raise_again(tmp_path):
    """Only the first Ctrl-C raises: the second and third, pressed while the first unwinds, returned into JAX's
    callbacks as "Exception ignored" tracebacks when they raised too."""
    with rundir.claim(tmp_path / "run", {"a": 1}):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass
        os.kill(os.getpid(), signal.SIGINT)  # a second press: no exception
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        with pytest.raises(KeyboardInterrupt):
            entry.check_interrupted()  # the first is still remembered
