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
from array_record.python.array_record_module import ArrayRecordReader
from helpers import ENV, REPO, assert_clean_error, snapshot
from tensorflow_datasets.proto import tf_example_pb2

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


def _tampered_copy(tfds_dir: Path, dest: Path, info: str | None = None, **split) -> Path:
    """A copy of the built TFDS folder whose WikiMIA length32 dataset_info.json is ``info`` (text) or has ``split``'s
    fields changed in its split (e.g. shardLengths lowered: the files still hold their 776 rows)."""
    shutil.copytree(tfds_dir, dest)
    path = dest / "wikimia" / "length32" / "1.0.0" / "dataset_info.json"
    if info is None:
        described = json.loads(path.read_text())
        described["splits"][0].update(split)
        info = json.dumps(described, indent=2)
    path.write_text(info)
    return dest


@pytest.mark.parametrize("what, info, split, needles", [
    ("rows dropped", None, {"shardLengths": ["700"]}, ["wikimia-train.array_record-00000-of-00001 holds 776 rows but ",
                                                       "dataset_info.json says 700 (shardLengths)"]),
    ("rows invented", None, {"shardLengths": ["800"]}, ["holds 776 rows but ", "says 800 (shardLengths)"]),
    ("not JSON", "{not json", {}, ["dataset_info.json cannot be read (Expecting property name"]),
    ("not an object", "[]", {}, ["dataset_info.json is not a TFDS dataset description"]),
])
def test_rows_are_counted_in_the_files_not_taken_from_the_description(what, info, split, needles, tfds_dir,
                                                                       tmp_path, capsys):
    """`mia-jax eval --data tfds:...` on a dataset whose dataset_info.json disagrees with its files (TFDS alone scored
    700 of 776 texts, exit 0) or is not JSON: one line naming the file (and both counts), exit 2, nothing written."""
    data_dir = _tampered_copy(tfds_dir, tmp_path / "tfds", info, **split)
    before = snapshot(tmp_path)
    capsys.readouterr()
    rc = main(["eval", "--model", "unused", "--data", "tfds:wikimia/length32", "--data-dir", str(data_dir),
               "--methods", "loss", "--out", str(tmp_path / "out")])
    assert_clean_error(rc, capsys.readouterr().err, *needles)
    assert snapshot(tmp_path) == before, what
    with pytest.raises(UserError, match="rebuild"):  # the streamed reader opens it alike
        stream.TextStream("tfds:wikimia/length32", data_dir=data_dir)


def test_datasets_list_shows_a_broken_dataset_as_broken(tfds_dir, tmp_path, capsys):
    """`datasets list` opens each built config as `--data tfds:` does: a dataset_info.json that is not JSON, or whose
    row counts are not the files', is listed as broken with why, never as built; `datasets build` does not keep it."""
    data_dir = _tampered_copy(tfds_dir, tmp_path / "tfds", "{not json")
    imdb = data_dir / "contamination" / "imdb" / "1.0.0" / "dataset_info.json"
    info = json.loads(imdb.read_text())
    rows = int(info["splits"][0]["shardLengths"][0])
    info["splits"][0]["shardLengths"] = [str(rows - 1)]
    imdb.write_text(json.dumps(info))
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(["datasets", "list", "--data-dir", str(data_dir)]) == 0
    listed = dict(line.split("\t") for line in capsys.readouterr().out.splitlines())
    assert listed["tfds:wikimia/length32"].startswith("broken 1.0.0 (") and "dataset_info.json cannot be read (" \
        in listed["tfds:wikimia/length32"]
    assert listed["tfds:contamination/imdb"].startswith("broken 1.0.0 (") and f"holds {rows} rows but " in \
        listed["tfds:contamination/imdb"] and f"says {rows - 1} (shardLengths)" in listed["tfds:contamination/imdb"]
    assert listed["tfds:contamination/news"] == f"built 1.0.0 in {data_dir}"
    assert listed["tfds:wikimia/length64"] == f"not built in {data_dir}"
    assert not any(state.startswith("built") for spec, state in listed.items() if spec.endswith(("length32", "imdb")))
    rc = main(["datasets", "build", "wikimia", "--config", "length32", "--data-dir", str(data_dir), "--no-progress"])
    assert_clean_error(rc, capsys.readouterr().err, "tfds:wikimia/length32 is built in ", "but cannot be read",
                       "remove ")
    assert snapshot(tmp_path) == before


