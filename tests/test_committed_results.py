"""Every committed file under results/ rebuilds byte for byte from the committed per-example files by one command,
``python scripts/build_results.py`` (the documented command of each part, run in this process: train.study with
every sweep's tables, reproduce_wikimia --from, audit-books / audit-unlearning --from, window-metrics, detectors
--from, and results/audits.md from its template). ``--check`` rebuilds a temporary copy of results/ and compares
every file; the only differences allowed are the records of the rebuild itself (the ``rebuilt`` key of the audits'
info.json / unlearning.json, hence their entries in manifest.json).

The rebuild computes each table once (the sweeps' tables once, inside train.study, where the earlier tests rebuilt
them twice, by train.tables and by train.study). Most of its time is the bootstrap intervals: this test took 156 s
in a CI run when every resample was ranked; ``python scripts/build_results.py --check`` alone took 56 s wall (60 s of
CPU) with ``bootstrap.drawn_rows`` (2-core AMD EPYC, nothing else running; two separate runs, not timed side by
side). Since every verdict's adjusted p is resampled until its Monte-Carlo interval lies on one side of 0.05 (up to
100 000 resamples; ``comparisons.holm_adjust``), ``--check`` takes 6 min 49 s wall (6 min 12 s of CPU) and
``--seeds 5`` 41 min 51 s wall (31 min of CPU, the 2 cores shared with other work) on a 2-core Intel Xeon."""
from __future__ import annotations

import runpy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def build_results():
    """scripts/build_results.py, loaded as a module (not run as a program)."""
    return runpy.run_path(str(REPO / "scripts" / "build_results.py"), run_name="_script_build_results")


@pytest.mark.slow
def test_every_committed_result_rebuilds_byte_for_byte(capsys):
    """``python scripts/build_results.py --check``: exit 0, and no file reported as differing."""
    status = build_results()["main"](["--check"])
    out = capsys.readouterr().out
    assert status == 0 and out == "", out


def test_check_reports_a_changed_file(tmp_path):
    """The comparison behind --check names a file that differs, one that is missing and one the rebuild adds; an
    audit's record of its own rebuild (``rebuilt``) is no difference."""
    differences = build_results()["differences"]
    new, old = tmp_path / "new", tmp_path / "old"
    for root in (new, old):
        (root / "audits" / "books").mkdir(parents=True)
        (root / "same.md").write_text("x\n")
    (new / "table.md").write_text("0.733\n")
    (old / "table.md").write_text("0.732\n")
    (old / "gone.md").write_text("\n")
    (new / "extra.md").write_text("\n")
    (new / "audits/books/info.json").write_text('{"a": 1, "rebuilt": {"command": "x"}}')
    (old / "audits/books/info.json").write_text('{"a": 1, "rebuilt": {"command": "y"}}')
    assert differences(new, old) == ["extra.md: only in the rebuild", "gone.md: not rebuilt", "table.md: differs"]
