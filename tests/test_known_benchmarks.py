"""The known-membership benchmarks (mia_jax.data.known, --benchmark mimir --split / wikimia-24 / wikimia-25 /
olmomia): each reader on its fixture in the real format (tests/fixtures/known, made by make_fixtures.py), checked
against an independent read of the files (texts, 0/1 labels, SHA-256 of every file); `mia-jax eval` end to end on the
tiny model with the blind baseline and the benchmark's caveat in the report; and bad files: exit 2, one line, no
traceback, nothing written."""
import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_clean_error, snapshot

from mia_jax import benchmarks
from mia_jax.cli import main
from mia_jax.data import known
from mia_jax.errors import UserError

FIX = Path(__file__).parent / "fixtures" / "known"
HUB = FIX / "mimir_hub" / "cache_100_200_1000_512"
W24 = FIX / "wikimia24" / "data" / "WikiMIA_length32-00000-of-00001.parquet"


def jsonl(path) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def expected(files) -> tuple[list, list]:
    """Texts and labels read straight from the fixture ``files`` (members then non-members for MIMIR's pairs)."""
    texts, labels = [], []
    for path, label in files:
        if path.suffix == ".parquet":
            table = pq.read_table(path).to_pydict()
            texts += table["input"]
            labels += table["label"]
        elif label is None:
            rows = jsonl(path)
            texts += [r["input"] for r in rows]
            labels += [r["label"] for r in rows]
        else:
            rows = jsonl(path)
            texts += rows
            labels += [label] * len(rows)
    return texts, labels


READERS = {  # name -> (load, the files it must read, with the label of each MIMIR file)
    "mimir local": (lambda: known.mimir("github", "ngram_13_0.8", FIX / "mimir_local"),
                    [(FIX / "mimir_local/ngram_13_0.8/members/github.jsonl", 1),
                     (FIX / "mimir_local/ngram_13_0.8/nonmembers/github.jsonl", 0)]),
    "mimir hub": (lambda: known.mimir("wikipedia_en", "ngram_13_0.8", FIX / "mimir_hub"),
                  [(HUB / "train/wikipedia_(en)_ngram_13_0.8.jsonl", 1),
                   (HUB / "test/wikipedia_(en)_ngram_13_0.8.jsonl", 0)]),
    "wikimia-24": (lambda: known.wikimia_new("wikimia-24", 32, FIX / "wikimia24"), [(W24, None)]),
    "wikimia-25": (lambda: known.wikimia_new("wikimia-25", 32, FIX / "wikimia25"),
                   [(FIX / "wikimia25/data/WikiMIA_length32-00000-of-00001.parquet", None)]),
    "olmomia random": (lambda: known.olmomia("random", None, FIX / "olmomia"),
                       [(FIX / "olmomia/OLMo-7B_64_20.jsonl", None)]),
    "olmomia hard": (lambda: known.olmomia("hard", 64, FIX / "olmomia"),
                     [(FIX / "olmomia/OLMo-7B_64_20_hard.jsonl", None)]),
}


@pytest.mark.parametrize("name", READERS)
def test_reader_on_its_fixture(name):
    load, files = READERS[name]
    ds = load()
    texts, labels = expected(files)
    assert ds.texts == texts and ds.labels == labels
    assert sorted(ds.labels) == [0] * 10 + [1] * 10
    assert ds.files == {str(path): sha(path) for path, _ in files}


def test_caveats_and_layouts():
    """GitHub (and only GitHub) of MIMIR is flagged; the split folder itself and the Hub's cache folder are accepted
    as --data-dir; the default ngram_7_0.2 keeps its name."""
    assert "GitHub" in known.mimir("github", "ngram_13_0.8", FIX / "mimir_local").caveats[0]
    assert known.mimir("wikipedia_en", "ngram_13_0.8", FIX / "mimir_hub").caveats == []
    assert len(known.mimir("github", "ngram_13_0.8", FIX / "mimir_local" / "ngram_13_0.8")) == 20
    assert known.mimir("wikipedia_en", "ngram_13_0.8", HUB).name == "mimir-wikipedia_en-ngram_13_0.8"
    assert "March - December 2024" in known.wikimia_new("wikimia-24", 32, FIX / "wikimia24").caveats[0]
    assert {"wikimia-24", "wikimia-25", "olmomia"} <= set(benchmarks.BENCHMARKS)
    assert {"split", "difficulty", "length"} <= set(benchmarks.option_dests())


