"""The copyright-trap study (train/traps.py, ``--ablation traps``) end to end on the tiny random model: the trap pool
seeded and of exact lengths and bins, the split stratified and disjoint, each trap inserted exactly 1 / 4 / 16 /
64 times in the training token stream, and the tables and the study rebuilt from the per-example file."""
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from mia_jax import models
from train import contaminate, study, tables, traps
from train.config import load_config
from train.data import separator_id
from train.records import EXAMPLES, read_examples

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "contamination" / "tiny.yaml")
KS = [1, 4, 16, 64]
ARGS = ["corpus.background_tokens=3000", "corpus.occurrence_buckets=[1,4,16,64]", "corpus.traps.per_cell=2",
        "corpus.traps.lengths=[8,12]", "corpus.traps.oversample=2", "corpus.traps.jaccard=0.9", "train.epochs=1",
        "score.n_bootstrap=50", "score.methods=[loss,zlib,min_k,ref]"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One tiny ``--ablation traps`` sweep, checked by the tests below."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MIA_JAX_CACHE", str(tmp_path_factory.mktemp("cache")))
        out = tmp_path_factory.mktemp("traps") / "sweep"
        assert contaminate.main(["--config", TINY, "--out", str(out), "--no-progress", "--ablation", "traps",
                                 *ARGS]) == 0
    return out


def _cfg():
    cfg = load_config(TINY, ARGS)
    cfg.corpus.variant, cfg.corpus.occurrence = "traps", "buckets"
    return cfg


def _pool(run_dir):
    head, *rows = [json.loads(line) for line in (run_dir / "traps" / "traps" / traps.POOL).read_text().splitlines()]
    return head, rows


def test_pool_is_seeded_with_exact_lengths_and_bins(run_dir):
    head, rows = _pool(run_dir)
    loaded = models.load(str(run_dir / "base_model"))
    sep = separator_id(loaded.tokenizer, loaded.eos_token_id)
    again, record = traps.generate_pool(loaded, _cfg().corpus, sep, progress=False)
    assert again == rows and record == head["record"]  # the same seed: the same pool, bit for bit
    for length in (8, 12):
        mine = [r for r in rows if r["length"] == length]
        assert mine
        for r in mine:  # the trap text is exactly `length` tokens as the tokenizer encodes it
            assert len(loaded.tokenizer.encode(r["text"], add_special_tokens=False).ids) == length
        counts = Counter(r["bin"] for r in mine)
        assert set(counts) == {"low", "mid", "high"} and max(counts.values()) - min(counts.values()) <= 1
        ppl = {b: [r["ppl"] for r in mine if r["bin"] == b] for b in counts}
        assert max(ppl["low"]) <= min(ppl["mid"]) and max(ppl["mid"]) <= min(ppl["high"])  # bins by perplexity
    tokens = [set(loaded.tokenizer.encode(r["text"], add_special_tokens=False).ids) for r in rows]
    assert all(len(a & b) / len(a | b) <= 0.9 for i, a in enumerate(tokens) for b in tokens[:i])  # de-duplicated


def test_split_is_stratified_and_disjoint(run_dir):
    ev = [json.loads(line) for line in (run_dir / "traps" / "corpus" / "eval.jsonl").read_text().splitlines()]
    mem = [e for e in ev if e["label"] == 1]
    non = [e for e in ev if e["label"] == 0]
    assert not {e["text"] for e in mem} & {e["text"] for e in non}
    assert not {e["id"] for e in mem} & {e["id"] for e in non}
    strata = {f"{n}/{b}" for n in (8, 12) for b in ("low", "mid", "high")}
    assert Counter(e["stratum"] for e in mem) == Counter(e["stratum"] for e in non) == {s: 8 for s in strata}
    # each stratum: per_cell = 2 members per number of insertions
    assert Counter((e["stratum"], e["occurrences"]) for e in mem) == {(s, k): 2 for s in strata for k in KS}
    assert all(e["occurrences"] == 0 for e in non)


def test_insertion_counts_in_the_token_stream(run_dir):
    """Each member's tokens occur exactly k times in the training stream (documents encoded and joined by the
    separator, as train.data.pack does), each non-member's never."""
    loaded = models.load(str(run_dir / "base_model"))
    sep = separator_id(loaded.tokenizer, loaded.eos_token_id)
    folder = run_dir / "traps" / "corpus"
    docs = [json.loads(line)["text"] for line in (folder / "documents.jsonl").read_text().splitlines()]
    stream = []
    for enc in loaded.tokenizer.encode_batch(docs, add_special_tokens=False):
        stream += [*enc.ids, sep]
    stream = np.array(stream)
    for e in (json.loads(line) for line in (folder / "eval.jsonl").read_text().splitlines()):
        ids = np.array(loaded.tokenizer.encode(e["text"], add_special_tokens=False).ids)
        windows = np.lib.stride_tricks.sliding_window_view(stream, len(ids))
        assert int((windows == ids).all(axis=1).sum()) == e["occurrences"], e["id"]
    assert sorted({e for e in json.loads((folder / "manifest.json").read_text())["datasets"]["traps"]
                   ["occurrences"]}) == KS


def test_tables_rebuild_from_the_per_example_file(run_dir, tmp_path):
    out = run_dir
    assert tables.main(["--from", str(out), "--out", str(tmp_path)]) == 0
    for name in ("traps.md", "traps.csv", "traps.png", "traps/table3.md"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name
    text = (out / "traps.md").read_text()
    assert "**Blind baseline**" in text and "k=64 (12)" in text and "Per (insertions, perplexity bin, length)" in text
    # one cell against a float64 reference: Loss, members inserted 64 times vs every non-member
    rows = read_examples(out / "traps" / EXAMPLES)
    sel = [r for r in rows if r["label"] == 0 or r["occurrences"] == 64]
    want = roc_auc_score([r["label"] for r in sel], np.array([r["trained"]["loss"] for r in sel], np.float64))
    line = next(row for row in text.splitlines() if row.startswith("| Loss |"))
    assert line.split("|")[5].strip().startswith(f"{want:.3f} [")  # columns: method, k=1, 4, 16, 64
    claims_md, header = tmp_path / "study.md", tmp_path / "header.md"
    header.write_text("Made by\n\n```bash\n{command}\n```\n")
    assert study.main(["--traps", str(out), "--header", str(header), "--out", str(claims_md)]) == 0
    report = claims_md.read_text()
    assert report.count("# Copyright traps: AUROC [95% CI] against the number of insertions") == 1  # printed once
    said = report.split("```bash\n")[1].split("\n```")[0].replace(" \\\n    ", " ")  # the header's command, unwrapped
    assert said == f"python -m train.study --traps {out.as_posix()} --header {header.as_posix()} --out {claims_md}"
    names = [c["claim"] for c in json.loads(claims_md.with_suffix(".claims.json").read_text())]
    assert "Traps: Loss AUROC, 64 insertions > 1" in names and "Traps: Min-K% Prob (k=20%) AUROC, 64 insertions > 1" \
        in names
