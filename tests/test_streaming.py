"""Streaming scoring (mia_jax.data.stream, mia_jax.engine.shards): every input format read in its row / row-group order
with the texts, labels, digest and duplicate report of the in-memory reader; the reader and the scorer never hold more
than a window of texts (counted); a streamed eval writes what the in-memory eval writes; a streamed `score` killed
with SIGKILL once some shards exist resumes from every finished shard (counted from its run.json and its log) and
ends byte-identical to an uninterrupted run."""
import json
import random
import signal

import numpy as np
import pytest
from helpers import assert_clean_error, start, stderr_of, wait_for

from mia_jax import data
from mia_jax.engine import runner
from mia_jax.cli import main
from mia_jax.commands import scoring
from mia_jax.data import stream
from mia_jax.data.sample import stratified_sample
from mia_jax.runs.fingerprint import texts_sha256

WORDS = ("the river city old stone bridge north market winter light paper garden music station quiet "
         "harbour engine letter field morning").split()


def rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` labeled rows of varied lengths, with exact duplicates (one with the other label) and an empty text."""
    rng = random.Random(seed)
    out = [{"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))), "label": i % 2} for i in range(n)]
    out[5] = dict(out[2])  # a duplicate with the same label
    out[9] = dict(out[4], label=1 - out[4]["label"])  # a conflicting duplicate
    out[11]["text"] = " "  # skipped by the runner, kept by the reader
    return out


def write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream")
    recs = rows(61)
    paths = {"jsonl": write(folder / "c.jsonl", recs)}
    csv = folder / "c.csv"
    csv.write_text("text,label\n" + "".join(f'"{r["text"]}",{r["label"]}\n' for r in recs))
    paths["csv"] = csv
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist(recs), folder / "c.parquet", row_group_size=7)
    paths["parquet"] = folder / "c.parquet"
    return recs, paths


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_each_format_streams_the_in_memory_texts_in_order(corpus, fmt):
    recs, paths = corpus
    ds = data.load_records(paths[fmt])
    s = stream.TextStream(paths[fmt])
    got = list(s.windows(8))
    assert [first for first, _, _ in got] == list(range(0, 61, 8))
    assert [t for _, texts, _ in got for t in texts] == ds.texts == [r["text"] for r in recs]
    assert [y for _, _, labels in got for y in labels] == ds.labels
    assert s.max_held == 8  # never more than a window of texts at once
    tail = list(stream.TextStream(paths[fmt]).windows(8, start=48))
    assert [(first, texts) for first, texts, _ in tail] == [(48, ds.texts[48:56]), (56, ds.texts[56:])]
    scan = stream.TextStream(paths[fmt], limit=50).scan()
    assert scan.n == 50 and scan.labels.tolist() == ds.labels[:50]
    assert scan.texts_sha256 == texts_sha256(ds.texts[:50], ds.labels[:50])  # the in-memory fingerprint's digest
    assert scan.duplicates == data.duplicate_report(ds.texts[:50], ds.labels[:50])
    assert scan.duplicates["n_duplicate_texts"] == 2 and scan.duplicates["n_conflicting_texts"] == 1
    unlabeled = stream.TextStream(paths[fmt], label_field=None).scan()
    assert unlabeled.labels is None and unlabeled.texts_sha256 == texts_sha256(ds.texts, None)
    assert scan.texts is None and unlabeled.texts is None  # nothing kept by default
    small = stream.TextStream(paths[fmt])
    assert small.dataset(small.scan(keep=61)) == ds  # an input that fits: kept, the Dataset data.load reads
    big = stream.TextStream(paths[fmt])
    assert big.scan(keep=60).texts is None and big.max_held == 60  # one text too many: dropped, never above keep


def test_parquet_is_read_one_row_group_at_a_time(corpus, monkeypatch):
    pq = pytest.importorskip("pyarrow.parquet")
    read = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", lambda self, g, *a, **k: read.append(g) or real(self, g))
    got = [t for _, t in data.parquet_rows(corpus[1]["parquet"], start=15)]
    assert read == list(range(2, 9))  # groups of 7 rows: 0 and 1 lie before row 15 and are never read
    assert [r["text"] for r in got] == [r["text"] for r in corpus[0][15:]]


def test_streamed_eval_holds_a_window_and_writes_what_the_in_memory_eval_writes(tiny_llama_dir, corpus, tmp_path,
                                                                                monkeypatch, capsys):
    path = corpus[1]["jsonl"]
    argv = ["eval", "--model", str(tiny_llama_dir), "--data", str(path), "--methods", "loss", "zlib", "min_k",
            "--tokens-per-batch", "128", "--n-bootstrap", "20", "--no-progress", "--no-blind"]
    assert main(argv + ["--out", str(tmp_path / "memory")]) == 0
    held, opened = [], []
    real_score, real_open = runner.score_texts, scoring.open_stream
    monkeypatch.setattr(runner, "score_texts", lambda loaded, texts, *a, **k: held.append(len(texts)) or
                        real_score(loaded, texts, *a, **k))
    monkeypatch.setattr(scoring, "open_stream", lambda *a: opened.append(real_open(*a)) or opened[-1])
    assert main(argv + ["--out", str(tmp_path / "streamed"), "--stream-window", "16"]) == 0
    assert held == [16, 16, 16, 13] and opened[0].stream.max_held == 16  # counted: never more than a window
    streamed, memory = tmp_path / "streamed", tmp_path / "memory"
    index = json.loads((streamed / "passes" / "main" / "index.json").read_text())
    assert [(s["first"], s["last"]) for s in index["shards"]] == [(0, 15), (16, 31), (32, 47), (48, 60)]
    # the same records, up to float32 rounding (each window is packed into its own rows)
    got, want = ([json.loads(line) for line in (d / "results.jsonl").open()] for d in (streamed, memory))
    assert [dict(r, scores=None) for r in got] == [dict(r, scores=None) for r in want]
    for m in ("loss", "zlib", "min_k@0.2"):
        a, b = (np.array([np.nan if r["scores"][m] is None else r["scores"][m] for r in recs]) for recs in (got, want))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    got, want = (json.loads((d / "summary.json").read_text()) for d in (streamed, memory))
    for m in ("loss", "zlib", "min_k@0.2"):
        assert got[m]["auroc"] == pytest.approx(want[m]["auroc"], abs=1e-3) and got[m]["n"] == want[m]["n"]
    run = json.loads((streamed / "run.json").read_text())
    assert run["duplicates"] == json.loads((memory / "run.json").read_text())["duplicates"]
    assert run["passes"]["main"]["shards"] == 4 and run["n_skipped"] == 1


def test_an_input_that_fits_one_window_is_read_once(tiny_llama_dir, corpus, tmp_path, monkeypatch, capsys):
    """eval on a file of no more than --stream-window texts reads it once (the first pass keeps the texts), not a
    scan and then a load; the run is the in-memory run (same results and fingerprint as an older read)."""
    path = corpus[1]["jsonl"]
    real_read, reads = data.read_rows, []
    monkeypatch.setattr(data, "read_rows", lambda *a, **k: reads.append(a[0]) or real_read(*a, **k))
    argv = ["eval", "--model", str(tiny_llama_dir), "--data", str(path), "--methods", "loss", "--tokens-per-batch",
            "128", "--n-bootstrap", "20", "--no-progress", "--no-blind", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    assert reads == [path]
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    ds = data.load_records(path)
    assert "passes" not in run or "shards" not in run["passes"].get("main", {})
    assert len([json.loads(line) for line in (tmp_path / "run" / "results.jsonl").open()]) == len(ds.texts)


def test_streamed_score_killed_resumes_from_its_finished_shards(tiny_llama_dir, tmp_path, capsys):
    recs = rows(900, seed=1)
    path = write(tmp_path / "corpus.jsonl", [{"text": r["text"]} for r in recs])
    argv = ["score", "--model", str(tiny_llama_dir), "--data", str(path), "--methods", "loss", "min_k_pp",
            "--tokens-per-batch", "128", "--no-progress", "--stream-window", "16"]
    reference, out = tmp_path / "reference", tmp_path / "run"
    assert main(argv + ["--out", str(reference)]) == 0
    index = out / "passes" / "main" / "index.json"

    def shards_done() -> int:
        try:
            return len(json.loads(index.read_text())["shards"])
        except (OSError, ValueError):
            return 0

    proc = start(["-m", "mia_jax.cli", *argv, "--out", str(out)])
    wait_for(proc, lambda: shards_done() >= 3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    err = stderr_of(proc)
    done = shards_done()
    assert proc.returncode == -signal.SIGKILL and 3 <= done < 57, err
    assert not (out / "results.jsonl").exists()

    capsys.readouterr()
    assert main(argv + ["--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"resuming from {out / 'passes' / 'main'}: {done} of 57 shards finished ({16 * done} of 900 texts)" in err
    main_pass = json.loads((out / "run.json").read_text())["passes"]["main"]
    assert main_pass["shards"] == 57 and main_pass["shards_reused"] == done  # every finished shard reused
    assert main_pass["reused"] + main_pass["computed"] + main_pass["skipped"] == 900
    assert main_pass["reused"] >= 16 * done - 1  # (text 11, empty, is skipped)
    assert not list((out / "passes" / "main").glob("*.partial.jsonl")) and not list(out.rglob("*.tmp"))
    for name in ["results.jsonl", "passes/main/index.json", *(f"passes/main/{k:05d}.jsonl" for k in range(57))]:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def test_tfds_streams_the_jsonl_texts(tmp_path, capsys):
    pytest.importorskip("tensorflow_datasets")
    assert main(["datasets", "build", "wikimia", "--config", "length32", "--data-dir", str(tmp_path),
                 "--no-progress"]) == 0
    s = stream.TextStream("tfds:wikimia/length32", data_dir=tmp_path)
    ds = data.wikimia(32)
    got = list(s.windows(100, start=200))
    assert [first for first, _, _ in got] == list(range(200, len(ds), 100)) and s.max_held == 100
    assert [t for _, texts, _ in got for t in texts] == ds.texts[200:]
    assert [y for _, _, labels in got for y in labels] == ds.labels[200:]
    scan = stream.TextStream("tfds:wikimia/length32", data_dir=tmp_path).scan()
    assert scan.texts_sha256 == texts_sha256(ds.texts, ds.labels) and s.text_field == "input"


def test_a_multi_pass_run_says_it_holds_every_text(tiny_llama_dir, corpus, tmp_path, capsys):
    assert main(["score", "--model", str(tiny_llama_dir), "--data", str(corpus[1]["jsonl"]), "--methods", "lowercase",
                 "--limit", "20", "--stream-window", "16", "--tokens-per-batch", "128", "--no-progress",
                 "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert ("note: 20 texts held in memory, not streamed (--stream-window 16): multi-pass methods (lowercase) take "
            "the in-memory path") in err
    assert (tmp_path / "run" / "passes" / "main.jsonl").exists() and not (tmp_path / "run" / "passes" / "main").exists()


def test_a_bad_row_past_the_first_window_is_refused_before_anything_is_written(tiny_llama_dir, tmp_path, capsys):
    recs = rows(40)
    recs[33]["label"] = 7
    path = write(tmp_path / "bad.jsonl", recs)
    out = tmp_path / "run"
    rc = main(["eval", "--model", str(tiny_llama_dir), "--data", str(path), "--stream-window", "16", "--out", str(out)])
    assert_clean_error(rc, capsys.readouterr().err, "row 34 has label 7")
    assert not out.exists()


def test_the_blind_baseline_of_a_streamed_corpus_larger_than_its_bound_reads_a_stratified_sample(
        tiny_llama_dir, tmp_path, monkeypatch, capsys):
    """Above ``blind.SAMPLE_MAX`` texts (40 here) a streamed eval's blind baseline reads a seeded sample of that many
    texts, each label in its share, and says so (its size in the line and in run.json); the texts it reads are the
    sample's alone, counted."""
    from sklearn.metrics import roc_auc_score

    from mia_jax.evaluation import blind
    from mia_jax.commands import scoring_report

    recs = rows(101, seed=3)
    path = write(tmp_path / "c.jsonl", recs)
    monkeypatch.setattr(blind, "SAMPLE_MAX", 40)
    monkeypatch.setattr(blind, "CHILD_MIN_TEXTS", 10**9)  # in this process: the scores below are seen
    seen = {}
    real = blind.blind_bow_scores
    monkeypatch.setattr(blind, "blind_bow_scores", lambda texts, labels, **k: seen.update(texts=texts, labels=labels)
                        or real(texts, labels, **k))
    assert scoring_report.blind is blind
    out = tmp_path / "run"
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(path), "--methods", "loss", "--n-bootstrap",
                 "20", "--no-progress", "--stream-window", "16", "--out", str(out)]) == 0
    keep = stratified_sample([r["label"] for r in recs], 40, seed=0)
    assert seen["texts"] == [recs[i]["text"] for i in keep] and len(seen["texts"]) == 40
    members = sum(r["label"] for r in recs)
    assert members == 49 and sum(seen["labels"]) == 19  # 49 members of 101: 19.4 of 40, the nearer whole share
    run = json.loads((out / "run.json").read_text())["blind_baseline"]
    assert run["sample"] == {"n": 40, "of": 101, "seed": 0}
    assert run["auroc"] == pytest.approx(roc_auc_score(seen["labels"], real(seen["texts"], seen["labels"], seed=0)))
    assert "no model; a seeded sample of 40 of 101 texts, stratified by label): AUROC" in capsys.readouterr().out


def test_stratified_sample_is_seeded_proportional_and_every_index_below_its_bound():

    labels = [1] * 700 + [0] * 300
    a, b = stratified_sample(labels, 100, seed=1), stratified_sample(labels, 100, seed=1)
    assert np.array_equal(a, b) and len(a) == 100 and len(set(a.tolist())) == 100 and list(a) == sorted(a)
    assert sum(labels[i] for i in a) == 70
    assert not np.array_equal(a, stratified_sample(labels, 100, seed=2))
    assert np.array_equal(stratified_sample(labels[:80], 100), np.arange(80))
