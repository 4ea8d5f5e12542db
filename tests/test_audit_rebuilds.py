"""Both audits' ``--from`` rebuilds check what they read against the folder's manifest alike: each file they read,
damaged in each way (tests/helpers.py DAMAGE), and a folder without its manifest are refused by name, one line,
exit 2, the source untouched and ``--out`` never made."""
from pathlib import Path

import pytest
from helpers import DAMAGE, assert_clean_error, check_damage_refused, rebuild_cli, sealed_copy

from mia_jax.audits import books_report, unlearning_report

RESULTS = Path(__file__).resolve().parents[1] / "results" / "audits"
# command -> (its committed run, the files its --from reads, the line a "missing line" drops)
AUDITS = {"audit-books": (RESULTS / "books", books_report.REBUILD_READS, 5),
          "audit-unlearning": (RESULTS / "unlearning", unlearning_report.REBUILD_READS, None)}


@pytest.mark.parametrize("command, name", [(c, n) for c, (_, reads, _) in AUDITS.items() for n in reads])
@pytest.mark.parametrize("damage", DAMAGE)
def test_from_damaged_file_is_refused(command, name, damage, tmp_path, capsys):
    committed, _, line = AUDITS[command]
    sealed = sealed_copy(committed, tmp_path)
    if damage == "a missing line" and line is not None:
        DAMAGE[damage](sealed / name, line)
    else:
        DAMAGE[damage](sealed / name)
    check_damage_refused(command, sealed, name, damage, tmp_path / "out", capsys)


@pytest.mark.parametrize("command", AUDITS)
def test_from_without_manifest_is_refused(command, tmp_path, capsys):
    sealed = sealed_copy(AUDITS[command][0], tmp_path)
    (sealed / "manifest.json").unlink()
    rc, err = rebuild_cli(command, sealed, tmp_path / "out", capsys)
    assert_clean_error(rc, err, "no manifest.json")
