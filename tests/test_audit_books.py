"""mia_jax.audits.books (Shi et al. 2023 section 5): snippet cutting and the seeded draw by hand, the two validation
thresholds on hand-made scores and against brute force / metrics.tpr_at_fpr, Clopper-Pearson against scipy and the
closed forms at 0/n and n/n, the book loaders, and `audit-books` end to end on a tiny random model (every output
recomputed from snippets.csv; `--from` rebuilds the same files from the folder alone)."""
import csv
import functools
import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import beta, binomtest

import helpers
from helpers import assert_clean_error, check_rebuilds_again, check_refused_into, cut_mid_row, drop_line, snapshot

from mia_jax.runs import entry
from mia_jax.evaluation import metrics
from mia_jax.audits import books as B
from mia_jax.audits import books_rates as R
from mia_jax.audits import books_rebuild
from mia_jax.audits import books_report
from mia_jax.audits import books_snippets as S
from mia_jax.commands import audit_books
from mia_jax.data import wikimia
from mia_jax.errors import UserError

# ----------------------------------------------------------------------------- snippets


def words(n, tag="w"):
    return " ".join(f"{tag}{i}" for i in range(n))


def test_snippets_by_hand():
    books = [S.Book("ten", "  w0 w1\nw2  w3 w4 w5 w6 w7 w8 w9 "), S.Book("short", "a b"), S.Book("six", words(6, "x"))]
    p = S.make_snippets(books, n_snippets=100, snippet_words=3, seed=0)
    # non-overlapping 3-word pieces, verbatim (inner whitespace kept); the 1-word tail "w9" is not used
    assert [(s.book, s.position, s.word_offset, s.n_words, s.text) for s in p.snippets] == [
        (0, 0, 0, 3, "w0 w1\nw2"), (0, 1, 3, 3, "w3 w4 w5"), (0, 2, 6, 3, "w6 w7 w8"),
        (2, 0, 0, 3, "x0 x1 x2"), (2, 1, 3, 3, "x3 x4 x5")]
    assert p.n_pieces == [3, 0, 2] and p.kept == [0, 2]
    assert p.skipped == [{"title": "short", "words": 2}]  # shorter than one snippet: skipped, counted
    assert S.make_snippets([S.Book("exact", words(3))], 5, 3).n_pieces == [1]  # exactly one snippet: kept


def test_draw_is_seeded_and_per_book():
    text = words(500)
    p0 = S.make_snippets([S.Book("a", text)], n_snippets=10, snippet_words=10, seed=0)
    pos = [s.position for s in p0.snippets]
    assert len(pos) == 10 and pos == sorted(set(pos)) and max(pos) < 50
    for s in p0.snippets:  # every drawn snippet is its 10 words of the book
        assert s.text == " ".join(f"w{i}" for i in range(s.word_offset, s.word_offset + 10))
    # the documented draw: default_rng([seed, first 8 bytes of the text's SHA-256, little-endian])
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    assert pos == sorted(np.random.default_rng([0, h]).choice(50, 10, replace=False).tolist())
    again = S.make_snippets([S.Book("other", words(40, "z")), S.Book("a", text)], 10, 10, seed=0)
    assert [s.position for s in again.snippets if s.book == 1] == pos  # independent of the other books
    other_seed = [s.position for s in S.make_snippets([S.Book("a", text)], 10, 10, seed=1).snippets]
    assert other_seed != pos and len(other_seed) == 10
    assert [s.position for s in S.make_snippets([S.Book("a", text)], 60, 10).snippets] == list(range(50))


# ----------------------------------------------------------------------------- thresholds

LAB = [1, 1, 0, 1, 0, 0]
SC = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]


def test_accuracy_threshold_by_hand():
    # correct predictions at t = 0.9 .. 0.4: 4, 5, 4, 5, 4, 3 of 6; the tie 0.8 / 0.6 goes to the higher
    t = R.accuracy_threshold(LAB, SC)
    assert (t.value, t.accuracy, t.tpr, t.fpr) == (0.8, 5 / 6, 2 / 3, 0.0)
    assert R.accuracy_threshold(LAB[::-1], SC[::-1]).value == 0.8  # input order does not matter
    # tied scores act together: at 0.5 both rows are flagged
    t = R.accuracy_threshold([1, 0, 1, 0], [0.9, 0.5, 0.5, 0.1])
    assert (t.value, t.accuracy) == (0.9, 0.75)
    # NaN scores are left out
    assert R.accuracy_threshold(LAB + [1], SC + [np.nan]).value == 0.8