def test_two_builds_into_one_folder_at_once(tfds_dir, tmp_path, capsys):
    """A real `mia-jax datasets build` held mid-build (after its first row) holds --data-dir: a second build into it
    is refused at once, one line with the first one's PID, exit 2, nothing changed; the first then finishes, and its
    files are the same bytes as the fixture's build."""
    data_dir = tmp_path / "tfds"
    code = ("import sys\nfrom mia_jax.cli import main\nfrom mia_jax.data import builders\n"
            "rows = builders.Wikimia._rows\n"
            "def held(self):\n    for i, row in enumerate(rows(self)):\n        if i == 1:\n"
            "            print('held', flush=True)\n            sys.stdin.readline()\n        yield row\n"
            "builders.Wikimia._rows = held\n"
            "sys.exit(main(['datasets', 'build', 'wikimia', '--config', 'length32', '--data-dir', sys.argv[1], "
            "'--no-progress']))\n")
    first = subprocess.Popen([sys.executable, "-c", code, str(data_dir)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
    try:
        assert first.stdout.readline().strip() == "held", first.stderr.read()
        before = snapshot(data_dir)
        capsys.readouterr()
        rc = main(["datasets", "build", "wikimia", "--config", "length32", "--data-dir", str(data_dir),
                   "--no-progress"])
        assert_clean_error(rc, capsys.readouterr().err, f"{data_dir.absolute()} is in use by another process "
                           f"(PID {first.pid}); wait for it to finish, or use another --data-dir")
        assert snapshot(data_dir) == before
        out, err = first.communicate("\n", timeout=300)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 0 and "Traceback" not in err, err
    assert "tfds:wikimia/length32: 776 rows in " in out
    version = Path("wikimia", "length32", "1.0.0")
    assert _hashes(data_dir / version) == _hashes(tfds_dir / version)
    assert not (data_dir / ".lock").exists() and tfds_source.problem("tfds:wikimia/length32", data_dir, "1.0.0") is None


def _hashes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_same_build_gives_the_same_bytes(tfds_dir, tmp_path):
    """Built in 4 processes (TFDS wrote each example's features in the order of a per-process hash table: another
    SHA-256 about half the time), WikiMIA and two datasets of 6 and 7 features give the same files byte for byte, as
    the fixture's build; every record is its example serialized with its features sorted (by construction)."""
    code = ("import sys\nfrom mia_jax.cli import main\n"
            "assert main(['datasets', 'build', 'wikimia', '--config', 'length32', '--data-dir', sys.argv[1], "
            "'--no-progress']) == 0\n"
            "sys.exit(main(['datasets', 'build', 'contamination', '--config', 'commonsenseqa', 'truthfulqa', "
            "'--data-dir', sys.argv[1], '--no-progress']))\n")
    builds = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"build{i}")], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO) for i in range(4)]
    for b in builds:
        assert b.wait(timeout=300) == 0, b.stderr.read()
    hashes = [_hashes(tmp_path / f"build{i}") for i in range(4)]
    assert len(hashes[0]) == 12 and all(h == hashes[0] for h in hashes[1:])  # 3 configs' files, 2 .config/metadata
    wikimia = Path("wikimia", "length32", "1.0.0")
    assert _hashes(tmp_path / "build0" / wikimia) == _hashes(tfds_dir / wikimia)
    for shard in (tmp_path / "build0").rglob("*.array_record-*"):
        reader = ArrayRecordReader(str(shard))
        records = reader.read_all()
        reader.close()
        assert records and all(tf_example_pb2.Example.FromString(r).SerializeToString(deterministic=True) == r
                               for r in records)


def test_a_file_of_the_split_the_description_does_not_list_is_refused(tfds_dir, tmp_path):
    """A second file of the split beside the one dataset_info.json lists (two builds mixed): refused by name, not
    left unread."""
    data_dir = _tampered_copy(tfds_dir, tmp_path / "tfds")
    version = data_dir / "wikimia" / "length32" / "1.0.0"
    shard = version / "wikimia-train.array_record-00000-of-00001"
    shutil.copy(shard, shard.with_name("wikimia-train.array_record-00001-of-00002"))
    with pytest.raises(UserError, match=r"00001-of-00002 is a file of split train that .*dataset_info.json does not "
                                        r"list \(it lists 1\); rebuild the dataset"):
        tfds_source.TfdsSource("tfds:wikimia/length32", data_dir)
