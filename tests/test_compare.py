"""`mia-jax eval --compare A B`: the paired bootstrap of two methods on the run's texts, printed and written to
summary.md / summary.json; a name that is not one of the run's methods is refused before anything is written."""
import json
import shutil

import numpy as np
import pytest

from mia_jax.evaluation import comparisons, metrics
from mia_jax.cli import main

ROWS = [{"input": f"text number {i} about {'a thing that happened' if i % 2 else 'an event of the year'}",
         "label": i % 2} for i in range(24)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def base_argv(model, data):
    return ["eval", "--model", str(model), "--data", str(data), "--methods", "loss", "zlib", "min_k", "--k", "0.2",
            "--n-bootstrap", "40", "--no-blind", "--no-progress"]


def snapshot(folder):
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_compare_is_printed_and_written(tiny_llama_dir, data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*base_argv(tiny_llama_dir, data), "--compare", "min_k", "loss", "--compare", "zlib", "loss",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    comps = summary.pop("comparisons")
    assert list(summary) == ["loss", "zlib", "min_k@0.2"]
    assert [(c["a"], c["b"]) for c in comps] == [("min_k@0.2", "loss"), ("zlib", "loss")]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    labels = [r["label"] for r in records]
    scores = metrics.scores_by_method(records, ["min_k@0.2", "loss", "zlib"])
    # each pair from 2000 resamples (the fewest behind a verdict, though --n-bootstrap is 40; more where the adjusted
    # p lies near 0.05), Holm over the pairs
    want = [comparisons.paired_bootstrap(labels, scores[a], scores[b], n_bootstrap=comparisons.resamples(c),
                                         seed=0)["auroc"] for c, (a, b) in zip(comps, (("min_k@0.2", "loss"),
                                                                                  ("zlib", "loss")))]
    p = sorted(w["p"] for w in want)
    holm = {p[0]: min(1.0, 2 * p[0]), p[1]: min(1.0, max(2 * p[0], p[1]))}
    for c, w in zip(comps, want):
        added = {"p_holm", "p_holm_interval", "family", "verdict_unadjusted", "verdict", "n_bootstrap"}
        assert {k: v for k, v in c["auroc"].items() if k not in added} == \
            json.loads(json.dumps({k: v for k, v in w.items() if k != "verdict"}))
        assert c["n_bootstrap"] == 2000 and c["auroc"]["family"] == 2
        assert c["auroc"]["p_holm"] == pytest.approx(holm[w["p"]], abs=1e-12)
        assert c["auroc"]["verdict_unadjusted"] == w["verdict"]
        lo, hi = c["auroc"]["p_holm_interval"]  # the Monte-Carlo interval of the adjusted p
        assert c["auroc"]["verdict"] == ("not distinguishable" if lo >= 0.05 else w["verdict"] if hi < 0.05
                                         else "undecided")
    assert comps[0]["auroc"]["a"] == pytest.approx(summary["min_k@0.2"]["auroc"], abs=1e-12)
    lo, hi = comps[0]["auroc"]["ci"]
    assert lo <= comps[0]["auroc"]["diff"] <= hi or np.isclose(lo, hi)
    md = (out / "summary.md").read_text()
    for text in (md, printed):
        assert "Paired comparisons" in text and "| min_k@0.2 | loss |" in text and "| zlib | loss |" in text
        assert comparisons.describe(comps[1], "zlib", "loss") in text


@pytest.mark.parametrize("extra, expected", [
    (["--compare", "min_k", "minkprob"], "--compare min_k minkprob: 'minkprob' is not one of this run's methods"),
    (["--compare", "ppl", "loss"], "'ppl' is not one of this run's methods (loss, zlib, min_k@0.2)"),
    (["--compare", "loss", "loss"], "compares a method with itself"),
    (["--compare", "zlib", "loss", "--n-bootstrap", "0"], "--compare needs --n-bootstrap of at least 1"),
])
def test_compare_bad_names_refused_before_anything_is_written(tiny_llama_dir, data, tmp_path, capsys, extra,
                                                              expected):
    finished = tmp_path / "finished"
    assert main([*base_argv(tiny_llama_dir, data), "--out", str(finished)]) == 0
    out = shutil.copytree(finished, tmp_path / "run")
    before = snapshot(out)
    capsys.readouterr()
    assert main([*base_argv(tiny_llama_dir, data), *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("mia-jax: error: ") and expected in err, err
    assert snapshot(out) == before
    fresh = tmp_path / "fresh"
    assert main([*base_argv(tiny_llama_dir, data), *extra, "--out", str(fresh)]) == 2
    assert not fresh.exists()
