"""train/corpus.py: stratified, length-matched splits; de-duplication on every field; the 13-gram check; buckets.

The overlap checks here use their own simple implementation (sets of word-tuple 13-grams), not the builder's hashes.
"""
import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from mia_jax.errors import UserError
from train.config import CorpusConfig, load_config
from train.corpus import build_corpus
from train.sources import BUNDLED, DOWNSTREAM_FILES, load_pool, read_rows
from train.split import apportion

STRATIFIED = ("boolq", "commonsenseqa", "imdb")
DATASETS = ("boolq", "commonsenseqa", "imdb", "truthfulqa")


@pytest.fixture(scope="module")
def tok(tiny_llama_dir):
    return Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))


def cfg(**kw) -> CorpusConfig:
    # the real per-dataset sizes of configs/contamination/cpu.yaml, with the occurrence buckets of Figure 5c
    return CorpusConfig(**{"background_tokens": 40000, "n_positives": 100, "n_negatives": 100,
                           "occurrence": "buckets", "occurrence_buckets": [1, 2, 4], **kw})


@pytest.fixture(scope="module")
def corpus(tok):
    return build_corpus(cfg(), tok)


def grams(text: str, n: int = 13) -> set:
    words = text.lower().split()
    return {tuple(words[i: i + n]) for i in range(len(words) - n + 1)}


def side(c, name, label):
    return [r for r in c.eval if r["dataset"] == name and r["label"] == label]


def raw_labels(name: str) -> dict:
    """id -> the dataset's class label, read from the file without the builder's templates."""
    rows = read_rows(name, BUNDLED / "downstream" / DOWNSTREAM_FILES[name])
    if name == "boolq":
        return {str(r["idx"]): "yes" if r["label"] else "no" for r in rows}
    if name == "imdb":
        return {str(r["id"]): "positive" if r["label"] else "negative" for r in rows}
    return {str(r["id"]): r["answerKey"] for r in rows}


# ----------------------------------------------------------------------------- stratification and length


def test_label_shares_within_one_example(corpus):
    for name in STRATIFIED:
        truth = raw_labels(name)
        pos, neg = side(corpus, name, 1), side(corpus, name, 0)
        assert len(pos) == len(neg) == 100
        assert all(r["stratum"] == truth[r["id"]] for r in pos + neg)
        cp, cn = Counter(r["stratum"] for r in pos), Counter(r["stratum"] for r in neg)
        assert len(cp | cn) >= 2
        for s in cp | cn:
            assert abs(cp[s] - cn[s]) <= 1, (name, s, cp, cn)
        strata = corpus.manifest["datasets"][name]["strata"]
        assert {s: (v["members"], v["non_members"]) for s, v in strata.items()} == {s: (cp[s], cn[s]) for s in strata}
        assert corpus.manifest["datasets"][name]["stratified_by"]
    tq = corpus.manifest["datasets"]["truthfulqa"]
    assert tq["stratified_by"] is None and "no class label" in tq["stratification_note"]
    assert {r["stratum"] for r in corpus.eval if r["dataset"] == "truthfulqa"} == {None}


def test_label_shares_follow_the_pool(corpus):
    """Members and non-members alike carry the candidates' label shares (IMDB: 161 of 300 reviews positive)."""
    for name in STRATIFIED:
        pool = Counter(e.stratum for e in load_pool(name, BUNDLED / "downstream" / DOWNSTREAM_FILES[name])[0])
        both = Counter(r["stratum"] for r in corpus.eval if r["dataset"] == name)
        for s in pool:
            assert abs(both[s] / 200 - pool[s] / sum(pool.values())) < 0.03, (name, s)


def test_lengths_matched(corpus):
    for name in DATASETS:
        lp = np.array([len(r["text"]) for r in side(corpus, name, 1)])
        ln = np.array([len(r["text"]) for r in side(corpus, name, 0)])
        assert abs(lp.mean() - ln.mean()) <= 0.10 * ln.mean(), name
        assert abs(np.median(lp) - np.median(ln)) <= 0.15 * np.median(ln), name
        # and quantile by quantile (sorted lengths, side by side)
        assert np.median(np.abs(np.sort(lp) - np.sort(ln)) / np.sort(ln)) < 0.05, name
        rec = corpus.manifest["datasets"][name]
        assert rec["length_chars"]["members"]["mean"] == pytest.approx(lp.mean())
        assert rec["length_chars"]["non_members"]["median"] == pytest.approx(np.median(ln))
        assert rec["length_tokens"]["members"]["mean"] > 0


