"""Every committed file under results/ rebuilds byte for byte from the committed per-example files by one command,
``python scripts/build_results.py`` (the documented command of each part, run in this process: train.study with
every sweep's tables, reproduce_wikimia --from, audit-books / audit-unlearning --from, window-metrics, detectors
--from, and results/audits.md from its template). ``--check`` rebuilds a temporary copy of results/ and compares
every file; the only differences allowed are the records of the rebuild itself (the ``rebuilt`` key of the audits'
info.json / unlearning.json, hence their entries in manifest.json).

The rebuild computes each table once (the sweeps' tables once, inside train.study). Most of its time is the
bootstrap intervals: every verdict's adjusted p is resampled until its Monte-Carlo interval lies on one side of 0.05
(up to 100 000 resamples; ``comparisons.holm_adjust``). ``--check`` took 6 min 49 s wall on a 2-core Intel Xeon when
each score vector counted its own draws per resample block; with the draws counted once per block and group and
each vector sorted once (``bootstrap.Ranked``), 2 min 27 s wall (2 min 23 s of CPU) on the same kind of machine while
a model run shared its 2 cores (the two not timed side by side)."""
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
