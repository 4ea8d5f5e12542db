"""The `neighbor` method: seeded neighbour generators (masked LM, the target model itself), the disk cache,
identical neighbours dropped and counted, the score as loss(text) - mean loss(neighbours) from the same
runner, and `mia-jax eval --methods neighbor` end to end."""
import json
import re

import numpy as np
import pytest
from helpers import ctrl_c_at_batch, write_tiny_mlm

from mia_jax.evaluation import metrics
from mia_jax import models
from mia_jax.engine import runner
from mia_jax.cli import main
from mia_jax.data import wikimia
from mia_jax.methods.neighbors import MLMNeighbors, SelfNeighbors, cached_neighbors, drop_identical, n_replaced
from mia_jax.scorers import MULTI_PASS

DS = wikimia(32)
TEXTS = DS.texts[:3] + ["(Short) text, with punctuation!"]


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def self_gen(tiny):
    return SelfNeighbors(tiny, n=3, seed=0)


@pytest.fixture(scope="module", params=["bert", "roberta"])
def mlm_gen(request, tmp_path_factory):
    return MLMNeighbors(str(write_tiny_mlm(tmp_path_factory.mktemp(request.param), request.param)), n=3, seed=0)


def loss_of(loaded, texts):
    return metrics.scores_by_method(runner.score_texts(loaded, texts, ["loss"], progress=False), ["loss"])["loss"]


def check_neighbours(texts, neighbours, n, frac):
    """n per text; each keeps the word count and the whitespace byte for byte, and differs in 1..round(frac*words)
    words (or is identical to the text)."""
    assert len(neighbours) == len(texts)
    changed = 0
    for text, ns in zip(texts, neighbours):
        assert len(ns) == n
        parts = re.split(r"(\s+)", text)
        for x in ns:
            xp = re.split(r"(\s+)", x)
            assert len(xp) == len(parts) and xp[1::2] == parts[1::2], (text, x)
            diff = sum(a != b for a, b in zip(xp[::2], parts[::2]))
            assert diff <= n_replaced(len(text.split()), frac), (text, x)
            changed += diff >= 1
    assert changed >= len(texts) * n - 2  # nearly every neighbour really differs


def test_self_neighbors_seeded(tiny, self_gen):
    a = self_gen(TEXTS)
    check_neighbours(TEXTS, a, 3, 0.15)
    assert self_gen(TEXTS[::-1])[::-1] == a  # deterministic per text, whatever the batch
    b = SelfNeighbors(tiny, n=3, seed=1)(TEXTS)
    assert b != a
    assert SelfNeighbors(tiny, n=3, seed=0, frac=0.5)(TEXTS[:1])[0] != a[0]


def test_mlm_neighbors_seeded(mlm_gen, tmp_path):
    a = mlm_gen(TEXTS)
    check_neighbours(TEXTS, a, 3, 0.15)
    assert mlm_gen(TEXTS[::-1])[::-1] == a
    other = MLMNeighbors(mlm_gen.info["source"], n=3, seed=5)
    assert other(TEXTS) != a and other.config != mlm_gen.config
    # punctuation around a replaced word stays: only the letters/digits core of a word is masked
    short = TEXTS[3]
    for x in a[3]:
        for old, new in zip(short.split(), x.split()):
            if old != new:
                core = re.search(r"[A-Za-z0-9].*[A-Za-z0-9]|[A-Za-z0-9]", old)
                assert new.startswith(old[: core.start()]) and new.endswith(old[core.end():])


def test_long_text_is_windowed(mlm_gen):
    """Longer than the MLM context (72 positions): windows, and the words past the first window can change."""
    text = " ".join(DS.texts[:6])
    assert len(mlm_gen.tokenizer.encode(text).ids) > mlm_gen.max_length
    (ns,) = MLMNeighbors(mlm_gen.info["source"], n=4, seed=0, mask_frac=0.5)([text])
    check_neighbours([text], [ns], 4, 0.5)


class Stub:
    """A generator returning fixed neighbours (text 0: all identical to the text), counting its calls."""
    name = "stub"
    config = {"generator": "stub"}

    def __init__(self):
        self.calls = 0

    def __call__(self, texts):
        self.calls += len(texts)
        return [[t] * 3 if i == 0 else [t, t + " extra", "Other words here."] for i, t in enumerate(texts)]


def test_identical_neighbours_are_dropped_and_counted(tiny, tmp_path):
    recs = runner.score_dataset(tiny, TEXTS, ["neighbor"], neighbors=Stub(), out_dir=tmp_path, progress=False)
    assert recs[0]["scores"]["neighbor"] is None and "identical" in recs[0]["nan_reasons"]["neighbor"]
    assert [r["n_identical_neighbors"] for r in recs] == [3, 1, 1, 1]
    assert [r["n_neighbors"] for r in recs] == [0, 2, 2, 2]
    by_hand = loss_of(tiny, TEXTS[1:] + [t + " extra" for t in TEXTS[1:]] + ["Other words here."])
    want = by_hand[:3] - (by_hand[3:6] + by_hand[6]) / 2
    np.testing.assert_allclose([r["scores"]["neighbor"] for r in recs[1:]], want, atol=1e-5)  # float32, other batches
    assert len((tmp_path / "passes" / "neighbor.jsonl").read_text().splitlines()) == 6
    kept, counts = drop_identical(["a b"], [["a b", "a c"]])
    assert kept == [["a c"]] and counts == [1]


