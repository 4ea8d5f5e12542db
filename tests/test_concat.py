"""WikiMIA-concat and the contamination-corpus concatenations (audits/concat.py): the member part begins exactly at
member_from, everything before it is non-member text, draws are seeded and never reuse a text; and the end-to-end
eval --window run labels its windows by member_from."""
import argparse
import csv
import gzip
import io
import json
import re

import numpy as np
import pytest
from helpers import assert_clean_error, snapshot
from sklearn.metrics import roc_auc_score

from mia_jax.evaluation import blind
from mia_jax.audits import concat
from mia_jax.commands import concat as concat_command
from mia_jax.data import wikimia
from mia_jax.errors import UserError


def words_texts(prefix: str, counts: list[int]) -> list[str]:
    """Texts whose words name their side, text and position: 'n3w0 n3w1 ...'."""
    return [" ".join(f"{prefix}{i}w{j}" for j in range(c)) for i, c in enumerate(counts)]


def check_record(rec: dict, nonmembers: list[str], members: list[str], sep: str = " ") -> None:
    text, start = rec["text"], rec["member_from"]
    pieces = {0: [], 1: []}
    for p in rec["parts"]:
        source = (nonmembers, members)[p["label"]][p["index"]]
        piece = text[p["start"]: p["end"]]
        assert piece == (concat.cut_words(source, p["words"]) if p["words"] else source)
        assert p["words"] is None or len(piece.split()) == p["words"]
        pieces[p["label"]].append(piece)
    assert text[:start] == sep.join(pieces[0])  # all the text before member_from is non-member text
    if rec["label"] == 1:
        assert text[start:] == sep + sep.join(pieces[1])  # the separator, then exactly the member parts
        assert all(w.startswith("n") for w in text[:start].split()) and all(
            w.startswith("m") for w in text[start:].split())
    else:
        assert start == len(text) and not pieces[1]


def test_member_from_splits_nonmember_text_from_member_text_and_no_text_is_reused():
    nonmembers = words_texts("n", [40, 70, 130, 35, 90, 140, 33, 65, 129, 50, 70, 200])
    members = words_texts("m", [32, 64, 128, 40, 100, 150, 60, 33, 70, 130])
    recs = concat.concat_texts(nonmembers, members, n_texts=4, per_side=(2, 1), lengths=(32, 64, 128), n_controls=1,
                               seed=3)
    assert len(recs) == 5 and [r["label"] for r in recs] == [1, 1, 1, 1, 0]
    for r in recs:
        check_record(r, nonmembers, members)
    assert [len(r["parts"]) for r in recs] == [3, 3, 3, 3, 3]
    used = [(p["label"], p["index"]) for r in recs for p in r["parts"]]
    assert len(used) == len(set(used))  # no text twice, in a record or across records
    # lengths balanced per side: 11 non-member parts -> 4, 4, 3 (remainder to the shortest); 4 member parts -> 2, 1, 1
    got = {y: sorted(p["words"] for r in recs for p in r["parts"] if p["label"] == y) for y in (0, 1)}
    assert got[0] == [32] * 4 + [64] * 4 + [128] * 3 and got[1] == [32] * 2 + [64] + [128]
    # seeded: the same seed gives the same records, another seed others
    assert concat.concat_texts(nonmembers, members, n_texts=4, per_side=(2, 1), lengths=(32, 64, 128),
                               n_controls=1, seed=3) == recs
    assert concat.concat_texts(nonmembers, members, n_texts=4, per_side=(2, 1), lengths=(32, 64, 128),
                               n_controls=1, seed=4) != recs


def test_whole_texts_stripped_and_other_separator():
    nonmembers, members = ["  first non-member\n", "second one"], ["a member text", "another member", "third"]
    recs = concat.concat_texts(nonmembers, members, sep="\n\n", seed=0)
    assert len(recs) == 2  # the default: as many as the texts allow
    for r in recs:
        (a, b) = r["parts"]
        assert r["text"] == nonmembers[a["index"]].strip() + "\n\n" + members[b["index"]]
        assert r["member_from"] == len(nonmembers[a["index"]].strip()) and r["text"][b["start"]:] == members[
            b["index"]]


