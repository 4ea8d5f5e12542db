"""Every entry point against a generated corpus of bad inputs: exit 2, one line on stderr, no traceback, and no byte
of any existing folder changed (nor anything written in the working folder).

The entry points are found, not listed: each ``mia-jax`` subcommand (from ``mia_jax.cli.build_parser()``), each
``scripts/*.py``, ``scripts/bench/*.py`` and ``train/*.py`` with a ``__main__`` block. Each follows one convention
(``PROG``, ``build_parser()``, a guarded ``main(argv) -> int``; checked here), and its cases are generated from its
parser: every option typed with a validating type of :mod:`mia_jax.runs.entry` gets the bad values of that type; every
``--from`` (``entry.source_dir(kind, example=...)``) gets a copy of its committed example with each recorded file cut,
emptied, deleted or garbled, and an ``--out`` holding another run. A new entry point, or a new option, is covered
without editing this file. The process-level cases (a platform the machine lacks, a malformed XLA_FLAGS, a full disk,
Ctrl-C pressed three times) run real subprocesses of ``mia-jax``.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from helpers import ENV, REPO, assert_clean_error, complete_records, snapshot, start, stderr_of, wait_for

from mia_jax import data
from mia_jax.runs import entry, rundir
from mia_jax.commands.options import RESUME

MAIN_BLOCK = re.compile(r'^if __name__ == "__main__":', re.M)


@dataclass
class EntryPoint:
    name: str  # as a user types it: "mia-jax eval", "python -m train.tables", "python scripts/x.py build"
    main: Callable[[list[str]], int]
    prefix: list[str]  # argv before the options (a subcommand)
    parser: argparse.ArgumentParser


def _subparsers(parser) -> dict:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return subs[0].choices if subs else {}


def _script_module(path: Path):
    if path.parent.name == "train":
        return importlib.import_module(f"train.{path.stem}")
    sys.path.insert(0, str(path.parent)) if str(path.parent) not in sys.path else None
    spec = importlib.util.spec_from_file_location(f"_entry_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def entry_point_files() -> list[Path]:
    return [p for folder in ("scripts", "scripts/bench", "train") for p in sorted((REPO / folder).glob("*.py"))
            if MAIN_BLOCK.search(p.read_text(encoding="utf-8"))]


def entry_points() -> list[EntryPoint]:
    from mia_jax import cli

    points = [EntryPoint(f"mia-jax {name}", cli.main, [name], sp)
              for name, sp in _subparsers(cli.build_parser()).items()]
    for path in entry_point_files():
        module = _script_module(path)
        if not (hasattr(module, "PROG") and hasattr(module, "build_parser")):
            continue  # test_every_entry_point_follows_the_convention names it
        parser = module.build_parser()
        subs = _subparsers(parser)
        points += ([EntryPoint(f"{module.PROG} {name}", module.main, [name], sp) for name, sp in subs.items()] if subs
                   else [EntryPoint(module.PROG, module.main, [], parser)])
    return points


POINTS = entry_points()


def test_every_entry_point_follows_the_convention():
    """PROG, build_parser() giving an entry.ArgumentParser, main(argv) guarded (it returns an exit status: --help
    gives 0 and an unknown option 2 with one line, as values, not SystemExit), no unchecked int option."""
    assert len(POINTS) >= 20, [p.name for p in POINTS]
    for path in entry_point_files():
        module = _script_module(path)
        assert isinstance(getattr(module, "PROG", None), str), f"{path}: no PROG"
        assert isinstance(module.build_parser(), entry.ArgumentParser), f"{path}: build_parser() is not entry's"
    unchecked = [(p.name, a.option_strings or a.dest) for p in POINTS for a in p.parser._actions if a.type is int]
    assert not unchecked, f"int options without a validating entry type: {unchecked}"


@pytest.mark.parametrize("point", POINTS, ids=[p.name for p in POINTS])
def test_help_and_unknown_option(point, capsys):
    assert point.main([*point.prefix, "--help"]) == 0
    capsys.readouterr()
    rc = point.main([*point.prefix, "--no-such-option"])
    assert_clean_error(rc, capsys.readouterr().err)


def _bad_values(action, tmp: Path) -> list[str]:
    """The values of a bad-input corpus that ``action``'s type must refuse (none for an unchecked type)."""
    t = action.type
    (tmp / "a_file").write_text("x")
    (tmp / "a_folder").mkdir(exist_ok=True)
    if not (tmp / "dangling").is_symlink():
        (tmp / "dangling").symlink_to(tmp / "nowhere")
    numbers = {entry.positive_int: ["0", "-5", "abc", "1.5"], entry.nonneg_int: ["-5", "abc", "2.5"],
               entry.positive_float: ["0", "-1", "nan", "abc"], entry.nonneg_float: ["-1", "inf", "nan"],
               entry.fraction: ["0", "1.5", "-0.2", "abc"]}
    if t in numbers:
        return numbers[t]
    if t is entry.input_file:
        return [str(tmp / "missing.jsonl"), str(tmp / "a_folder")]
    if t is data.data_input:  # a file, or a TFDS dataset spec
        return [str(tmp / "missing.jsonl"), str(tmp / "a_folder"), "tfds:Not A Name", "tfds:"]
    if t is entry.input_dir:
        return [str(tmp / "missing_dir"), str(tmp / "a_file")]
    if t is entry.out_file:  # a folder, a missing folder, a dangling link, a file of a run's folder
        (tmp / "a_run").mkdir(exist_ok=True)
        (tmp / "a_run" / "config.json").write_text("{}")
        (tmp / "a_run" / "metrics.json").write_text("{}")
        return [str(tmp / "a_folder"), str(tmp / "no_such_folder" / "report.md"), str(tmp / "dangling"),
                str(tmp / "a_run" / "metrics.json"), str(tmp / "a_run" / "report.md")]
    if t is entry.out_dir:
        return [str(tmp / "a_file"), str(tmp / "a_file" / "sub"), str(tmp / "dangling")]
    if isinstance(t, entry.source_dir):
        (tmp / "empty_dir").mkdir(exist_ok=True)
        return [str(tmp / "missing_dir"), str(tmp / "a_file"), str(tmp / "empty_dir")]
    return []