def test_save_to_disk_arrow_layout(tmp_path):
    """The WikiMIA-24 authors' own copy (datasets' save_to_disk: <split>/data-00000-of-00001.arrow) reads the same."""
    table = pq.read_table(W24)
    (tmp_path / "WikiMIA_length32").mkdir()
    with pa.OSFile(str(tmp_path / "WikiMIA_length32" / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    ds = known.wikimia_new("wikimia-24", 32, tmp_path)
    assert ds.texts == table.column("input").to_pylist() and ds.labels == table.column("label").to_pylist()


EVALS = {
    "mimir": (["--benchmark", "mimir", "--split", "ngram_13_0.8", "--domain", "github"], FIX / "mimir_local", "GitHub"),
    "wikimia-24": (["--benchmark", "wikimia-24", "--length", "32"], FIX / "wikimia24", "March - December 2024"),
    "wikimia-25": (["--benchmark", "wikimia-25"], FIX / "wikimia25", "WikiMIA-25"),
    "olmomia": (["--benchmark", "olmomia", "--difficulty", "hard"], FIX / "olmomia", "steps 100k-400k"),
}


@pytest.mark.parametrize("name", EVALS)
def test_eval_end_to_end(name, tiny_llama_dir, tmp_path, capsys):
    argv, folder, caveat = EVALS[name]
    out = tmp_path / "run"
    assert main(["eval", *argv, "--data-dir", str(folder), "--model", str(tiny_llama_dir), "--methods", "loss",
                 "--limit", "20", "--n-bootstrap", "10", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["loss"]["n_scored"] == 20
    md = (out / "summary.md").read_text()
    assert "Blind baseline (blind_bow" in md and "Blind baseline (blind_bow" in printed
    assert caveat in md and caveat in printed
    run = json.loads((out / "run.json").read_text())
    assert run["blind_baseline"]["auroc"] is not None
    assert run["data"]["files"] and all(sha(p) == h for p, h in run["data"]["files"].items())


def parquet(columns: dict):
    """A maker: a WikiMIA-24/25 folder whose length-32 shard holds ``columns``."""
    def make(tmp):
        path = tmp / "w" / "data" / W24.name
        path.parent.mkdir(parents=True)
        pq.write_table(pa.table(columns), path)
        return tmp / "w"
    return make


def corrupt_parquet(tmp):
    path = tmp / "w" / "data" / W24.name
    path.parent.mkdir(parents=True)
    path.write_bytes(W24.read_bytes()[:300])  # cut: the footer is gone
    return tmp / "w"


def empty_mimir_file(tmp):
    folder = shutil.copytree(FIX / "mimir_local", tmp / "m")
    (folder / "ngram_13_0.8" / "members" / "github.jsonl").write_text("")
    return folder


def olmomia_rows(text: str):
    """A maker: an OLMoMIA folder whose one pool file holds ``text``."""
    def make(tmp):
        (tmp / "o").mkdir()
        (tmp / "o" / "OLMo-7B_64_2.jsonl").write_text(text)
        return tmp / "o"
    return make


def two_olmomia_pools(tmp):
    folder = shutil.copytree(FIX / "olmomia", tmp / "o")
    shutil.copy(folder / "OLMo-7B_64_20.jsonl", folder / "OLMo-7B_128_20.jsonl")
    return folder


def fixture(*parts):
    return lambda tmp: FIX.joinpath(*parts)


MIMIR_13 = ["--benchmark", "mimir", "--split", "ngram_13_0.8", "--domain", "github"]
BAD = {  # name -> (the benchmark's arguments, a maker of its --data-dir from tmp_path, words of the message)
    "missing dir": (["--benchmark", "wikimia-24"], lambda tmp: tmp / "nowhere", ["--data-dir", "nowhere"]),
    "no data dir": (["--benchmark", "olmomia"], None, ["OLMoMIA", "--data-dir"]),
    "wrong columns": (["--benchmark", "wikimia-24"], parquet({"text": ["a", "b"], "label": [0, 1]}),
                      ["column 'input'"]),
    "label 2": (["--benchmark", "wikimia-25"], parquet({"input": ["a", "b"], "label": [1, 2]}), ["label 2"]),
    "string labels": (["--benchmark", "wikimia-24"], parquet({"input": ["a"], "label": ["1"]}), ["expected string"]),
    "corrupt parquet": (["--benchmark", "wikimia-24"], corrupt_parquet, ["cannot read it as Parquet"]),
    "empty split": (["--benchmark", "wikimia-24"], parquet({"input": pa.array([], pa.string()),
                                                            "label": pa.array([], pa.int64())}), ["has no rows"]),
    "one class": (["--benchmark", "wikimia-24"], parquet({"input": ["a", "b"], "label": [1, 1]}), ["only members"]),
    "no such length": (["--benchmark", "wikimia-25", "--length", "256"], fixture("wikimia25"), ["32, 64, 128"]),
    "split not there": (MIMIR_13[:3] + ["ngram_13_0.2"] + MIMIR_13[4:], fixture("mimir_local"),
                        ["ngram_13_0.2 not found"]),
    "wrong split folder": (MIMIR_13[:3] + ["ngram_7_0.2"] + MIMIR_13[4:], fixture("mimir_local", "ngram_13_0.8"),
                           ["is the ngram_13_0.8 split"]),
    "empty mimir file": (MIMIR_13, empty_mimir_file, ["github.jsonl: no rows"]),
    "olmomia fields": (["--benchmark", "olmomia"], olmomia_rows('{"text": "a", "member": 1}\n'),
                       ["expected input and label"]),
    "olmomia label 3": (["--benchmark", "olmomia"], olmomia_rows('{"input": "a", "label": 3}\n'), ["label 3"]),
    "olmomia no file": (["--benchmark", "olmomia", "--difficulty", "easy"], fixture("olmomia"), ["no easy file"]),
    "olmomia two files": (["--benchmark", "olmomia"], two_olmomia_pools, ["several random files", "--length"]),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_files_exit_2_and_write_nothing(name, tiny_llama_dir, tmp_path, capsys):
    args, make, needles = BAD[name]
    folder = make(tmp_path) if make else None
    before = snapshot(tmp_path)
    out = tmp_path / "run"
    argv = ["eval", *args, "--model", str(tiny_llama_dir), "--methods", "loss", "--no-progress", "--out", str(out)]
    rc = main(argv + (["--data-dir", str(folder)] if folder else []))
    assert_clean_error(rc, capsys.readouterr().err, *needles)
    assert not out.exists() and snapshot(tmp_path) == before


def test_library_errors_name_the_problem(tmp_path):
    with pytest.raises(UserError, match="unknown MIMIR split 'ngram_5'"):
        known.mimir("github", "ngram_5", FIX / "mimir_local")
    with pytest.raises(UserError, match="unknown OLMoMIA setting"):
        known.olmomia("mix", None, FIX / "olmomia")
    with pytest.raises(UserError, match="no WikiMIA_length64 files"):
        known.wikimia_new("wikimia-24", 64, FIX / "wikimia24")


def test_mimir_in_the_flat_layout_and_its_errors(tmp_path):
    """A folder holding members/ and nonmembers/ of bare JSON strings (the local split folder given itself) reads
    members first; an unknown domain, a missing folder and an empty members file are named."""
    for split, rows in (("members", ["def f(): pass", "import os"]), ("nonmembers", ["x = 1"])):
        (tmp_path / split).mkdir()
        (tmp_path / split / "github.jsonl").write_text("".join(json.dumps(t) + "\n" for t in rows))
    ds = known.mimir("github", root=tmp_path)
    assert ds.texts == ["def f(): pass", "import os", "x = 1"] and ds.labels == [1, 1, 0]
    assert ds.name == "mimir-github" and len(ds.files) == 2
    with pytest.raises(UserError, match="unknown MIMIR domain 'gitlab'"):
        known.mimir("gitlab", root=tmp_path)
    with pytest.raises(UserError, match="MIMIR ngram_7_0.2 not found"):
        known.mimir("github", root=tmp_path / "nowhere")
    (tmp_path / "members" / "arxiv.jsonl").write_text("")
    (tmp_path / "nonmembers" / "arxiv.jsonl").write_text('"text"\n')
    with pytest.raises(UserError, match="arxiv.jsonl: no rows"):
        known.mimir("arxiv", root=tmp_path)


def test_real_mimir_if_present():
    try:
        known.mimir_files("dm_mathematics")
    except UserError:
        pytest.skip("../shared/data/mimir not beside the checkout")
    ds = known.mimir("dm_mathematics")
    assert (len(ds), sum(ds.labels)) == (1089, 1000)