def test_neighbor_score_is_the_loss_difference(tiny, self_gen, tmp_path):
    recs = runner.score_dataset(tiny, TEXTS, ["loss", "neighbor"], neighbors=self_gen, out_dir=tmp_path,
                                progress=False)
    neigh, counts = drop_identical(TEXTS, self_gen(TEXTS))
    assert [r["n_identical_neighbors"] for r in recs] == counts
    by_hand = loss_of(tiny, TEXTS + [x for ns in neigh for x in ns])
    ends = np.cumsum([len(TEXTS)] + [len(ns) for ns in neigh])
    want = by_hand[:4] - np.array([by_hand[a:b].mean() for a, b in zip(ends[:-1], ends[1:])])
    got = metrics.scores_by_method(recs, ["neighbor"])["neighbor"]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert list(recs[0]["scores"]) == ["loss", "neighbor"]
    assert (tmp_path / "neighbors" / "neighbors.jsonl").exists()


def test_neighbor_pass_interrupted_resumes_from_its_finished_batches(tiny, self_gen, tmp_path):
    counts = {}
    full = runner.score_dataset(tiny, TEXTS, ["loss", "neighbor"], neighbors=self_gen, out_dir=tmp_path / "full",
                                tokens_per_batch=16, progress=False, report=counts)
    # Ctrl-C in the neighbour pass, after the main pass and two neighbour steps
    with ctrl_c_at_batch(counts["main"]["batches_computed"] + 3), pytest.raises(KeyboardInterrupt):
        runner.score_dataset(tiny, TEXTS, ["loss", "neighbor"], neighbors=self_gen, out_dir=tmp_path / "run",
                             tokens_per_batch=16, progress=False)
    kept = len((tmp_path / "run" / "passes" / "neighbor.jsonl").read_text().splitlines())
    assert 2 <= kept < sum(r["n_neighbors"] for r in full)
    report = {}
    again = runner.score_dataset(tiny, TEXTS, ["loss", "neighbor"], neighbors=self_gen, out_dir=tmp_path / "run",
                                 tokens_per_batch=16, resume=True, progress=False, report=report)
    n_neighbours = sum(r["n_neighbors"] for r in full)
    assert report["main"]["reused"] == len(TEXTS) and report["main"]["computed"] == 0
    assert report["neighbor"]["reused"] == kept and report["neighbor"]["computed"] == n_neighbours - kept
    assert report["neighbor"]["batches_computed"] == counts["neighbor"]["batches_computed"] - 2
    assert again == full
    for name in ("results.jsonl", "passes/neighbor.jsonl"):
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()


def test_neighbor_scorer_sign():
    scores, reasons = MULTI_PASS["neighbor"].combine(np.array([-1.0, -3.0, -2.0]), np.array([-2.0, -2.0, np.nan]),
                                                     ["a", "b", "c"])
    assert scores[0] > scores[1] and np.isnan(scores[2]) and list(reasons) == [2]


def test_cache_is_reused(tmp_path):
    gen = Stub()
    first = cached_neighbors(gen, TEXTS, tmp_path)
    assert gen.calls == len(TEXTS)
    assert cached_neighbors(gen, TEXTS, tmp_path) == first and gen.calls == len(TEXTS)  # no generator call
    assert cached_neighbors(gen, TEXTS + ["new text here"], tmp_path)[:4] == first and gen.calls == len(TEXTS) + 1
    with open(tmp_path / "neighbors.jsonl", "a") as f:
        f.write('{"key": "torn')  # an interrupted write is ignored
    other = Stub()
    other.config = {"generator": "stub", "seed": 1}  # another config is another key
    cached_neighbors(other, TEXTS[:2], tmp_path)
    assert other.calls == 2


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_eval_neighbor(tiny_llama_dir, tmp_path, capsys):
    rows = list(zip(DS.texts[:3] + DS.texts[-3:], DS.labels[:3] + DS.labels[-3:]))
    data = write_jsonl(tmp_path / "d.jsonl", [{"input": t, "label": y} for t, y in rows])
    out = tmp_path / "run"
    argv = ["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "loss", "neighbor",
            "--n-neighbors", "3", "--out", str(out), "--n-bootstrap", "20", "--no-progress", "--no-blind"]
    assert main(argv) == 0
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 6 and all(r["n_identical_neighbors"] + r["n_neighbors"] == 3 for r in recs)
    assert all(r["scores"]["neighbor"] is not None for r in recs)
    run = json.loads((out / "run.json").read_text())
    assert run["neighbors"]["config"]["generator"] == "self" and run["neighbors"]["config"]["n"] == 3
    assert run["neighbors"]["n_identical_neighbors"] == sum(r["n_identical_neighbors"] for r in recs)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["neighbor"]["n_identical_neighbors"] == run["neighbors"]["n_identical_neighbors"]
    assert "neighbor" in capsys.readouterr().out
    # another generator is another run: refused, not silently resumed
    assert main(argv + ["--neighbor-seed", "1"]) == 2
    assert "differs in: neighbors" in capsys.readouterr().err


def test_cli_score_with_mlm(tiny_llama_dir, tmp_path):
    mlm = write_tiny_mlm(tmp_path / "bert", "bert")
    data = write_jsonl(tmp_path / "u.jsonl", [{"text": t} for t in TEXTS])
    out = tmp_path / "s"
    assert main(["score", "--model", str(tiny_llama_dir), "--data", str(data), "--text-field", "text", "--methods",
                 "neighbor", "--neighbor-mlm", str(mlm), "--n-neighbors", "2", "--out", str(out),
                 "--no-progress"]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["neighbors"]["name"] == "mlm:bert" and len(run["neighbors"]["config"]["mlm_sha256"]) == 3
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [list(r["scores"]) for r in recs] == [["neighbor"]] * 4