def brute_force(lab, sc):
    lab, sc = np.asarray(lab), np.asarray(sc)
    best = None
    for t in sorted(set(sc.tolist()), reverse=True):
        correct = int(((sc >= t) == (lab == 1)).sum())
        if best is None or correct > best[1]:
            best = (t, correct)
    return best


def test_thresholds_against_references():
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(4, 60))
        lab = rng.integers(0, 2, n)
        lab[:2] = [0, 1]
        sc = rng.integers(0, 8, n).astype(float) + 0.5 * lab  # many ties
        t = R.accuracy_threshold(lab, sc)
        want_t, want_correct = brute_force(lab, sc)
        assert t.value == want_t and t.accuracy == want_correct / n
        for fpr in (0.0, 0.05, 0.2, 0.5):
            f = R.fpr_threshold(lab, sc, fpr)
            assert f.tpr == pytest.approx(metrics.tpr_at_fpr(lab, sc, fpr), abs=1e-12)
            assert f.fpr <= fpr
            if np.isfinite(f.value):  # the flags of the threshold give its TPR / FPR
                flagged = sc >= f.value
                assert f.tpr == flagged[lab == 1].mean() and f.fpr == flagged[lab == 0].mean()


def test_fpr_threshold_by_hand():
    assert R.fpr_threshold(LAB, SC, 0.0).value == 0.8  # no false positive: TPR 2/3
    t = R.fpr_threshold(LAB, SC, 0.34)  # one false positive of 3 allowed
    assert (t.value, t.tpr, t.fpr) == (0.6, 1.0, 1 / 3)
    assert R.fpr_threshold(LAB, SC, 0.3).value == 0.8
    t = R.fpr_threshold([0, 1, 1], [0.9, 0.5, 0.4], 0.0)  # the top score is unseen: nothing can be flagged
    assert t.value == np.inf and t.tpr == 0.0 and t.fpr == 0.0
    assert not R.flags([1e300, np.nan], t.value).any()
    assert R.flags([0.8, 0.79, np.nan], 0.8).tolist() == [True, False, False]


def test_one_class_validation_is_refused():
    for fn in (R.accuracy_threshold, R.fpr_threshold):
        with pytest.raises(UserError, match="one class only"):
            fn([1, 1, 1], [0.1, 0.2, 0.3])
        with pytest.raises(UserError, match="one class only"):
            fn([1, 0], [0.1, np.nan])
    books = [{"title": "x", "text": words(30)}]
    val = [{"title": "s", "text": words(30), "label": 1}, {"title": "u", "text": "too short", "label": 0}]
    with pytest.raises(UserError, match="every kept validation book is seen"):
        B.prepare(books, val, B.BooksConfig(snippet_words=10))
    with pytest.raises(UserError, match="give --validation .* or --threshold"):
        B.prepare(books, None, B.BooksConfig(snippet_words=10))


# ----------------------------------------------------------------------------- Clopper-Pearson


def test_clopper_pearson():
    for k, n in [(3, 10), (37, 100), (1, 2)]:
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert R.clopper_pearson(k, n) == (ci.low, ci.high)
        # the textbook form: beta quantiles
        lo, hi = beta.ppf(0.025, k, n - k + 1), beta.ppf(0.975, k + 1, n - k)
        np.testing.assert_allclose(R.clopper_pearson(k, n), (lo, hi), rtol=1e-9)
    for n in (1, 7, 100):  # 0/n and n/n: closed forms
        assert R.clopper_pearson(0, n)[0] == 0.0
        assert R.clopper_pearson(0, n)[1] == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-9)
        assert R.clopper_pearson(n, n)[0] == pytest.approx(0.025 ** (1 / n), rel=1e-9)
        assert R.clopper_pearson(n, n)[1] == 1.0


