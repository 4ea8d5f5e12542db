"""mia_jax.runs.rundir: the lock, the fingerprint decision, and that nothing is written before it."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mia_jax.runs import entry, rundir
from mia_jax.errors import UserError


def snapshot(folder):
    """Every file under ``folder`` with its bytes and mtime: what 'nothing changed' is checked against."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_new_folder_is_claimed_and_released(tmp_path):
    out = tmp_path / "run"
    with rundir.claim(out, {"a": 1}) as resume:
        assert resume is False
        assert json.loads((out / "config.json").read_text()) == {**rundir.MARK, "a": 1}
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


def test_overwrite_empties_the_folder_and_never_follows_a_link_out_of_it(tmp_path):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    with rundir.claim(out, {"a": 1}):
        (out / "passes").mkdir()
        (out / "passes" / "main.jsonl").write_text("{}\n")
        (out / "linked").symlink_to(elsewhere)
        (out / "passes" / "linked").symlink_to(elsewhere)
        (out / "file_link").symlink_to(elsewhere / "keep.txt")
    before = snapshot(elsewhere)
    with rundir.claim(out, {"a": 2}, overwrite=True) as resume:
        assert resume is False and sorted(p.name for p in out.iterdir()) == [rundir.LOCK, "config.json"]
        assert json.loads((out / "config.json").read_text()) == {**rundir.MARK, "a": 2}
    assert snapshot(elsewhere) == before


def test_a_description_without_the_mark_resumes_but_is_not_replaced(tmp_path):
    """A config.json that no claim wrote (a model's, or a run's of a version before the mark) is never emptied by
    overwrite; the same fingerprint still resumes (the mark is no part of it)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"a": 1}\n')
    (out / "results.jsonl").write_text("{}\n")
    with rundir.claim(out, {"a": 1}) as resume:
        assert resume is True
    before = snapshot(out)
    with pytest.raises(UserError, match=r"holds no run of mia_jax .*found config\.json, results\.jsonl") as e:
        with rundir.claim(out, {"a": 2}, overwrite=True):
            pass
    assert "\n" not in str(e.value) and snapshot(out) == before
    assert rundir.holds_run(out) is None


def test_a_claim_killed_while_writing_its_description_leaves_a_folder_that_counts_as_empty(tmp_path):
    """The description's temporary file is the first thing a claim writes: killed then (whole, cut inside the mark,
    or empty), the folder is claimed again, with or without overwrite, and the leftover is replaced (a temporary file
    that is no description: test_a_file_or_a_foreign_folder_is_refused)."""
    mark = json.dumps({**rundir.MARK, "a": 1}, indent=2).encode()
    for i, (content, overwrite) in enumerate(((mark, False), (mark[:7], True), (b"", False))):
        out = tmp_path / f"run{i}"
        out.mkdir()
        (out / "config.json.12345.tmp").write_bytes(content)
        with rundir.claim(out, {"a": 2}, overwrite=overwrite) as resume:
            assert resume is False and sorted(p.name for p in out.iterdir()) == [rundir.LOCK, "config.json"]


def test_overwrite_refuses_a_folder_holding_an_input(tmp_path):
    """An input in the folder, the folder itself, or an input reached through a link into it: refused untouched."""
    out = tmp_path / "run"
    with rundir.claim(out, {"a": 1}):
        (out / "data.jsonl").write_text('{"text": "x"}\n')
        (out / "model").mkdir()
    (tmp_path / "via_link.jsonl").symlink_to(out / "data.jsonl")
    before = snapshot(out)
    for inputs, needle in (([str(out / "data.jsonl")], "holds"), ([out / "model"], "holds"), ([out], "is"),
                           ([tmp_path / "via_link.jsonl"], "holds")):
        with pytest.raises(UserError, match=f"{out} {needle} .*an input of this run") as e:
            with rundir.claim(out, {"a": 2}, overwrite=True, inputs=[None, "smollm2", "tfds:x", *inputs]):
                pass
        assert "\n" not in str(e.value) and snapshot(out) == before
    with rundir.claim(out, {"a": 2}, overwrite=True, inputs=[None, "smollm2", tmp_path / "elsewhere.jsonl"]):
        assert not (out / "data.jsonl").exists()  # no input in it: replaced


def test_overwrite_refuses_a_folder_inside_another_run_but_not_a_sub_run_of_its_own(tmp_path):
    """An audit's or a sweep's sub-run may be replaced by the process that holds the outer run; from outside, a
    folder inside a run (a sub-run, a pass folder) is refused untouched."""
    out = tmp_path / "audit"
    with rundir.claim(out, {"audit": 1}):
        with rundir.claim(out / "books", {"books": 1}):
            (out / "books" / "passes").mkdir()
            (out / "books" / "passes" / "main.jsonl").write_text("{}\n")
    before = snapshot(out)
    for sub, run in ((out / "books", out), (out / "books" / "passes", out / "books")):
        with pytest.raises(UserError, match=f"{sub} is inside the run in {run} \\(config.json\\)"):
            with rundir.claim(sub, {"books": 2}, overwrite=True):
                pass
        assert snapshot(out) == before
    with rundir.claim(out, {"audit": 1}) as resume:
        assert resume is True
        with rundir.claim(out / "books", {"books": 2}, overwrite=True) as again:
            assert again is False and sorted(p.name for p in (out / "books").iterdir()) == [rundir.LOCK, "config.json"]


def test_a_file_or_a_foreign_folder_is_refused(tmp_path):
    file = tmp_path / "out.txt"
    file.write_text("mine")
    with pytest.raises(UserError, match="existing file, not a folder"):
        with rundir.claim(file, {"a": 1}):
            pass
    assert file.read_text() == "mine"
    for name, found in (("cat.jpg", b"\xff\xd8"), ("config.json.12345.tmp", b"not a description")):
        foreign = tmp_path / f"photos_{name}"
        foreign.mkdir()
        (foreign / name).write_bytes(found)
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
        [sys.executable, "-c", "import sys, time\nfrom mia_jax.runs import rundir\n"
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


def test_finetune_overwrite_refuses_the_folder_of_its_texts(tiny_llama_dir, tmp_path, capsys):
    """The same rule through `python -m train.finetune`: --out the folder holding --texts, with --overwrite, is
    refused (exit 2, one line) and every file stays as it was."""
    from helpers import assert_clean_error

    from train import finetune

    folder = tmp_path / "texts"
    folder.mkdir()
    texts = folder / "t.jsonl"
    texts.write_text("".join(json.dumps({"text": f"Chapter {i}. The keeper counted {i % 7} ships that year."}) + "\n"
                             for i in range(40)))
    (folder / "notes.txt").write_text("mine\n")
    before = snapshot(folder)
    rc = finetune.main(["--model", str(tiny_llama_dir), "--texts", str(texts), "--out", str(folder), "--overwrite",
                        "--no-progress", "train.seq_len=32"])
    assert_clean_error(rc, capsys.readouterr().err, f"--overwrite: {folder} holds {texts}", "an input of this run")
    assert snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == ["notes.txt", "t.jsonl"]