def test_most_records_by_hand():
    # 2 texts of >= 128 words, 5 of >= 64, 15 of >= 32. n records need n//3 (+1 for the remainder) parts per length:
    # n = 8 -> 3, 3, 2 (ok: 2 <= 2 at 128, 5 <= 5 at >= 64); n = 9 -> 3, 3, 3 (3 > 2 at 128).
    nonmembers = words_texts("n", [128, 130] + [64] * 3 + [32] * 10)
    members = words_texts("m", [200] * 20)
    assert concat.max_records(nonmembers, members, lengths=(32, 64, 128)) == 8
    assert len(concat.concat_texts(nonmembers, members, lengths=(32, 64, 128))) == 8
    assert concat.max_records(nonmembers, members, lengths=(32, 64, 128), n_controls=1) == 6  # 8 parts: 3, 3, 2 at 6
    assert concat.max_records(nonmembers, members) == 15 and concat.max_records(nonmembers, members,
                                                                                 per_side=(2, 3)) == 6


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_texts=9, lengths=(32, 64, 128)), "at most 8"),
    (dict(n_texts=0), "at most"),
    (dict(lengths=(32, 32)), "distinct"),
    (dict(lengths=()), "distinct"),
    (dict(sep=" | "), "whitespace"),
    (dict(per_side=0), "per_side"),
    (dict(per_side=(1, 2, 3)), "per_side"),
    (dict(n_controls=-1), "n_controls"),
])
def test_refusals(kwargs, message):
    nonmembers = words_texts("n", [128, 130] + [64] * 3 + [32] * 10)
    with pytest.raises(UserError, match=message):
        concat.concat_texts(nonmembers, words_texts("m", [200] * 20), **kwargs)


def test_too_few_or_empty_texts_are_refused():
    with pytest.raises(UserError, match="too few texts"):
        concat.concat_texts(words_texts("n", [10]), words_texts("m", [10]), lengths=(32,))
    with pytest.raises(UserError, match="too few texts"):
        concat.concat_texts(words_texts("n", [10, 10]), words_texts("m", [10]), per_side=2)
    with pytest.raises(UserError, match=r"member texts \[1\] are empty"):
        concat.concat_texts(words_texts("n", [10]), ["a b", "  "])


def test_wikimia_concat_parts_are_wikimia_texts_of_their_length():
    ds = concat.wikimia_concat()
    by_length = {L: wikimia(L) for L in (32, 64, 128)}
    # 335: the non-member articles that reach 128 words limit the records (336 would need 112 of them)
    assert sum(y == 0 for y in by_length[128].labels) == 111 and len(ds) == 335
    assert ds.labels == [1] * 335 and set(ds.files) == {str(p) for d in by_length.values() for p in d.files}
    pool = {(L, y): set(t for t, lab in zip(d.texts, d.labels) if lab == y) for L, d in by_length.items()
            for y in (0, 1)}
    heads = []
    for text, start, parts in zip(ds.texts, ds.extra["member_from"], ds.extra["parts"]):
        assert [p["label"] for p in parts] == [0, 1] and text[:start] == text[: parts[0]["end"]]
        for p in parts:
            assert text[p["start"]: p["end"]] in pool[(p["words"], p["label"])]
            heads.append(concat.cut_words(text[p["start"]: p["end"]], 32))
    assert len(heads) == len(set(heads))  # no article twice
    counts = {(p["label"], p["words"]) for ps in ds.extra["parts"] for p in ps}
    assert counts == {(y, L) for y in (0, 1) for L in (32, 64, 128)}
    small = concat.wikimia_concat((32,), n_texts=10, n_controls=3, seed=1)
    assert len(small) == 13 and small.labels == [1] * 10 + [0] * 3
    assert all(s == len(t) for s, t in zip(small.extra["member_from"][10:], small.texts[10:]))
    with pytest.raises(UserError, match="WikiMIA has lengths"):
        concat.wikimia_concat((48,))


def eval_rows(tmp_path):
    rows = [{"dataset": d, "id": f"{d}{i}", "label": i % 2, "text": f"{d} text {i} " + "word " * (3 + i)}
            for d, n in (("a", 12), ("b", 6)) for i in range(n)]
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows, path


def test_contamination_concat_per_dataset(tmp_path):
    rows, path = eval_rows(tmp_path)
    recs = concat.contamination_concat(path, seed=5)
    assert [r["dataset"] for r in recs] == ["a"] * 6 + ["b"] * 3
    texts = {r["id"]: r for r in rows}
    for r in recs:
        for p in r["parts"]:
            src = texts[p["id"]]
            assert src["dataset"] == r["dataset"] and src["label"] == p["label"]
            assert r["text"][p["start"]: p["end"]] == src["text"].strip()
        assert r["text"][: r["member_from"]] == texts[r["parts"][0]["id"]]["text"].strip()
    # one dataset's draw does not depend on the others
    assert concat.contamination_concat(path, seed=5, datasets=["b"]) == recs[6:]
    with pytest.raises(UserError, match="dataset b: cannot make 4 records"):
        concat.contamination_concat(path, n_texts=4)
    with pytest.raises(UserError, match="no dataset c"):
        concat.contamination_concat(path, datasets=["c"])
    # the `mia-jax concat` subcommand writes the same records
    parser = argparse.ArgumentParser()
    concat_command.add_arguments(parser.add_subparsers(dest="command").add_parser(concat_command.NAME))
    out = tmp_path / "c.jsonl"
    concat_command.run(parser.parse_args(["concat", "--corpus", str(path), "--out", str(out), "--seed", "5"]))
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [{"text": w.pop("input"), **w} for w in written] == recs