def test_book_rates_by_hand():
    p = S.make_snippets([S.Book("a", words(40)), S.Book("b", words(40), 1)], 4, 10)
    scores = np.array([1.0, 2.0, 3.0, np.nan, 0.0, 0.0, 0.0, 5.0])
    rates = R.book_rates(p, scores, [R.Threshold("given", 2.0)])
    assert [r["title"] for r in rates] == ["a", "b"]  # ranked: 2/3 > 1/4
    a, b = rates
    assert (a["snippets"], a["scored"], a["rates"]["given"]["flagged"], a["rates"]["given"]["rate"]) == (4, 3, 2, 2 / 3)
    assert a["rates"]["given"]["ci"] == list(R.clopper_pearson(2, 3)) and a["mean_score"] == 2.0
    assert b["rates"]["given"]["rate"] == 0.25 and b["label"] == 1


# ----------------------------------------------------------------------------- loading books


def test_load_books(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "Moby Dick.txt").write_text("call me ishmael")
    (folder / "Emma.txt").write_text("emma woodhouse")
    (folder / "notes.md").write_text("ignored")
    books, files = S.load_books(folder)
    assert [(b.title, b.text, b.label) for b in books] == [("Emma", "emma woodhouse", None),
                                                           ("Moby Dick", "call me ishmael", None)]
    assert len(files) == 2
    lab = tmp_path / "lab"
    for sub, title in (("seen", "old"), ("unseen", "new")):
        (lab / sub).mkdir(parents=True)
        (lab / sub / f"{title}.txt").write_text(title)
    assert [(b.title, b.label) for b in S.load_books(lab)[0]] == [("old", 1), ("new", 0)]
    jl = tmp_path / "b.jsonl"
    jl.write_text(json.dumps({"title": "T", "text": "x y", "label": "1"}) + "\n"
                  + json.dumps({"title": 7, "text": "z", "label": 0}) + "\n")
    assert [(b.title, b.text, b.label) for b in S.load_books(jl)[0]] == [("T", "x y", 1), ("7", "z", 0)]
    (lab / "stray.txt").write_text("x")
    cases = [(lab, "beside seen/"), (tmp_path / "nope", "not found"), (tmp_path / "lab" / "seen" / "x", "not found")]
    bad_rows = [([{"title": "a", "text": "x"}, {"title": "a", "text": "y"}], "two books titled 'a'"),
                ([{"text": "x"}], "has no 'title'"),
                ([{"title": "a", "text": "x", "label": 1}, {"title": "b", "text": "y"}], "has no 'label'"),
                ([{"title": "a", "text": "x", "label": 2}], "labels must be 1 .seen. or 0")]
    for j, (rows, match) in enumerate(bad_rows):
        bad = tmp_path / f"bad{j}.jsonl"
        bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
        cases.append((bad, match))
    for path, match in cases:
        with pytest.raises(UserError, match=match):
            S.load_books(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no .txt files"):
        S.load_books(tmp_path / "empty")


# ----------------------------------------------------------------------------- the command


def reseal(folder):
    """Seal ``folder`` again after a test edited a file (as if the run had written it so)."""
    from mia_jax.runs import rundir

    rundir.seal(folder, list(books_report.REBUILD_READS))


def parse(argv):
    parser = entry.ArgumentParser(prog="mia-jax")
    audit_books.add_arguments(parser.add_subparsers(dest="command").add_parser("audit-books"))
    return parser.parse_args(["audit-books", *argv])


def request(argv):
    """The audit's request of the command line ``argv``, as ``audit_books.run`` makes it."""
    return audit_books.BooksRequest.from_args(parse(argv))


@pytest.mark.parametrize("argv, needle", [
    (["--snippets", "0"], "--snippets"), (["--snippet-words", "-3"], "--snippet-words"), (["--seed", "-1"], "--seed"),
    (["--fpr", "nan"], "--fpr"), (["--n-bootstrap", "x"], "--n-bootstrap"), (["--batch-size", "0"], "--batch-size"),
    (["--chunk-size", "1.5"], "--chunk-size"), (["--from", "/no/such/folder"], "--from")])
def test_options_are_checked_when_parsed(argv, needle, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        parse([*argv, "--out", str(tmp_path / "o")])
    assert_clean_error(e.value.code, capsys.readouterr().err, needle)
    assert not (tmp_path / "o").exists()


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def book_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("books")
    texts = wikimia(64).texts
    audit = [{"title": f"book {i}", "text": texts[i], "label": i % 2} for i in range(6)]
    audit.append({"title": "tiny", "text": "far too short", "label": 0})
    path = root / "audit.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in audit))
    val = root / "val"
    for i, sub in enumerate(["seen", "unseen"] * 3):
        (val / sub).mkdir(parents=True, exist_ok=True)
        (val / sub / f"v{i}.txt").write_text(texts[10 + i])
    return path, val


ARGS = ["--snippet-words", "8", "--snippets", "4", "--n-bootstrap", "200", "--no-progress"]  # 12 per class


def test_command_end_to_end(tiny_llama_dir, book_files, tmp_path, capsys):
    books, val = book_files
    out = tmp_path / "audit"
    argv = ["--books", str(books), "--validation", str(val), "--model", str(tiny_llama_dir), "--out", str(out),
            "--threshold", "-5.5", *ARGS]
    res = audit_books.run_audit(request(argv))
    cap = capsys.readouterr()
    assert "1 book shorter than one snippet (8 words) skipped: tiny" in cap.err
    assert cap.out.startswith("## Copyrighted-book audit")
    for name in ("books.md", "books.csv", "snippets.csv", "histogram.png", "info.json", "books/results.jsonl",
                 "validation/results.jsonl"):
        assert (out / name).is_file(), name
    info = json.loads((out / "info.json").read_text())
    assert info["counts"]["books"] == 6 and info["counts"]["books_skipped"] == 1 and info["counts"]["snippets"] == 24
    assert info["skipped_books"] == [{"title": "tiny", "words": 3}]
    assert info["config"]["methods"] == list(B.METHODS)  # lowercase included: a second pass
    snip = read_csv(out / "snippets.csv")
    audit = [r for r in snip if r["set"] == "audit"]
    vrows = [r for r in snip if r["set"] == "validation"]
    assert len(audit) == 24 and len(vrows) == 24
    for m in ("min_k@0.2", "ppl", "zlib"):  # lowercase: empty where the snippet has no capital letter
        assert np.isfinite([float(r[m]) for r in snip]).all()
    assert all(r["lowercase"] == "" or np.isfinite(float(r["lowercase"])) for r in snip)
    # the thresholds, recomputed from the validation rows
    lab = np.array([int(r["label"]) for r in vrows])
    vs = np.array([float(r["min_k@0.2"]) for r in vrows])
    assert lab.sum() == 12
    th = {t["name"]: t for t in info["thresholds"]}
    assert th["accuracy"]["value"] == brute_force(lab, vs)[0]
    assert th["fpr"]["validation_tpr"] == pytest.approx(metrics.tpr_at_fpr(lab, vs, 0.05))
    assert th["given"]["value"] == -5.5
    assert info["validation_metrics"]["ppl"]["auroc"] == pytest.approx(
        metrics.auroc(lab, [float(r["ppl"]) for r in vrows]))
    # the validation intervals resample books (a cluster bootstrap over the 6 validation books), not snippets
    vppl = [float(r["ppl"]) for r in vrows]
    vm = info["validation_metrics"]["ppl"]
    assert vm["bootstrap"] == "cluster" and vm["clusters"] == 6 and vm["cluster_stratified"] is True
    want = metrics.evaluate(lab, vppl, n_bootstrap=200, seed=0, clusters=[r["title"] for r in vrows])
    assert vm["auroc_ci"] == pytest.approx(want["auroc_ci"], abs=1e-12)
    assert vm["auroc_ci"] != metrics.evaluate(lab, vppl, n_bootstrap=200, seed=0)["auroc_ci"]
    # the per-book rates, recomputed from the audit rows
    rows = read_csv(out / "books.csv")
    assert [r["title"] for r in rows] == [r["title"] for r in res.rates] and len(rows) == 6
    by_title = {}
    for r in audit:
        by_title.setdefault(r["title"], []).append(float(r["min_k@0.2"]))
    for r in rows:
        sc = np.array(by_title[r["title"]])
        assert int(r["snippets_drawn"]) == 4 and int(r["snippets_available"]) == len(texts_words(r["title"])) // 8
        for name, t in th.items():
            k = int((sc >= (np.inf if t["value"] is None else t["value"])).sum())
            assert int(r[f"flagged_{name}"]) == k and float(r[f"rate_{name}"]) == k / 4
            assert (float(r[f"ci_lo_{name}"]), float(r[f"ci_hi_{name}"])) == R.clopper_pearson(k, 4)
    acc = [float(r["rate_accuracy"]) for r in rows]
    assert acc == sorted(acc, reverse=True)  # ranked
    # the rates separate labeled books? 3 seen and 3 unseen books are too few (metrics.MIN_PER_CLASS): n/a, with
    # the reason, in the JSON and in the table
    sep = info["book_separation"]
    assert sep["rate @ accuracy"]["n_members"] == 3 and sep["rate @ accuracy"]["n_nonmembers"] == 3
    assert sep["rate @ accuracy"]["auroc"] is None and "fewer than 10" in sep["rate @ accuracy"]["note"]
    md = (out / "books.md").read_text()
    assert "| rate @ accuracy | n/a | 3 | 3 | n/a: fewer than 10" in md and "**" not in md
    assert "### Contamination rate per book (Table 2), ranked" in md and "| 1 | " in md and "Figure 3" in md
    assert "intervals resample the 6 validation books, each with all its snippets" in md
    print(md)  # the README example (pytest -s)
    # the same command again: both scoring runs resume, the same tables
    audit_books.run_audit(request(argv))
    assert "resuming the books run" in capsys.readouterr().err
    assert read_csv(out / "books.csv") == rows


def texts_words(title):
    return wikimia(64).texts[int(title.split()[1])].split()


def test_command_without_validation_and_bad_input(tiny_llama_dir, book_files, tmp_path, capsys):
    books, val = book_files
    m = str(tiny_llama_dir)
    out = tmp_path / "o"
    base = ["--books", str(books), "--model", m, "--out", str(out), *ARGS]
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"title": "a", "text": words(40), "label": 1}) + "\n")
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"title": "a", "text": "only four words here"}) + "\n")
    cases = [([], "give --validation"),
             (["--validation", str(one)], "every kept validation book is seen"),
             (["--threshold", "0", "--books", str(short)], "no book has 8 words"),
             (["--threshold", "0", "--fpr", "1"], "--fpr must be in"),
             (["--threshold", "0", "--method-for-rate", "nope"], "unknown method 'nope'"),
             (["--threshold", "0", "--model", str(tmp_path / "missing")], "missing")]
    for extra, match in cases:
        with pytest.raises(UserError, match=match):
            audit_books.run_audit(request([*base, *extra]))
    assert not out.exists()  # nothing written before every check passed
    # no validation, a given threshold: rates at it only; methods: the rate method is added when left out
    argv = [*base, "--threshold", "-5.5", "--methods", "ppl", "--method-for-rate", "min_k"]
    res = audit_books.run_audit(request(argv))
    assert res.config["methods"] == ["ppl", "min_k@0.2"] and [t.name for t in res.thresholds] == ["given"]
    assert res.validation is None and (out / "histogram.png").is_file()
    info = json.loads((out / "info.json").read_text())
    assert info["validation_metrics"] is None and info["thresholds"][0]["value"] == -5.5
    sc = np.array([float(r["min_k@0.2"]) for r in read_csv(out / "snippets.csv")])
    flagged = [r["flagged_given"] == "True" for r in read_csv(out / "snippets.csv")]
    assert flagged == (sc >= -5.5).tolist()
    assert "Validation" not in capsys.readouterr().out