def testapportion():
    rng = np.random.default_rng(0)
    for _ in range(200):
        weights = rng.integers(0, 50, rng.integers(1, 6)).tolist()
        if sum(weights) == 0:
            continue
        total = int(rng.integers(0, sum(weights) + 1))
        parts = apportion(total, weights, rng)
        assert sum(parts) == total
        for p, w in zip(parts, weights):
            assert 0 <= p <= w and abs(p - total * w / sum(weights)) < 1


# ----------------------------------------------------------------------------- de-duplication and 13-grams


def test_no_shared_13gram_with_members_or_background(corpus):
    background = [d for d, s in zip(corpus.documents, corpus.sources) if s["kind"] == "background"]
    members = [r["text"] for r in corpus.eval if r["label"] == 1]
    seen = set().union(*map(grams, background + members))
    assert len(seen) > 10000  # the check has something to find
    for r in corpus.eval:
        if r["label"] == 0:
            assert not grams(r["text"]) & seen, (r["dataset"], r["id"])
    check = corpus.manifest["overlap_check"]
    assert check["passed"] is True and check["ngram"] == 13
    assert check["max_shared_13grams_with_members"] == check["max_shared_13grams_with_background"] == 0


def test_no_field_value_on_both_sides(corpus):
    for name in DATASETS:
        pool = {e.id: e for e in load_pool(name, BUNDLED / "downstream" / DOWNSTREAM_FILES[name])[0]}
        values = {}
        for label in (0, 1):
            values[label] = {(f, " ".join(str(v).lower().split()))
                             for r in side(corpus, name, label) for f, v in pool[r["id"]].fields.items()}
        assert not values[0] & values[1], name
        assert len({f for f, _ in values[1]}) == len(pool[side(corpus, name, 1)[0]["id"]].fields)
    # TruthfulQA's "I have no comment." is the best answer of many rows: at most one of them is used
    rows = read_rows("truthfulqa", BUNDLED / "downstream" / "truthfulqa.csv")
    no_comment = {r["Question"] for r in rows if r["Best Answer"].strip().lower().rstrip(".") == "i have no comment"}
    assert len(no_comment) > 5
    assert sum(r["id"] in no_comment for r in corpus.eval if r["dataset"] == "truthfulqa") <= 1
    dropped = corpus.manifest["datasets"]["truthfulqa"]["dropped"]
    assert dropped["duplicate_answer"] >= len(no_comment) - 1


