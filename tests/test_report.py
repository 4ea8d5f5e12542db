import csv
import json

import numpy as np
import pytest

from mia_jax.evaluation import metrics, report


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(200, int), np.zeros(200, int)]
    scores = {
        "loss": rng.normal(size=400) + 0.3 * y,
        "min_k|20%": rng.normal(size=400) + 1.0 * y,
        "zlib": rng.normal(size=400) + 0.6 * y,
    }
    summary = {k: metrics.evaluate(y, s, n_bootstrap=100) for k, s in scores.items()}
    summary["empty"] = metrics.evaluate(np.ones(5, int), np.zeros(5))  # single class -> None metrics
    return y, scores, summary


def test_markdown_table(data):
    _, _, summary = data
    assert "**" not in report.markdown_table(summary)  # nothing bolded on a point estimate alone
    md = report.markdown_table(summary, bold={"min_k|20%"})
    lines = md.strip().splitlines()
    assert len(lines) == 2 + len(summary)
    assert lines[0].startswith("| Method | AUROC [95% CI] | TPR@5%FPR [95% CI] |")
    rows = lines[2:]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == ["loss", "min_k\\|20%", "zlib", "empty"]
    best = summary["min_k|20%"]
    assert f"**{best['auroc']:.3f}** [{best['auroc_ci'][0]:.3f}, {best['auroc_ci'][1]:.3f}]" in rows[1]
    assert sum("**" in r for r in rows) == 1
    assert "n/a" in rows[3] and "None" not in md
    assert rows[3].endswith("| 5 (0) |")
    assert f"{summary['zlib']['tpr_at_1pct_fpr']:.3f}" in rows[2]


def test_markdown_table_bolds_the_given_methods_and_handles_all_none():
    r = {"auroc": 0.7, "auroc_ci": None, "n_scored": 10, "n_nan": 2}
    md = report.markdown_table({"a": r, "b": dict(r, auroc=0.6)}, bold={"a", "b"})
    assert "**0.700**" in md and "**0.600**" in md and "10 (2)" in md
    md = report.markdown_table({"a": {"auroc": None}}, bold={"a"})
    assert "**" not in md and "n/a" in md


def test_write_summary(tmp_path, data):
    _, _, summary = data
    out = tmp_path / "res"
    report.write_summary(out, summary, extra={"model": "x", "seed": np.int64(3), "k": np.float32(0.2)})
    assert json.loads((out / "summary.json").read_text()) == summary
    run = json.loads((out / "run.json").read_text())
    assert run["seed"] == 3 and run["k"] == pytest.approx(0.2)
    with open(out / "summary.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["method", "auroc", "auroc_ci_lo", "auroc_ci_hi", "tpr_at_5pct_fpr",
                       "tpr_at_5pct_fpr_ci_lo", "tpr_at_5pct_fpr_ci_hi", "tpr_at_1pct_fpr",
                       "fpr_at_95pct_tpr", "best_balanced_accuracy", "n_scored", "n_nan"]
    assert [r[0] for r in rows[1:]] == list(summary)
    assert float(rows[1][1]) == summary["loss"]["auroc"]
    assert float(rows[1][3]) == summary["loss"]["auroc_ci"][1]
    assert rows[4][1] == "" and rows[4][10] == "5"
    assert (out / "summary.md").read_text() == report.markdown_table(summary)


def test_write_summary_without_extra(tmp_path, data):
    report.write_summary(tmp_path, data[2])
    assert not (tmp_path / "run.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.csv", "summary.json", "summary.md"]


def test_plot_roc(tmp_path, data):
    y, scores, _ = data
    with_nan = scores["zlib"].copy()
    with_nan[::7] = np.nan
    curves = {k: (y, s) for k, s in scores.items()}
    curves["with_nan"] = (y, with_nan)
    curves["single_class"] = (np.ones(400, int), scores["loss"])
    curves["all_nan"] = (y, np.full(400, np.nan))
    path = tmp_path / "roc.png"
    report.plot_roc(path, curves, title="test")
    data_bytes = path.read_bytes()
    assert data_bytes[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data_bytes) > 10_000


def test_plot_histograms(tmp_path, data):
    y, scores, _ = data
    s = dict(scores)
    s["nan"] = np.where(np.arange(400) % 3 == 0, np.nan, scores["loss"])
    s["all_nan"] = np.full(400, np.nan)
    path = tmp_path / "hist.png"
    report.plot_histograms(path, s, y)
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 10_000


def test_table_helpers():
    rows = [["a", 0.5, None, 0.71234], ["b", 0.7, 0.2, 0.71229], ["base", 0.9, 0.1, float("nan")]]
    cells = report.best_in_bold(rows, never={"base"})
    assert cells == [["a", "0.500", "n/a", "**0.712**"], ["b", "**0.700**", "**0.200**", "0.712"],
                     ["base", "0.900", "0.100", "n/a"]]  # the baseline never competes; exact ties only
    assert report.best_in_bold(rows[:2], shown_ties=True)[1][3] == "**0.712**"  # equal as shown
    md = report.markdown(["Method", "x"], [["a", "1"], ["b", "2"]])
    assert md == "| Method | x |\n|---|---:|\n| a | 1 |\n| b | 2 |\n"


def test_write_csv_and_save_figure(tmp_path):
    report.write_csv(tmp_path / "t.csv", ["k", "v"], [[1, 0.5], [2, None]])
    assert (tmp_path / "t.csv").read_bytes() == b"k,v\r\n1,0.5\r\n2,\r\n"
    plt = report.pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    report.save_figure(fig, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 1000 and not plt.get_fignums()