def test_cli_one_class_validation_exit_2(tiny_llama_dir, book_files, tmp_path, capsys):
    from mia_jax.cli import main

    books, _ = book_files
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"title": "a", "text": words(40), "label": 1}) + "\n")
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("earlier work")
    rc = main(["audit-books", "--books", str(books), "--validation", str(one), "--model", str(tiny_llama_dir),
               "--out", str(out), *ARGS])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err and "every kept validation book is seen" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "earlier work"


# ----------------------------------------------------------------------------- rebuilding from a folder


def test_rebuild_from_folder(tiny_llama_dir, book_files, tmp_path, capsys):
    from mia_jax.cli import main

    books, val = book_files
    src = tmp_path / "audit"
    res = audit_books.run_audit(request(["--books", str(books), "--validation", str(val), "--model",
                                         str(tiny_llama_dir), "--out", str(src), "--threshold", "-5.5", *ARGS]))
    before = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    # snippets.csv holds the scores at full precision: read back bit for bit (NaN where lowercase has no score)
    again = books_rebuild.rebuild(src)
    assert np.isnan(res.scores["lowercase"]).any() or np.isnan(res.validation_scores["lowercase"]).any()
    for m in res.config["methods"]:
        np.testing.assert_array_equal(again.scores[m], res.scores[m])
        np.testing.assert_array_equal(again.validation_scores[m], res.validation_scores[m])
    capsys.readouterr()
    out = tmp_path / "rebuilt"
    assert main(["audit-books", "--from", str(src), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("## Copyrighted-book audit")
    for name in ("books.md", "books.csv", "snippets.csv"):  # flags recomputed too
        assert (out / name).read_bytes() == (src / name).read_bytes(), name
    assert (out / "histogram.png").is_file()
    a, b = (json.loads((d / "info.json").read_text()) for d in (src, out))
    assert a["validation_metrics"]["min_k@0.2"]["auroc_ci"] is not None and a["book_separation"]
    for key in ("config", "counts", "notes", "thresholds", "validation_metrics", "book_separation", "skipped_books",
                "skipped_validation_books", "command", "model"):
        assert b[key] == a[key], key
    assert b["rebuilt"]["from"] == str(src) and "rebuilt" not in a
    assert {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()} == before  # the source untouched
    # the scoring facts come from info.json: truncation, books also in validation (an older folder: its note)
    info = dict(a, counts={**a["counts"], "truncated_books": 2, "books_also_validation": 1})
    (src / "info.json").write_text(json.dumps(info))
    reseal(src)  # as if the run had written it
    notes = books_rebuild.rebuild(src).notes
    assert notes[0].startswith("Note: 1 audited books are also validation") and "2 books snippets are longer than "\
        f"the model's context of {a['model']['max_length']} tokens" in notes[1]
    del info["counts"]["books_also_validation"]
    (src / "info.json").write_text(json.dumps(dict(info, notes=notes)))
    reseal(src)
    assert books_rebuild.rebuild(src).notes == notes
    # refusals: one line, exit 2, nothing written
    (src / "snippets.csv").unlink()
    bad = tmp_path / "bad"
    cases = [(["--from", str(src), "--out", str(bad)], "snippets.csv is missing"),
             (["--from", str(out), "--out", str(out / "inner")], "inside a --from folder"),
             (["--from", str(out), "--out", str(bad), "--model", "m", "--threshold", "0"],
              "leave out --model, --threshold"),
             (["--out", str(bad), "--model", "m"], "needs --books and --model")]
    for argv, match in cases:
        rc = main(["audit-books", *argv])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err and match in err, (argv, err)
    assert not bad.exists()
    assert (out / "books.md").read_bytes() == before["books.md"]


# ----------------------------------------------------------------------------- --from: what it reads is checked

COMMITTED = Path(__file__).resolve().parents[1] / "results" / "audits" / "books"


rebuild_cli = functools.partial(helpers.rebuild_cli, "audit-books")  # the fixture `sealed`: conftest.py


@pytest.mark.parametrize("edit, needle", [
    (cut_mid_row, "snippets.csv line "),  # a torn row: too few fields, or a cut number / flag
    (lambda p: drop_line(p, 5), "info.json counts"),  # a whole row gone: the counts disagree
    (lambda p: p.write_text(p.read_text().replace("\naudit,", "\naudits,", 1)), "not audit or validation"),
    (lambda p: p.write_text(re.sub(r"(\naudit,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,)[^,]*,", r"\1abc,", p.read_text(), 1)),
     "not a number"),
    (lambda p: p.write_text(re.sub(r"(\naudit,[^,]*,)[^,]*,", r"\g<1>2,", p.read_text(), 1)), "not 1 (seen)"),
    (lambda p: p.write_text(p.read_text().replace(",True", ",Tru", 1)), "not True or False"),
])
def test_from_reads_snippets_strictly(sealed, edit, needle, tmp_path, capsys):
    """A damaged file that its manifest records as written (a run that wrote it so) is still refused: every cell,
    and the files against each other."""
    edit(sealed / "snippets.csv")
    reseal(sealed)
    rc, err = rebuild_cli(sealed, tmp_path / "out", capsys)
    assert_clean_error(rc, err, needle)
    assert not (tmp_path / "out").exists()


def test_from_books_csv_against_snippets(sealed, tmp_path, capsys):
    with open(sealed / "books.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    rows[1][4] = str(int(rows[1][4]) + 1)  # snippets_drawn
    with open(sealed / "books.csv", "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    reseal(sealed)
    rc, err = rebuild_cli(sealed, tmp_path / "out", capsys)
    assert_clean_error(rc, err, "books.csv says", "were drawn")


def test_from_into_another_runs_folder_is_refused(sealed, tmp_path, capsys):
    check_refused_into("audit-books", sealed, COMMITTED.parent / "unlearning", tmp_path / "other", capsys)


def test_from_committed_folder_reproduces_it(sealed, tmp_path, capsys):
    """The committed audit rebuilds from its folder: the same books.csv, snippets.csv and figure (books.md: the same
    but for the book-level separation rows, n/a since metrics.MIN_PER_CLASS: 9 seen and 9 unseen books); a byte-order
    mark is read; the rebuild again into its own earlier output, and in place."""
    for name in ("snippets.csv", "books.csv"):
        (sealed / name).write_bytes(b"\xef\xbb\xbf" + (sealed / name).read_bytes())
    reseal(sealed)
    out = tmp_path / "out"
    rc, err = rebuild_cli(sealed, out, capsys)
    assert rc == 0, err
    for name in ("books.csv", "snippets.csv", "histogram.png"):
        assert (out / name).read_bytes() == (COMMITTED / name).read_bytes(), name
    new, old = ((d / "books.md").read_text().splitlines() for d in (out, COMMITTED))
    assert len(new) == len(old)
    assert all(a == b or a.startswith(("| rate @ ", "| mean score ")) for a, b in zip(new, old))
    check_rebuilds_again("audit-books", sealed, out, "info.json", capsys)
    books_rebuild.rebuild(out)  # sealed again: verifies


def test_read_csv_rows_is_strict(tmp_path):
    from mia_jax.audits.common import read_csv_rows

    path = tmp_path / "x.csv"
    for data, needle in [(b"a,b\r\n1,\xff\r\n", "not UTF-8"), (b"", "is empty"), (b"a,c\r\n1,2\r\n", "no column 'b'"),
                         (b"a,b\r\n1,2\r\n\r\n3,4\r\n", "line 3: 0 fields"), (b'a,b\r\n1,"2\r\n', "line 2"),
                         (b"a,b\r\n1,2,3\r\n", "line 2: 3 fields where the header has 2")]:
        path.write_bytes(data)
        with pytest.raises(UserError, match=needle):
            read_csv_rows(path, ["a", "b"], "test")
    path.write_bytes(b"\xef\xbb\xbfa,b\r\n1,2\r\n")  # a byte-order mark is read
    assert read_csv_rows(path, ["a", "b"], "test") == [(2, {"a": "1", "b": "2"})]


def test_audit_into_another_runs_folder_is_refused(tiny_llama_dir, book_files, tmp_path, capsys):
    """An audit's --out holding another run (here an unlearning audit; then an audit of other settings) is refused
    untouched, one line and exit 2; the same audit again resumes in it."""
    from mia_jax.cli import main

    books, val = book_files
    other = tmp_path / "other"
    shutil.copytree(COMMITTED.parent / "unlearning", other)
    before = snapshot(other)
    argv = ["audit-books", "--books", str(books), "--model", str(tiny_llama_dir), "--threshold", "-5.5", *ARGS]
    capsys.readouterr()
    rc = main([*argv, "--out", str(other)])
    assert_clean_error(rc, capsys.readouterr().err, str(other), "refusing to write into it")
    assert snapshot(other) == before
    out = tmp_path / "audit"
    assert main([*argv, "--out", str(out)]) == 0
    books_rebuild.rebuild(out)  # sealed at its end
    before = snapshot(out)
    capsys.readouterr()
    rc = main([*argv, "--out", str(out), "--fpr", "0.1"])
    assert_clean_error(rc, capsys.readouterr().err, "holds a different run", "fpr: 0.05 -> 0.1")
    assert snapshot(out) == before
