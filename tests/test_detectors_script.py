"""scripts/detectors.py end to end on a tiny model: the stratified sample, the shots kept out, one timed group per
set of passes (exact passes per text), a rerun that reuses every group without re-timing it, and the report."""
import gzip
import hashlib
import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "detectors.py"


@pytest.fixture(scope="module")
def det():
    spec = importlib.util.spec_from_file_location("detectors_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _eval_file(path: Path) -> list[dict]:
    rows = [{"text": f"{name if i % 3 else name.title()} example {i}: the {'cat' if y else 'dog'} number "
                     f"{i * 7 % 13} sat on mat {i}.", "label": y, "dataset": name}
            for name in ("alpha", "beta") for y in (0, 1) for i in range(9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_detectors_script(det, tiny_llama_dir, tmp_path, capsys):
    rows = _eval_file(tmp_path / "eval.jsonl")
    out = tmp_path / "det"
    argv = ["--model", str(tiny_llama_dir), "--eval", str(tmp_path / "eval.jsonl"), "--name", "toy",
            "--shots", "2", "--n-shots", "2", "--per-cell", "5", "--n-neighbors", "2", "--samia-samples", "2",
            "--skip", "pac", "polarized", "--n-bootstrap", "20", "--no-progress", "--out", str(out)]
    assert det.main(argv) == 0
    info = json.loads((out / "info.json").read_text())
    assert info["n_evaluated"] == 20 and info["n_shots_held_out"] == 8 and info["per_cell"] == 5
    with gzip.open(out / det.EXAMPLES, "rt") as fh:
        ex = [json.loads(line) for line in fh]
    assert Counter((r["dataset"], r["label"]) for r in ex) == {(d, y): 5 for d in ("alpha", "beta") for y in (0, 1)}
    assert len({r["text_sha256"] for r in ex}) == 20
    sha = [hashlib.sha256(r["text"].encode()).hexdigest() for r in rows]
    assert all(sha[r["index"]] == r["text_sha256"] for r in ex)  # the index names the file's row
    assert "pac" not in info["methods"] and {"gradnorm_l2", "con_recall", "dc_pdd", "min_k_pp@0.2"} <= set(
        info["methods"])
    cost = json.loads((out / "cost.json").read_text())
    single = cost["single-pass"]
    assert (single["forward_per_text"], single["backward_per_text"], single["texts"]) == (1, 0, 20)
    assert "dc_pdd" in single["methods"] and "con_recall" not in single["methods"]
    grad = cost["gradnorm_l1+gradnorm_l2+gradnorm_linf"]
    assert grad["backward_per_text"] == 1 and grad["forward_per_text"] >= 1
    assert cost["con_recall"]["forward_per_text"] == 3 and cost["recall"]["forward_per_text"] == 2
    assert cost["lowercase"]["tokens"] > 0
    # a rerun reuses every group: the same scores, nothing re-timed
    capsys.readouterr()
    assert det.main(argv) == 0
    assert json.loads((out / "cost.json").read_text()) == cost
    with gzip.open(out / det.EXAMPLES, "rt") as fh:
        assert [json.loads(line) for line in fh] == ex
    assert "0 to compute" in capsys.readouterr().err
    # the report, from the files alone
    md = tmp_path / "report.md"
    header = tmp_path / "head.md"
    header.write_text("# Head\n")
    assert det.main(["--from", str(out), "--header", str(header), "--md", str(md), "--n-bootstrap", "20"]) == 0
    text = md.read_text()
    assert text.startswith("# Head\n") and "## toy (sample):" in text
    assert "a seeded sample of 5 per dataset and label" in text
    assert "Not run: pac, polarized, ref." in text and "Neighbor with 2 neighbours; SaMIA with 2 sampled" in text
    table = text.split("| Method |")[1].split("\n\n")[0]
    for m in info["methods"]:
        assert f"| {m}" in table
    assert "| Blind BoW (no model) |" in table and "| min_k_pp@0.2 |" in table
    baseline_row = [line for line in table.splitlines() if line.startswith("| min_k_pp@0.2 |")][0]
    assert "—" in baseline_row
    lower_row = [line for line in table.splitlines() if line.startswith("| lowercase |")][0]
    n_lower = sum(r["scores"]["lowercase"] is None for r in ex)  # texts already in lower case: skipped, counted
    assert 0 < n_lower < 20 and lower_row.rstrip(" |").endswith(f"| {n_lower}")
    assert text.count("| alpha |") == 2 and text.count("| beta |") == 2  # dataset inference: two rows per dataset
