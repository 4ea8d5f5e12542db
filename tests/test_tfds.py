"""TFDS as a data source (mia_jax.data.tfds_source) and the project's datasets as TFDS builders (mia_jax.data.builders,
`mia-jax datasets`), with TensorFlow absent: datasets built here from the bundled files, read back through
tfds.data_source with the same texts, labels and order as the JSONL path, scored by `mia-jax eval --data tfds:...` with
the same records, and every bad input refused in one line (exit 2) with nothing written."""
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds
from helpers import ENV, REPO, assert_clean_error, snapshot

from mia_jax import data
from mia_jax.audits import books
from mia_jax.cli import main
from mia_jax.data import builders, corpora, known, stream, tfds_source
from mia_jax.errors import UserError


def texts_sha256(ds) -> str:
    """The run fingerprint's hash of the texts and labels (runner.run_fingerprint)."""
    blob = json.dumps([list(ds.texts), list(ds.labels) if ds.labels is not None else None], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """WikiMIA length32 and the news sample built by the command, into a fresh TFDS data folder."""
    d = tmp_path_factory.mktemp("tfds")
    assert main(["datasets", "build", "wikimia", "--config", "length32", "--data-dir", str(d), "--no-progress"]) == 0
    assert main(["datasets", "build", "contamination", "--config", "news", "imdb", "--data-dir", str(d),
                 "--no-progress"]) == 0
    return d


def test_read_back_without_tensorflow_as_the_jsonl_path(tfds_dir, capsys):
    src = tfds_source.TfdsSource("tfds:wikimia/length32", tfds_dir)
    assert (src.name, src.config, src.version, src.split, len(src)) == ("wikimia", "length32", "1.0.0", "train", 776)
    jsonl = data.wikimia(32)
    ds = data.load("tfds:wikimia/length32:train", tfds_dir)
    assert ds.text_field == "input" and ds.name == "wikimia-length32"
    assert ds.texts == jsonl.texts and ds.labels == jsonl.labels and texts_sha256(ds) == texts_sha256(jsonl)
    # the fingerprint's files: every file of the split and the dataset's description, by path (name, config,
    # version and split are in it) and SHA-256
    version = tfds_dir / "wikimia" / "length32" / "1.0.0"
    assert set(ds.files) == {str(version / "dataset_info.json"), str(version / "features.json"),
                             str(version / "wikimia-train.array_record-00000-of-00001")}
    assert all(len(h) == 64 for h in ds.files.values())
    # a streaming reader's window: rows from any start, in order, plain Python
    tail = list(src.rows(770))
    assert [r["input"] for r in tail] == jsonl.texts[770:] and [r["label"] for r in tail] == jsonl.labels[770:]
    news = data.load("tfds:contamination/news", tfds_dir, label_field=None)
    assert news.texts == data.load_records(builders.train_data_dir() / "news2023_sample.jsonl", "text", None).texts
    imdb = data.load("tfds:contamination/imdb", tfds_dir, label_field=None, extra=("sentiment", "rating"))
    assert imdb.extra["sentiment"][0] in ("positive", "negative") and isinstance(imdb.extra["rating"][0], int)
    before = snapshot(tfds_dir)
    capsys.readouterr()
    assert main(["datasets", "build", "wikimia", "--config", "length32", "--data-dir", str(tfds_dir)]) == 0
    assert "(already built: kept)" in capsys.readouterr().out and snapshot(tfds_dir) == before
    assert main(["datasets", "list", "--data-dir", str(tfds_dir)]) == 0
    listed = capsys.readouterr().out
    assert "tfds:wikimia/length32\tbuilt 1.0.0" in listed and "tfds:wikimia/length64\tnot built" in listed
    assert importlib.util.find_spec("tensorflow") is None and "tensorflow" not in sys.modules


def test_a_fresh_process_reads_it_without_the_builders_code(tfds_dir):
    """What a user's `mia-jax eval --data tfds:...` does: TFDS reads the dataset from its files alone (the builder
    classes, imported by this test process, are not registered there)."""
    code = ("import sys, hashlib, json; from mia_jax import data; "
            f"ds = data.load('tfds:wikimia/length32', {str(tfds_dir)!r}); "
            "assert 'mia_jax.data.builders' not in sys.modules and 'tensorflow' not in sys.modules; "
            "print(hashlib.sha256(json.dumps([ds.texts, ds.labels], ensure_ascii=False).encode()).hexdigest())")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == texts_sha256(data.wikimia(32))


def test_mimir_builds_from_its_files_as_the_benchmark_reads_them(tmp_path):
    try:
        known.mimir_files("pubmed_central")
    except UserError:
        pytest.skip("MIMIR's files are not on this machine (../shared/data/mimir)")
    assert builders.build("mimir", tmp_path, ["pubmed_central"], progress=False)[0][2] > 0
    assert texts_sha256(data.load("tfds:mimir/pubmed_central", tmp_path)) == texts_sha256(known.mimir("pubmed_central"))


def test_eval_from_tfds_scores_as_the_jsonl_path(tfds_dir, tiny_llama_dir, tmp_path):
    common = ["--model", str(tiny_llama_dir), "--limit", "12", "--methods", "loss", "zlib", "--n-bootstrap", "10",
              "--no-blind", "--no-progress"]
    jsonl = data.FILES / "WikiMIA_length32.jsonl"
    assert main(["eval", "--data", "tfds:wikimia/length32", "--data-dir", str(tfds_dir), *common,
                 "--out", str(tmp_path / "tfds")]) == 0
    assert main(["eval", "--data", str(jsonl), *common, "--out", str(tmp_path / "jsonl")]) == 0
    assert (tmp_path / "tfds" / "results.jsonl").read_bytes() == (tmp_path / "jsonl" / "results.jsonl").read_bytes()
    via_tfds, via_file = (json.loads((tmp_path / r / "config.json").read_text()) for r in ("tfds", "jsonl"))
    assert via_tfds["texts_sha256"] == via_file["texts_sha256"] and via_tfds["text_field"] == "input"
    assert any(f.endswith("wikimia/length32/1.0.0/wikimia-train.array_record-00000-of-00001")
               for f in via_tfds["data_files"])


def _tfrecord_copy(tfds_dir: Path, dest: Path) -> Path:
    """A copy of the built WikiMIA whose dataset_info.json says TFRecord, as TFDS writes a dataset built in that format
    (TFRecord files themselves cannot be written without TensorFlow)."""
    version = dest / "wikimia" / "length32" / "1.0.0"
    shutil.copytree(tfds_dir / "wikimia" / "length32" / "1.0.0", version)
    info = json.loads((version / "dataset_info.json").read_text())
    (version / "dataset_info.json").write_text(json.dumps(dict(info, fileFormat="tfrecord")))
    return dest


def _damaged_copy(tfds_dir: Path, dest: Path) -> Path:
    """A copy of the built WikiMIA whose ArrayRecord file is cut short (a copy interrupted, a full disk)."""
    shutil.copytree(tfds_dir / "wikimia", dest / "wikimia")
    shard = dest / "wikimia" / "length32" / "1.0.0" / "wikimia-train.array_record-00000-of-00001"
    shard.write_bytes(shard.read_bytes()[:50_000])
    return dest


@pytest.mark.parametrize("what, spec, extra, needle", [
    ("unknown name", "tfds:no_such_set", [], "no TFDS dataset 'no_such_set'"),
    ("missing config", "tfds:wikimia/length64", [], "no config 'length64'"),
    ("missing split", "tfds:wikimia/length32:test", [], "no split 'test'"),
    ("feature not text", "tfds:wikimia/length32", ["--text-field", "label"], "not text"),
    ("missing feature", "tfds:wikimia/length32", ["--label-field", "member"], "no feature 'member'"),
    ("not a TFDS folder", "tfds:wikimia/length32", ["--data-dir", "{plain}"], "is not a TFDS data folder"),
    ("TFRecord", "tfds:wikimia/length32", ["--data-dir", "{tfrecord}"], "stored as tfrecord"),
    ("damaged file", "tfds:wikimia/length32", ["--data-dir", "{damaged}"], "damaged: rebuild it"),
    ("bad spec", "tfds:Wiki MIA", [], "not a TFDS dataset spec"),
])
def test_bad_tfds_input_is_one_line_and_writes_nothing(what, spec, extra, needle, tfds_dir, tmp_path, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("not a dataset")
    folders = {"plain": str(plain), "tfrecord": str(_tfrecord_copy(tfds_dir, tmp_path / "tf")),
               "damaged": str(_damaged_copy(tfds_dir, tmp_path / "cut"))}
    extra = [e.format(**folders) for e in extra]
    argv = ["eval", "--model", "unused", "--data", spec, "--methods", "loss", "--out", str(tmp_path / "out")]
    argv += extra if "--data-dir" in extra else ["--data-dir", str(tfds_dir), *extra]
    before, built = snapshot(tmp_path), snapshot(tfds_dir)
    capsys.readouterr()
    assert_clean_error(main(argv), capsys.readouterr().err, needle)
    assert snapshot(tmp_path) == before and snapshot(tfds_dir) == built, f"{what}: something was written"


def test_bad_build_is_one_line_and_writes_nothing(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [(["mimir", "--source", str(empty)], "MIMIR ngram_7_0.2 not found"),
             (["wikimia", "--config", "length33"], "no config 'length33'"),
             (["no_such_set"], "invalid choice"),
             (["wikimia", "--source", str(empty)], "--source is for mimir")]
    for args, needle in cases:
        before = snapshot(tmp_path)
        capsys.readouterr()
        rc = main(["datasets", "build", *args, "--data-dir", str(tmp_path / "tfds"), "--no-progress"])
        assert_clean_error(rc, capsys.readouterr().err, needle)
        assert snapshot(tmp_path) == before, args


def test_contamination_files_are_the_studys(tmp_path):
    """The contamination builder reads the files the study reads (train/data, found without importing train) and
    the package's Pile sample."""
    assert (builders.train_data_dir() / "downstream" / "boolq_validation.jsonl").is_file()
    assert builders.Contamination(config="pile", data_dir=str(tmp_path)).path() == corpora.PILE_SAMPLE
    assert set(builders.configs("contamination")) == {"boolq", "commonsenseqa", "truthfulqa", "imdb", "news", "pile"}


class TfdsTestBooks(builders.Bundled):
    """Books as audit-books reads them (title, text, label), for the TFDS path of --books / --validation."""

    def _features(self) -> dict:
        return {"title": tfds.features.Text(), "text": tfds.features.Text(), "label": np.int64}

    def _rows(self):
        for i in range(4):
            yield {"title": f"book {i}", "text": " ".join(f"w{i}x{j}" for j in range(300)), "label": i % 2}


def test_audit_books_reads_books_from_tfds(tmp_path, capsys):
    TfdsTestBooks(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    cfg = books.BooksConfig(snippets=2, snippet_words=50)
    plan, val, files = books.prepare("tfds:tfds_test_books", "tfds:tfds_test_books", cfg, data_dir=tmp_path)
    assert [b.title for b in plan.books] == [f"book {i}" for i in range(4)]
    assert [b.label for b in val.books] == [0, 1] * 2
    assert any(f.endswith("tfds_test_books-train.array_record-00000-of-00001") for f in files)
    before = snapshot(tmp_path)
    capsys.readouterr()
    rc = main(["audit-books", "--books", "tfds:no_books", "--data-dir", str(tmp_path), "--model", "unused",
               "--threshold", "0", "--out", str(tmp_path / "out")])
    assert_clean_error(rc, capsys.readouterr().err, "no TFDS dataset 'no_books'")
    assert snapshot(tmp_path) == before


class TfdsTestBoth(builders.Bundled):
    """Records with both a text and an input feature: no default text feature."""

    def _features(self) -> dict:
        return {"text": tfds.features.Text(), "input": tfds.features.Text(), "label": np.int64}

    def _rows(self):
        for i in range(12):
            yield {"text": f"text {i}", "input": f"input {i}", "label": i % 2}


def test_text_feature_default_is_the_same_in_memory_and_streamed(tmp_path):
    """A split with both `text` and `input` needs --text-field, whether it is read whole or streamed (one rule,
    data.default_text_field); a named feature is read by both readers alike."""
    TfdsTestBoth(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    with pytest.raises(UserError, match=r"has both a 'text' and an 'input' feature \(features: "):
        tfds_source.load("tfds:tfds_test_both", tmp_path)
    with pytest.raises(UserError, match=r"has both a 'text' and an 'input' feature \(features: "):
        stream.TextStream("tfds:tfds_test_both", data_dir=tmp_path)
    whole = tfds_source.load("tfds:tfds_test_both", tmp_path, text_field="input")
    streamed = stream.TextStream("tfds:tfds_test_both", "input", data_dir=tmp_path)
    assert [t for t, _ in streamed.rows()] == whole.texts == [f"input {i}" for i in range(12)]