CASES = [(p, a) for p in POINTS for a in p.parser._actions if a.option_strings and a.type is not None
         and (a.type in (entry.positive_int, entry.nonneg_int, entry.positive_float, entry.nonneg_float,
                         entry.fraction, entry.input_file, data.data_input, entry.input_dir, entry.out_dir,
                         entry.out_file)
              or isinstance(a.type, entry.source_dir))]


@pytest.mark.parametrize("point, action", CASES, ids=[f"{p.name} {a.option_strings[-1]}" for p, a in CASES])
def test_bad_option_values(point, action, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    values = _bad_values(action, tmp_path)
    assert values
    before = snapshot(tmp_path)
    for value in values:
        capsys.readouterr()
        rc = point.main([*point.prefix, f"{action.option_strings[-1]}={value}"])
        assert_clean_error(rc, capsys.readouterr().err, action.option_strings[-1])
        assert snapshot(tmp_path) == before, f"{point.name} {action.option_strings[-1]}={value} wrote something"


# ----------------------------------------------------------------------------- --from: damaged copies of an example

SOURCES = [(p, a) for p, a in CASES if isinstance(a.type, entry.source_dir) and a.type.example]


def _damages(src: Path) -> list[tuple[str, Callable[[], None]]]:
    """(what, how) for every file a manifest under ``src`` records: cut in half, emptied, deleted, garbled; and each
    manifest itself garbled."""
    out = []
    for manifest in sorted(src.rglob(rundir.MANIFEST))[:2]:
        folder = manifest.parent
        names = sorted(json.loads(manifest.read_text())["files"])
        for name in names[:4]:
            path = folder / name
            data = path.read_bytes()
            out += [(f"{path.relative_to(src)} cut", lambda p=path, d=data: p.write_bytes(d[: len(d) // 2])),
                    (f"{path.relative_to(src)} emptied", lambda p=path: p.write_bytes(b"")),
                    (f"{path.relative_to(src)} deleted", lambda p=path: p.unlink()),
                    (f"{path.relative_to(src)} garbled", lambda p=path, d=data: p.write_bytes(d[:-3] + b"\x00\xff{"))]
        out.append((f"{manifest.relative_to(src)} garbled", lambda m=manifest: m.write_text("{not json")))
    return out


def _from_argv(point, action, src: Path, out: Path) -> list[str]:
    argv = [*point.prefix, action.option_strings[-1], str(src)]
    if any("--out" in a.option_strings for a in point.parser._actions):
        argv += ["--out", str(out)]
    return argv


@pytest.mark.parametrize("point, action", SOURCES, ids=[f"{p.name} {a.option_strings[-1]}" for p, a in SOURCES])
def test_rebuild_refuses_damaged_inputs(point, action, tmp_path, monkeypatch, capsys):
    example = REPO / action.type.example
    assert list(example.rglob(rundir.MANIFEST)), f"{example}: the committed example has no {rundir.MANIFEST}"
    monkeypatch.chdir(tmp_path)
    damages = _damages(example)
    for i, (what, damage) in enumerate(damages):
        src = shutil.copytree(example, tmp_path / f"src{i}")
        for j, (other, how) in enumerate(_damages(src)):
            if j == i:
                how()
        before = snapshot(tmp_path)
        capsys.readouterr()
        rc = point.main(_from_argv(point, action, src, tmp_path / f"out{i}"))
        assert_clean_error(rc, capsys.readouterr().err)
        assert snapshot(tmp_path) == before, f"{point.name} with {what}: a folder changed"
        shutil.rmtree(src)


@pytest.mark.parametrize("point, action", [(p, a) for p, a in SOURCES
                                           if any("--out" in b.option_strings for b in p.parser._actions)],
                         ids=lambda x: getattr(x, "name", None) or x.option_strings[-1])
def test_rebuild_refuses_an_out_holding_another_run(point, action, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"labeled": true}\n')
    (other / "roc.png").write_bytes(b"\x89PNG not really")
    before = snapshot(other)
    capsys.readouterr()
    rc = point.main(_from_argv(point, action, REPO / action.type.example, other))
    assert_clean_error(rc, capsys.readouterr().err)
    assert snapshot(other) == before


# ----------------------------------------------------------------------------- the process and the machine


def test_malformed_xla_flags_is_one_line(monkeypatch, capsys):
    from mia_jax import cli

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 oops")
    assert_clean_error(cli.main(["score", "--help"]), capsys.readouterr().err, "XLA_FLAGS", "'oops'")


def _mia_jax(*argv) -> list[str]:
    return ["-m", "mia_jax.cli", *argv]


def _texts(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"input": f"text {i} " + "word " * (5 + i % 40), "label": i % 2}) + "\n"
                            for i in range(n)))
    return path


@pytest.mark.slow
def test_a_platform_the_machine_lacks(tiny_llama_dir, tmp_path):
    proc = subprocess.run([sys.executable, *_mia_jax("score", "--model", str(tiny_llama_dir), "--data",
                                                     str(_texts(tmp_path, 4)), "--out", str(tmp_path / "o"))],
                          env=ENV | {"JAX_PLATFORMS": "tpu"}, capture_output=True, text=True, timeout=300)
    assert_clean_error(proc.returncode, proc.stderr, "JAX_PLATFORMS")


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_resumes(tiny_llama_dir, tmp_path):
    """A file-size limit (as a full disk) stops the run with one line; the same command without the limit then
    finishes, and no temporary file is left in the run folder. The compilation cache the limit cut is left clean:
    the rerun reads no broken entry (JAX never rewrites an entry that exists; it warned and recompiled on every
    run after)."""
    data, out, cache = _texts(tmp_path, 40), tmp_path / "run", tmp_path / "cache"
    argv = [sys.executable, *_mia_jax("eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "loss",
                                      "--n-bootstrap", "10", "--no-progress", "--out", str(out),
                                      "--tokens-per-batch", "64", "--compilation-cache", str(cache))]
    limit = 3000  # bytes: room for the run description, not for every record

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    lines = proc.stderr.splitlines()  # the run's own first line (model, texts, methods), then the error
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[-1].startswith("mia-jax: error: cannot write: File too large; free some space"), proc.stderr
    assert len(lines) <= 2, proc.stderr
    assert cache.is_dir() and not any(cache.iterdir())  # what the cut run wrote there is dropped
    proc = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "compilation cache" not in proc.stderr, proc.stderr  # no "Error reading persistent compilation cache"
    assert any(cache.iterdir())
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert len(complete_records(out / "results.jsonl")) == 40


@pytest.mark.slow
def test_ctrl_c_three_times_is_one_line(tiny_llama_dir, tmp_path):
    data, out = _texts(tmp_path, 400), tmp_path / "run"
    proc = start(_mia_jax("score", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "loss",
                          "--no-progress", "--out", str(out), "--tokens-per-batch", "64", "--text-field", "input"),
                 cwd=tmp_path)
    wait_for(proc, lambda: len(complete_records(out / "passes" / "main.jsonl")) >= 2)
    for _ in range(3):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    rc = proc.wait(timeout=120)
    err = stderr_of(proc)
    assert rc == 130, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]  # the run's own first line, then the interrupt
    assert lines[-1] == f"mia-jax: interrupted; {RESUME}" and len(lines) <= 2, err