def write_run(run, rows, data_rows, methods=("loss", "min_k_pp@0.2")):
    run.mkdir()
    with open(run / "windows.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "window", "n_tokens", "label", *methods])
        w.writerows(rows)
    data = run.parent / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in data_rows))
    from mia_jax.runs.files import sha256
    (run / "run.json").write_text(json.dumps({"data": {"files": {str(data): sha256(data)}}}))
    return data


def test_window_metrics_per_group_against_sklearn(tmp_path):
    rng = np.random.default_rng(0)
    rows, truth = [], {}
    for t in range(12):
        for j in range(6):
            lab = None if j == 2 else int(j > 2)
            s = rng.normal(lab or 0)
            rows.append([t, j, 8, "" if lab is None else lab, s, -s if t % 3 else s])
            if lab is not None:
                truth.setdefault(t % 2, []).append((lab, s, -s if t % 3 else s))
    data_rows = [{"input": f"t{t}", "label": 1, "dataset": ["even", "odd"][t % 2]} for t in range(12)]
    data = write_run(tmp_path / "run", rows, data_rows)
    reps = concat.window_metrics(tmp_path / "run", data, n_bootstrap=20)
    assert list(reps) == ["even", "odd"]
    for g, key in (("even", 0), ("odd", 1)):
        lab, loss, mkpp = map(np.array, zip(*truth[key]))
        assert reps[g]["n_labeled"] == 30 and reps[g]["n_straddling"] == 6  # 6 texts x (5 + 1)
        assert reps[g]["metrics"]["loss"]["auroc"] == pytest.approx(roc_auc_score(lab, loss))
        assert reps[g]["metrics"]["min_k_pp@0.2"]["auroc"] == pytest.approx(roc_auc_score(lab, mkpp))
        assert reps[g]["metrics"]["loss"]["auroc_ci"] is not None
    assert all(blind.NAME not in r["metrics"] and "no window texts" in r["blind_note"] for r in reps.values())
    assert "| loss" in concat.window_metrics_markdown(reps) and "no window texts" in concat.window_metrics_markdown(
        reps)
    assert list(concat.window_metrics(tmp_path / "run", n_bootstrap=0)) == ["all"]
    other = tmp_path / "other.jsonl"
    other.write_text(data.read_text() + "\n")
    with pytest.raises(UserError, match="not the data file"):
        concat.window_metrics(tmp_path / "run", other)


