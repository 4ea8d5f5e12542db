"""``--limit N`` keeps both classes of labeled data (a seeded sample balanced by label, in file order) on the
in-memory and the streamed paths alike, the first N of unlabeled data; and every n/a cell of a summary says why."""
import doctest
import json
import random

import numpy as np
import pytest

from mia_jax.cli import main
from mia_jax.data import stream
from mia_jax.evaluation import report
from mia_jax.data import sample
from mia_jax.data.sample import LIMIT_SEED, balanced_sample, limit_rows

WORDS = "the river city old stone bridge north market winter light paper garden music station".split()


@pytest.fixture(scope="module")
def sorted_file(tmp_path_factory):
    """100 labeled texts sorted by label, as mimir's domains are: 60 members, then 40 non-members."""
    rng = random.Random(0)
    recs = [{"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 20))) + f" number {i}",
             "label": int(i < 60)} for i in range(100)]
    path = tmp_path_factory.mktemp("limit") / "sorted.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path, recs


def test_the_sample_is_balanced_seeded_and_in_file_order():
    labels = [1] * 60 + [0] * 40
    rows = limit_rows(labels, 100, 40)
    assert np.array_equal(rows, balanced_sample(labels, 40, seed=LIMIT_SEED)) and np.all(np.diff(rows) > 0)
    assert (np.asarray(labels)[rows] == 1).sum() == 20 and len(rows) == 40
    assert not np.array_equal(rows, balanced_sample(labels, 40, seed=LIMIT_SEED + 1))
    short = [1] * 1000 + [0] * 7  # a class with fewer than its half: all of it, the other class the rest
    assert (np.asarray(short)[limit_rows(short, 1007, 40)] == 0).sum() == 7
    assert len(limit_rows(short, 1007, 40)) == 40
    assert limit_rows(None, 100, 40).tolist() == list(range(40))  # unlabeled: the first N
    assert limit_rows(labels, 100, 100) is None and limit_rows(labels, 100, None) is None
    for module in (sample, report):
        assert doctest.testmod(module).failed == 0


def test_a_stream_reads_only_the_kept_rows_from_any_window(sorted_file):
    path, recs = sorted_file
    s = stream.TextStream(path, limit=40)
    note = s.apply_limit()
    assert "balanced by label (20 members, 20 non-members)" in note and "40 of 100" in note
    want = [recs[i]["text"] for i in s.keep]
    got = [t for _, texts, _ in s.windows(16) for t in texts]
    assert got == want
    later = [t for _, texts, _ in s.windows(16, start=16) for t in texts]  # a resumed run starts at a window
    assert later == want[16:]
    assert s.scan().n == 40


def test_limit_on_a_file_sorted_by_label_keeps_both_classes(sorted_file, tiny_llama_dir, tmp_path, capsys):
    """Before, --limit 40 took the first 40 texts, all members: no metric at all. Now 20 members and 20
    non-members: the records of the held and of the streamed run equal those of a file of just the sampled rows,
    and the metrics are computed."""
    path, recs = sorted_file
    keep = balanced_sample([r["label"] for r in recs], 40, seed=0)
    kept = tmp_path / "kept.jsonl"
    kept.write_text("".join(json.dumps(recs[i]) + "\n" for i in keep))
    common = ["--model", str(tiny_llama_dir), "--methods", "loss", "--n-bootstrap", "10", "--no-blind", "--no-progress"]
    runs = {}
    for name, extra in [("kept", ["--data", str(kept)]), ("held", ["--data", str(path), "--limit", "40"]),
                        ("streamed", ["--data", str(path), "--limit", "40", "--stream-window", "16"])]:
        out = tmp_path / name
        assert main(["eval", *common, *extra, "--out", str(out)]) == 0
        err = capsys.readouterr().err
        if name != "kept":
            assert ("note: --limit 40: a seeded sample (seed 0) of 40 of 100 texts, balanced by label (20 members, "
                    "20 non-members), in file order") in err
        assert (out / "passes" / "main" / "index.json").exists() == (name == "streamed")  # the path taken
        runs[name] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        assert json.loads((out / "summary.json").read_text())["loss"]["auroc"] is not None
    assert sum(r["label"] for r in runs["kept"]) == 20 and len(runs["kept"]) == 40
    for name in ("held", "streamed"):
        assert [(r["label"], r["n_tokens"]) for r in runs[name]] == [(r["label"], r["n_tokens"]) for r in runs["kept"]]
        np.testing.assert_allclose([r["scores"]["loss"] for r in runs[name]],
                                   [r["scores"]["loss"] for r in runs["kept"]], rtol=1e-5, err_msg=name)


def test_limit_on_unlabeled_data_takes_the_first_n(sorted_file, tiny_llama_dir, tmp_path):
    path, recs = sorted_file
    out = tmp_path / "run"
    assert main(["score", "--model", str(tiny_llama_dir), "--data", str(path), "--limit", "7", "--methods", "loss",
                 "--no-progress", "--out", str(out)]) == 0
    first = tmp_path / "first.jsonl"
    first.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in recs[:7]))
    assert main(["score", "--model", str(tiny_llama_dir), "--data", str(first), "--methods", "loss",
                 "--no-progress", "--out", str(tmp_path / "first")]) == 0
    got, want = ([json.loads(line)["scores"]["loss"] for line in (o / "results.jsonl").read_text().splitlines()]
                 for o in (out, tmp_path / "first"))
    assert got == want and len(got) == 7


def test_every_na_cell_of_the_summary_says_why(sorted_file, tiny_llama_dir, tmp_path, capsys):
    path, recs = sorted_file
    members = tmp_path / "members.jsonl"
    members.write_text("".join(json.dumps(r) + "\n" for r in recs[:30]))
    out = tmp_path / "run"
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(members), "--methods", "loss", "zlib",
                 "--n-bootstrap", "10", "--no-blind", "--no-progress", "--out", str(out)]) == 0
    md = (out / "summary.md").read_text()
    assert "| loss | n/a |" in md
    assert ("n/a (loss, zlib): AUROC undefined: only one class among scored examples (30 members, 0 non-members)."
            in md)