def _tqa(path: Path, rows: list[tuple[str, str]]) -> None:
    with open(path / "truthfulqa.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, ["Type", "Category", "Question", "Best Answer", "Source"])
        w.writeheader()
        w.writerows({"Type": "t", "Category": "c", "Question": q, "Best Answer": a, "Source": ""} for q, a in rows)


def test_drops_are_counted(tmp_path, tok):
    words = [f"w{i}" for i in range(5000)]
    rng = np.random.default_rng(1)

    def phrase(n):
        return " ".join(rng.choice(words, n))

    shared = phrase(14)
    in_bg = phrase(13)
    rows = [(f"Question {i}: {phrase(6)}?", f"Answer {i}: {phrase(8)}.") for i in range(30)]
    rows += [(f"Q{i} {phrase(5)}?", "I have no   comment.") for i in range(3)]  # 2 duplicates (normalised)
    rows += [(f"Q{i + 3} {phrase(5)}?", f"Because {shared} ({i}).") for i in range(2)]  # both share a 13-gram
    rows += [("Quoted from the background?", f"It says {in_bg.upper()}")]  # a 13-gram of the background
    _tqa(tmp_path, rows)
    bg = tmp_path / "bg.jsonl"
    bg.write_text("".join(json.dumps({"text": f"{phrase(300)} {in_bg} {phrase(300)} x{i}"}) + "\n" for i in range(60)))
    c = build_corpus(cfg(datasets=["truthfulqa"], data_dir=str(tmp_path), background=[str(bg)], background_tokens=500,
                         n_positives=12, n_negatives=12, occurrence="fixed"), tok)
    d = c.manifest["datasets"]["truthfulqa"]
    assert d["dropped"]["duplicate_answer"] == 2
    assert d["dropped"]["shared_13gram_within_dataset"] == 2
    assert d["dropped"]["in_background"] == 1
    assert d["candidates"] == 31 and d["usable"] == 34
    used = {r["id"] for r in c.eval}
    assert not used & {rows[i][0] for i in (33, 34, 35)}
    # too few candidates: the message says why
    with pytest.raises(UserError, match="only 31 usable examples share no 13-gram"):
        build_corpus(cfg(datasets=["truthfulqa"], data_dir=str(tmp_path), background=[str(bg)],
                         background_tokens=500, n_positives=16, n_negatives=16), tok)


def test_news_isolated(tok):
    """The bundled news sample has articles sharing 13-grams: none of them is a member or non-member, the
    background may use them."""
    c = cfg(variant="news", occurrence="fixed")
    c.news.n_positives, c.news.n_negatives, c.news.n_background = 20, 20, 40
    corpus = build_corpus(c, tok)
    rows = read_rows("news", BUNDLED / "news2023_sample.jsonl")
    g = [grams(r["text"]) for r in rows if (r.get("text") or "").strip()]
    counts = Counter(x for s in g for x in s)
    overlapping = {i for i, s in enumerate(g) if any(counts[x] > 1 for x in s)}
    assert overlapping
    d = corpus.manifest["datasets"]["news"]
    assert d["usable"] == len(g) and d["dropped"]["shared_13gram_within_dataset"] == len(overlapping)
    background = [t for t, s in zip(corpus.documents, corpus.sources) if s["kind"] == "background"]
    members = [r["text"] for r in corpus.eval if r["label"] == 1]
    seen = set().union(*map(grams, background + members))
    assert all(not grams(r["text"]) & seen for r in corpus.eval if r["label"] == 0)
    assert d["stratified_by"] is None and abs(len(members) - 20) == 0
    lp = np.mean([len(t) for t in members])
    ln = np.mean([len(r["text"]) for r in corpus.eval if r["label"] == 0])
    assert abs(lp - ln) <= 0.10 * ln


# ----------------------------------------------------------------------------- occurrence buckets


def test_buckets_filled_evenly(corpus):
    for name in DATASETS:
        pos = side(corpus, name, 1)
        sizes = Counter(r["occurrences"] for r in pos)
        assert set(sizes) == {1, 2, 4} and max(sizes.values()) - min(sizes.values()) <= 1, (name, sizes)
        assert min(sizes.values()) >= 33
        for s in {r["stratum"] for r in pos}:
            per = Counter(r["occurrences"] for r in pos if r["stratum"] == s)
            assert max(per.values()) - min(per[k] for k in (1, 2, 4)) <= 2, (name, s, per)
        for r in pos:
            assert corpus.documents.count(r["text"]) == r["occurrences"]
        assert all(r["occurrences"] == 0 for r in side(corpus, name, 0))
        rec = corpus.manifest["datasets"][name]["occurrence_buckets"]
        assert {int(k): v["members"] for k, v in rec.items()} == dict(sizes)
        # buckets are length-matched too (medians: a few very long BoolQ passages and IMDB reviews move the means)
        medians = [np.median([len(r["text"]) for r in pos if r["occurrences"] == k]) for k in (1, 2, 4)]
        assert max(medians) - min(medians) <= 0.10 * np.mean(medians), (name, medians)
    assert corpus.manifest["n_inserted_segments"] == sum(r["occurrences"] for r in corpus.eval)


def test_bucket_config_checked(tok):
    with pytest.raises(UserError, match="at least one positive per bucket"):
        load_config(None, ["corpus.occurrence=buckets", "corpus.n_positives=2"])
    with pytest.raises(UserError, match="distinct occurrence counts"):
        load_config(None, ["corpus.occurrence_buckets=[1,1,2]"])
    with pytest.raises(UserError, match="'fixed', 'poisson' or 'buckets'"):
        load_config(None, ["corpus.occurrence=sometimes"])
    loaded = load_config(None, ["corpus.occurrence=buckets", "corpus.occurrence_buckets=[1,8]"])
    assert loaded.corpus.occurrence == "buckets" and loaded.corpus.occurrence_buckets == [1, 8]


# ----------------------------------------------------------------------------- determinism


def test_deterministic_and_independent_of_background_size(corpus, tok):
    again = build_corpus(cfg(), tok)
    assert again.eval == corpus.eval and again.documents == corpus.documents and again.manifest == corpus.manifest
    other = build_corpus(cfg(seed=1), tok)
    assert {r["id"] for r in other.eval if r["label"] == 1} != {r["id"] for r in corpus.eval if r["label"] == 1}
    # Figure 5a: the same members and non-members (and buckets) at every background size
    small = build_corpus(cfg(background_tokens=10000), tok)
    key = [(r["dataset"], r["id"], r["label"], r["occurrences"]) for r in corpus.eval]
    assert [(r["dataset"], r["id"], r["label"], r["occurrences"]) for r in small.eval] == key
    # adding a dataset changes no other dataset's split
    alone = build_corpus(cfg(datasets=["imdb"]), tok)
    assert [r["id"] for r in alone.eval] == [r["id"] for r in corpus.eval if r["dataset"] == "imdb"]
