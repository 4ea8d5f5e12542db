"""The five extension paths of CONTRIBUTING.md (a scorer in an existing module, a scorer in a new module, a model
family, a benchmark, a contamination ablation), each followed as written in a copy of the tree: the files its section
names are exactly those the toy edits (tests/extension_toys.py), and after the edits the suite's tests that iterate
the registries pass in the copy (run there in a subprocess), as does the toy's own test (`mia-jax eval` on the tiny
model). A file the section forgets fails its walk: either the list differs from the edits or a registry-driven test
fails without the edit."""
import re
import shutil
import sys
from pathlib import Path

import pytest
from extension_toys import WALKS, run_in

REPO = Path(__file__).resolve().parents[1]
COPIED = ("mia_jax", "train", "tests", "configs", "scripts", "setup.py", "pyproject.toml", "pytest.ini")
PATH = re.compile(r"`((?:mia_jax|tests|train|results|scripts)/[^`]*)`")


def sections(text: str) -> dict[str, str]:
    """CONTRIBUTING.md's ``## `` sections by heading."""
    parts = re.split(r"^## (.*)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def files_of(section: str) -> tuple[list[str], set[str]]:
    """(the files every change of the section touches: each numbered item's leading path, in order; the files only
    some touch: the paths of its bulleted items)."""
    numbered = re.findall(r"^\d+\. `([^`]+)`", section, re.M)
    bullets = re.findall(r"^- .*(?:\n {2}\S.*)*", section, re.M)
    return numbered, {p for b in bullets for p in PATH.findall(b)}


def contributing_files(heading: str) -> tuple[list[str], set[str]]:
    found = [body for title, body in sections((REPO / "CONTRIBUTING.md").read_text()).items()
             if title.startswith(heading)]
    assert len(found) == 1, f"CONTRIBUTING.md: no one section '## {heading}...'"
    return files_of(found[0])


def test_files_are_read_from_the_sections():
    section = ("1. `a/x.py`: one\n   more `tests/y.py`\n2. `tests/z.py`: two\n\n- `mia_jax/o.py`, `tests/p.py`: if\n"
               "  also `train/q.py`\n\nNot `mia_jax/r.py`.\n")
    assert files_of(section) == (["a/x.py", "tests/z.py"], {"mia_jax/o.py", "tests/p.py", "train/q.py"})
    for walk in WALKS.values():
        required, _ = contributing_files(walk.section)
        assert len(required) >= 3, (walk.section, required)


def copy_tree(dest: Path) -> Path:
    """The repository's code, tests and configs copied to ``dest`` (caches left out)."""
    dest.mkdir()
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dest / name)
    return dest


@pytest.mark.parametrize("name", list(WALKS))
def test_extension_path(name, tmp_path):
    walk = WALKS[name]
    required, optional = contributing_files(walk.section)
    edited = list(walk.edits)
    assert set(required) <= set(edited), f"CONTRIBUTING.md names files the toy leaves: {set(required) - set(edited)}"
    assert set(edited) <= set(required) | optional, \
        f"the toy edits files CONTRIBUTING.md does not name: {set(edited) - set(required) - optional}"
    root = copy_tree(tmp_path / "tree")
    for path, edit in walk.edits.items():
        for placeholder, value in walk.names.items():
            path = path.replace(placeholder, value)
        edit(root / path)
    out = run_in(root, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *walk.tests], timeout=300)
    summary = out.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed[1]) >= len(walk.tests) and not re.search("failed|error|skipped", summary), out[-3000:]
