"""Every committed table under results/ rebuilds byte for byte from its committed per-example files by its documented
command (results/*/README.md, the footers of results/*.md, README.md): each command runs in this process, as
documented, in a temporary folder that holds a copy of the results it reads (the commands record their relative
paths), and writes there; every table, figure and JSON it writes must equal the committed one. The only difference
allowed: the record of the rebuild itself (the ``rebuilt`` key of info.json / unlearning.json, hence their entries in
manifest.json, and the ``rebuild.json`` a rebuild leaves beside its tables).

Times of each test on the development machine (2 CPU cores shared with a full test run: they vary two- to
three-fold with the load): train.tables lr 29-84 s, gemma-lr 16-49 s, news 7-8 s, occurrence 12-32 s, size 27-97 s;
train.study 71-221 s; reproduce_wikimia 19-30 s; detectors 14-23 s; each audit 1-11 s; each window-metrics 20-37 s;
all of them about 5.5 minutes under that load."""
from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SWEEPS = ("lr", "gemma-lr", "news", "occurrence", "size")
# the files a rebuild adds beside its tables to say what it was rebuilt from (none of them is committed)
REBUILD_RECORDS = {"rebuild.json"}
# what train.tables reads in a sweep (each run's scores, record and training log; the seals)
RUN_INPUTS = {"examples.jsonl.gz", "run.json", "train_metrics.jsonl", "manifest.json"}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A temporary folder as the working folder, into which ``copy`` brings committed results (same relative path)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def copy(*paths: str) -> None:
    """The committed ``paths`` (files or folders, relative to the repository) into the working folder."""
    for rel in paths:
        src, dst = REPO / rel, Path(rel)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy2(src, dst)


def script(name: str):
    """``main`` of scripts/NAME.py, loaded as a module (not run as a program)."""
    return runpy.run_path(str(REPO / "scripts" / f"{name}.py"), run_name=f"_script_{name}")["main"]


def without(data: bytes, key: str) -> dict:
    """The JSON object ``data`` without its ``key``."""
    obj = json.loads(data)
    obj.pop(key, None)
    return obj


def assert_same_tables(out: Path, committed: Path, inputs: set[str], meta: str | None = None) -> None:
    """Every file the rebuild wrote into ``out`` equals the committed one in ``committed`` and every committed file
    but the rebuild's ``inputs`` (names) was written; ``meta`` (info.json-like): equal but for its ``rebuilt`` key
    (and so is the manifest's record of everything but ``meta``)."""
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - REBUILD_RECORDS
    kept = {p.relative_to(committed).as_posix() for p in committed.rglob("*") if p.is_file()}
    expected = {f for f in kept if Path(f).name not in inputs}
    assert written == expected, (sorted(written ^ expected))
    for rel in sorted(written):
        new, old = (out / rel).read_bytes(), (committed / rel).read_bytes()
        if rel == meta:
            assert without(new, "rebuilt") == without(old, "rebuilt"), rel
        elif rel == "manifest.json" and meta is not None:
            new_files, old_files = (json.loads(data)["files"] for data in (new, old))
            assert set(new_files) == set(old_files), rel
            assert {k: v for k, v in new_files.items() if k != meta} == \
                {k: v for k, v in old_files.items() if k != meta}, rel
        else:
            assert new == old, rel


@pytest.mark.slow
@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweep_tables(workdir, sweep):
    """``python -m train.tables --from results/contamination/<sweep>`` (into --out: the same layout)."""
    from train import tables

    src = f"results/contamination/{sweep}"
    copy(src)
    assert tables.main(["--from", src, "--out", "rebuilt"]) == 0
    assert_same_tables(workdir / "rebuilt", REPO / src, RUN_INPUTS)


@pytest.mark.slow
def test_contamination_study(workdir):
    """results/contamination.md and .claims.json by results/contamination/README.md's ``python -m train.study``
    (which writes each sweep's tables in place too: in the copy, the same as committed)."""
    from train import study

    copy(*(f"results/contamination/{s}" for s in SWEEPS), "results/contamination/README.md")
    argv = ["--lr", "results/contamination/lr", "results/contamination/gemma-lr",
            "--size", "results/contamination/size", "--news", "results/contamination/news",
            "--occurrence", "results/contamination/occurrence",
            "--header", "results/contamination/README.md", "--out", "rebuilt/contamination.md"]
    Path("rebuilt").mkdir()
    assert study.main(argv) == 0
    for name in ("contamination.md", "contamination.claims.json"):
        assert (workdir / "rebuilt" / name).read_bytes() == (REPO / "results" / name).read_bytes(), name
    for s in SWEEPS:
        assert_same_tables(workdir / "results/contamination" / s, REPO / "results/contamination" / s, set())


@pytest.mark.slow
def test_wikimia_reproduction(workdir):
    """``python scripts/reproduce_wikimia.py --from results/wikimia_reproduction --out DIR``."""
    src = "results/wikimia_reproduction"
    copy(src)
    assert script("reproduce_wikimia")(["--from", src, "--out", "rebuilt"]) == 0
    assert_same_tables(workdir / "rebuilt", REPO / src, {"examples.jsonl.gz", "manifest.json", "README.md"})


@pytest.mark.slow
@pytest.mark.parametrize("command, audit, meta", [
    ("audit-books", "books", "info.json"), ("audit-books", "books_control", "info.json"),
    ("audit-unlearning", "unlearning", "unlearning.json"),
    ("audit-unlearning", "unlearning_control", "unlearning.json")])
def test_audit(workdir, command, audit, meta, capsys):
    """``mia-jax audit-books|audit-unlearning --from results/audits/<audit> --out DIR`` (results/audits.md)."""
    from mia_jax.cli import main

    src = f"results/audits/{audit}"
    copy(src)
    assert main([command, "--from", src, "--out", "rebuilt"]) == 0
    assert_same_tables(workdir / "rebuilt", REPO / src, set(), meta=meta)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["contam-base", "contam-trained"])
def test_window_metrics(workdir, run, capsys):
    """``mia-jax window-metrics results/audits/concat/<run> --data results/audits/concat/contam.jsonl`` prints
    results/audits/concat/<run>.windows.md."""
    from mia_jax.cli import main

    copy(f"results/audits/concat/{run}", "results/audits/concat/contam.jsonl")
    capsys.readouterr()
    assert main(["window-metrics", f"results/audits/concat/{run}", "--data", "results/audits/concat/contam.jsonl"]) == 0
    assert capsys.readouterr().out == (REPO / f"results/audits/concat/{run}.windows.md").read_text()


@pytest.mark.slow
def test_detectors(workdir):
    """results/detectors.md by results/detectors/README.md's ``python scripts/detectors.py --from ...``."""
    runs = ["results/detectors/wikimia32", "results/detectors/contamination", "results/detectors/contamination-sample"]
    copy(*runs, "results/detectors/README.md")
    argv = ["--from", *runs, "--header", "results/detectors/README.md", "--md", "rebuilt/detectors.md"]
    Path("rebuilt").mkdir()
    assert script("detectors")(argv) == 0
    assert (workdir / "rebuilt/detectors.md").read_bytes() == (REPO / "results/detectors.md").read_bytes()