def test_eval_windows_labeled_by_member_from(tiny_llama_dir, tmp_path, capsys):
    """End to end on the tiny model: every window labeled 1 holds only member text (tokens from member_from on),
    every window labeled 0 only non-member text, the rest straddle; window_text is the decoded window; the blind
    baseline is a row of the window metrics; window_metrics reproduces eval's numbers (with window_text or not)."""
    from mia_jax import models
    from mia_jax.cli import main

    ds = wikimia(32)
    nonmembers = [t for t, y in zip(ds.texts, ds.labels) if y == 0][:30]
    members = [t for t, y in zip(ds.texts, ds.labels) if y == 1][:30]
    recs = [{**r, "dataset": "first" if i < 4 else "second"}
            for i, r in enumerate(concat.concat_texts(nonmembers, members, n_texts=8, lengths=(3, 6), n_controls=2,
                                                      seed=0))]
    data = concat.write_jsonl(recs, tmp_path / "concat.jsonl")
    out = tmp_path / "out"
    argv = ["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "loss", "min_k_pp",
            "--window", "8", "--out", str(out), "--no-progress", "--n-bootstrap", "10"]
    assert main(argv) == 0
    assert "Blind baseline on the windows (blind_bow" in capsys.readouterr().out
    tok = models.load(str(tiny_llama_dir)).tokenizer
    lines = list(csv.DictReader(open(out / "windows.csv", newline="", encoding="utf-8")))
    seen = set()
    for i, rec in enumerate(recs):
        offsets, ids = tok.encode(rec["text"]).offsets[1:], tok.encode(rec["text"]).ids[1:]  # the scored tokens
        member = [False] * len(rec["text"])  # characters of member text (a part, or the separator before one)
        for p in rec["parts"]:
            if p["label"] == 1:
                member[p["start"] - 1: p["end"]] = [True] * (p["end"] - p["start"] + 1)
        pos = 0
        for w in (row for row in lines if row["text"] == str(i)):
            sides = {member[c] for s, e in offsets[pos: pos + int(w["n_tokens"])] for c in range(s, e)}
            assert w["window_text"] == tok.decode(ids[pos: pos + int(w["n_tokens"])])
            pos += int(w["n_tokens"])
            assert w["label"] == ("" if len(sides) == 2 else str(int(sides.pop())))
            assert w["label"] != "1" or rec["label"] == 1
            seen.add(w["label"])
    assert seen == {"0", "1", ""}
    meta = json.loads((out / "run.json").read_text())["windows"]["metrics"]
    pooled = concat.window_metrics(out, n_bootstrap=10)["all"]["metrics"]
    assert list(meta) == ["loss", "min_k_pp@0.2", blind.NAME]
    assert {m: pooled[m]["auroc"] for m in pooled} == {m: meta[m]["auroc"] for m in meta}
    assert meta[blind.NAME]["n_scored"] == meta["loss"]["n_scored"] == sum(1 for w in lines if w["label"])
    per = concat.window_metrics(out, data, n_bootstrap=10)
    assert list(per) == ["first", "second"]
    assert all("Blind baseline not computed" in r["blind_note"] for r in per.values())  # 4 and 6 texts: too few
    # a resumed run (every batch already scored, the records hold no window text) writes the same windows.csv;
    # --no-blind drops the blind row
    plain = (out / "windows.csv").read_bytes()
    assert main(argv + ["--no-blind"]) == 0 and (out / "windows.csv").read_bytes() == plain
    assert "resuming" in capsys.readouterr().err
    assert blind.NAME not in json.loads((out / "run.json").read_text())["windows"]["metrics"]
    assert sum(r["n_labeled"] for r in per.values()) == sum(1 for w in lines if w["label"])
    assert re.search(r"first: \d+ labeled windows", concat.window_metrics_markdown(per))
    # a committed results folder may hold windows.csv.gz (plus run.json) instead: the same reports
    (out / "windows.csv.gz").write_bytes(gzip.compress(plain))
    (out / "windows.csv").unlink()
    assert concat.window_metrics(out, data, n_bootstrap=10) == per
    assert concat.window_metrics(out, n_bootstrap=10)["all"]["metrics"] == pooled
    assert concat.read_windows_csv(out) == list(csv.reader(io.StringIO(plain.decode(), newline="")))
    # one written before the window_text column: the same method rows, no blind row, a note saying why
    old = io.StringIO(newline="")
    csv.writer(old).writerows(r[:-1] for r in concat.read_windows_csv(out))
    (out / "windows.csv.gz").write_bytes(gzip.compress(old.getvalue().encode()))
    again = concat.window_metrics(out, n_bootstrap=10)["all"]
    assert again["metrics"] == {m: v for m, v in pooled.items() if m != blind.NAME}
    assert "no window texts" in again["blind_note"]
    (out / "windows.csv.gz").write_bytes(plain)  # not gzip
    with pytest.raises(UserError, match="not a readable gzip file"):
        concat.window_metrics(out)
    (out / "windows.csv.gz").unlink()
    with pytest.raises(UserError, match=r"no windows.csv \(or windows.csv.gz\)"):
        concat.window_metrics(out)


def test_concat_out_that_is_a_folder_is_refused(tmp_path, capsys):
    """`mia-jax concat --out` an existing folder (or a file in a folder that does not exist; window-metrics' --out
    too): one line, exit 2, the folder untouched, nothing written."""
    from mia_jax.cli import main

    _, path = eval_rows(tmp_path)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "keep.txt").write_text("earlier work")
    before = snapshot(folder)
    for argv, needle in [(["concat", "--corpus", str(path), "--out", str(folder)], "is an existing folder"),
                         (["concat", "--corpus", str(path), "--out", str(tmp_path / "no" / "c.jsonl")],
                          "does not exist"),
                         (["concat", "--wikimia", "--out", str(folder)], "is an existing folder"),
                         (["window-metrics", str(folder), "--out", str(folder)], "is an existing folder"),
                         (["concat", "--corpus", str(path), "--out", str(tmp_path / "c.jsonl"), "--n", "0"], "--n"),
                         (["concat", "--corpus", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "c.jsonl")],
                          "no such file")]:
        capsys.readouterr()
        rc = main(argv)
        assert_clean_error(rc, capsys.readouterr().err, needle)
        assert snapshot(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.jsonl", "folder"]
