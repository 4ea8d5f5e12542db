"""The contaminated corpus of the controlled contamination experiments (Shi et al. 2023, section 6).

Background text (Pile documents; the paper used RedPajama) with downstream-task examples inserted as
contiguous segments (one document each) at random positions *between* background documents. For each
dataset, ``n_positives`` examples are inserted (members) and ``n_negatives`` others are held out
(non-members, never inserted).

Templates (each example becomes one natural text block; ``{x}`` are the dataset's fields)::

    BoolQ          {passage}                          fields: passage, question; stratum: answer (yes/no).
                   Question: {question}?              BoolQ has 3270 questions over 2939 passages: one
                   Answer: Yes|No                     question per passage is kept (the first in file
                                                      order). The question's first letter is capitalised.
    CommonsenseQA  Question: {question}               fields: question, answer text, choices (as a set);
                   A. {choice A} ... E. {choice E}    stratum: answer key (A-E)
                   Answer: {answerKey}. {answer text}
    TruthfulQA     Question: {Question}               fields: question, answer; no class label
                   Answer: {Best Answer}
    IMDB           Review: {text}                     fields: review; stratum: sentiment
                   Sentiment: positive|negative       ("<br />" line breaks become newlines)
    news (2023)    {text}                             fields: text; no class label (in-distribution
                                                      variant, Figure 5b); empty articles dropped

Members and non-members share no text
-------------------------------------
1. De-duplication (``load_pool``): a row is dropped when any content field, normalised (lowercase,
   whitespace collapsed), equals that field of an earlier row; the first is kept (TruthfulQA's best
   answer "I have no comment" is shared by 24 of the 300 bundled rows: one stays).
2. 13-gram isolation (``overlap.isolate``): a row is not a candidate when it shares a word 13-gram (same
   normalisation) with another row of any dataset in the corpus, or with any document of the background
   files (all of them, not only those taken, so the split does not depend on ``background_tokens`` or the
   tokenizer; and when its key's first 200 characters occur in one). *Every* row of an overlapping group
   is dropped, so the rule does not depend on file order. In the news variant such rows may still serve
   as background articles (they share nothing with a candidate).
3. ``overlap_check`` verifies the built corpus: the most 13-grams one non-member shares with the members
   (of every dataset) and with the corpus's background, and the field values shared across sides, all 0,
   recorded as ``manifest["overlap_check"]`` (and per dataset); a failure is an error, never a corpus.
13-grams (train/overlap.py) are 64-bit hashes of word-id tuples (sorted arrays, binary search): about a second for the
bundled data.

Splits: stratified and length-matched (``_split``)
--------------------------------------------------
The ``n_positives + n_negatives`` examples are apportioned over the strata (the dataset's class label)
in proportion to the candidates, and each stratum's share over members and non-members in proportion
``n_positives : n_negatives`` (largest remainder, seeded ties): with equal sizes a label's count differs
by at most one example between the sides. Within a stratum a seeded sample is sorted by length
(characters of the formatted text, tokenizer-independent) and cut into consecutive runs, one seeded
example of each run going to the smaller side (with equal sizes: a coin per consecutive pair), so both
sides draw from every length quantile. TruthfulQA and news have no class label: length-matched only
(the manifest says so). Eval records carry ``stratum`` (the class label, null without one).

Variants
--------
* ``occurrence="fixed"``: every positive is inserted ``occurrences`` times (default once).
* ``occurrence="poisson"``: positive i is inserted k_i times, k_i ~ Poisson(lambda) conditioned
  on k_i >= 1 (a zero would make it a non-member); k_i is recorded per example.
* ``occurrence="buckets"`` (Figure 5c by design): the positives, sorted by (stratum, length, seeded tie),
  are dealt in consecutive blocks of ``len(occurrence_buckets)``, each block getting a seeded permutation
  of the buckets; a member of bucket k is inserted k times. Bucket sizes differ by at most one (within a
  stratum by at most two) and are length-matched; every bucket is compared with the same non-members.
  Copies (Poisson and buckets) go to independent random positions.
* ``variant="news"`` (Figure 5b): contaminants are 2023 news articles and the background is *more* news
  from the same file (``news.n_background`` articles, the split's leftovers in one seeded order, so a
  larger background contains a smaller one and the split is the same at every size).
* Background size (Figure 5a): ``background_tokens``; background documents are taken in one seeded order,
  so a larger corpus contains every document of a smaller one; members and non-members do not change.

Everything is seeded: each dataset's split, the buckets, the background order and the insertion positions
come from their own stream of ``seed`` (adding a dataset changes no other dataset's split unless the two
share a 13-gram: none of the bundled ones do). Token counts use the model's tokenizer without special
tokens; the contamination rate is contaminant tokens (copies included) over all document tokens
(separators excluded, and counted apart). The manifest (``manifest.json``) records all of it: config,
input files with SHA-256; per dataset the pool sizes, drops by reason (``duplicate_<field>``,
``in_background``, ``shared_13gram_within_dataset``, ``shared_13gram_other_dataset``), ``candidates``,
``stratified_by``, ``strata`` (candidates / members / non-members per label), ``length_chars`` and
``length_tokens`` (mean, median per side), ``overlap_check``, chosen ids, occurrence counts (and
``occurrence_buckets``: members per bucket and label), insertion slots and token counts.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mia_jax.data import corpora
from mia_jax.errors import UserError
from mia_jax.files import sha256
from train.config import CorpusConfig
from train.overlap import NGRAM, NgramHasher, isolate, normalise, overlap_check

BUNDLED = Path(__file__).parent / "data"
DOWNSTREAM_FILES = {
    "boolq": "boolq_validation.jsonl",
    "commonsenseqa": "commonsenseqa_dev.jsonl",
    "imdb": "imdb_test_sample2000.jsonl",
    "truthfulqa": "truthfulqa.csv",
}


# ----------------------------------------------------------------------------- reading and templates


def resolve_path(path: str) -> Path:
    """``bundled:NAME`` -> train/data/NAME (the Pile sample: the package's, ``corpora.PILE_SAMPLE``); anything else
    is a path."""
    if not path.startswith("bundled:"):
        return Path(path).expanduser()
    name = path[len("bundled:"):]
    return corpora.PILE_SAMPLE if name == corpora.PILE_SAMPLE.name else BUNDLED / name


def read_jsonl(path: Path, what: str) -> list:
    if not path.is_file():
        raise UserError(f"{what}: file not found: {path}")
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise UserError(f"{what}: {path} line {lineno} is not valid JSON ({e.msg}); "
                                        "expected one JSON object per line") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{what}: cannot read {path}: {e}") from e
    return rows


def _boolq(row):
    q = row["question"].strip().rstrip("?")
    text = f"{row['passage'].strip()}\nQuestion: {q[:1].upper() + q[1:]}?\nAnswer: {'Yes' if row['label'] else 'No'}"
    return str(row["idx"]), {"passage": row["passage"], "question": row["question"]}, \
        "yes" if row["label"] else "no", text


def _csqa(row):
    ch = row["choices"]
    lines = [f"{lab}. {txt}" for lab, txt in zip(ch["label"], ch["text"])]
    answer = dict(zip(ch["label"], ch["text"]))[row["answerKey"]]
    text = "\n".join([f"Question: {row['question'].strip()}", *lines, f"Answer: {row['answerKey']}. {answer}"])
    fields = {"question": row["question"], "answer": answer, "choices": "\n".join(ch["text"])}
    return row["id"], fields, str(row["answerKey"]), text


def _truthfulqa(row):
    text = f"Question: {row['Question'].strip()}\nAnswer: {row['Best Answer'].strip()}"
    return row["Question"], {"question": row["Question"], "answer": row["Best Answer"]}, None, text


def _imdb(row):
    body = row["text"].replace("<br /><br />", "\n").replace("<br />", "\n").strip()
    sentiment = "positive" if row["label"] else "negative"
    return row["id"], {"review": row["text"]}, sentiment, f"Review: {body}\nSentiment: {sentiment}"


def _news(row):
    text = (row.get("text") or "").strip() if isinstance(row, dict) else str(row).strip()
    return None, {"text": text}, None, text


# dataset -> (row -> (id, {field: text} (first = key), stratum or None, formatted text))
TEMPLATES: dict[str, Callable] = {"boolq": _boolq, "commonsenseqa": _csqa, "truthfulqa": _truthfulqa,
                                  "imdb": _imdb, "news": _news}
# the class label each dataset's split is stratified by (None: the dataset has none; length-matched only)
STRATIFIED_BY = {"boolq": "answer (yes / no)", "commonsenseqa": "answer key (A-E)", "imdb": "sentiment",
                 "truthfulqa": None, "news": None}


def read_rows(name: str, path: Path) -> list:
    if name == "truthfulqa":
        if not path.is_file():
            raise UserError(f"dataset {name}: file not found: {path}")
        with open(path, encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    return read_jsonl(path, f"dataset {name}")


@dataclass
class Example:
    dataset: str
    id: str
    key: str  # the first content field (BoolQ: passage, CSQA / TruthfulQA: question, IMDB: review, news: text)
    text: str  # the formatted text (what is inserted / scored)
    fields: dict = field(default_factory=dict)  # every content field that reaches the text
    stratum: str | None = None  # the dataset's class label (BoolQ answer, IMDB sentiment, CSQA answer key)
    index: int = 0  # row in the file


def load_pool(name: str, path: Path) -> tuple[list[Example], dict]:
    """A dataset's usable examples (file order) and what was dropped: a row is dropped when its key is empty or
    when any of its content fields (normalised) equals the same field of an earlier kept row (first one kept)."""
    rows = read_rows(name, path)
    pool, seen, dropped, names = [], {}, {"empty": 0}, []
    for i, row in enumerate(rows):
        try:
            ex_id, fields, stratum, text = TEMPLATES[name](row)
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"dataset {name}: {path} row {i + 1} lacks a field the template needs ({e})") from None
        norm = {f: normalise(str(v)) for f, v in fields.items()}
        key = next(iter(fields.values()))
        dup = next((f for f, v in norm.items() if v in seen.get(f, ())), None)
        if not key.strip():
            dropped["empty"] += 1
        elif dup is not None:
            dropped[f"duplicate_{dup}"] = dropped.get(f"duplicate_{dup}", 0) + 1
        else:
            for f, v in norm.items():
                seen.setdefault(f, set()).add(v)
            pool.append(Example(name, str(ex_id if ex_id is not None else i), key, text, fields, stratum, i))
        names = list(fields)
    for f in names:
        dropped.setdefault(f"duplicate_{f}", 0)
    return pool, {"file": str(path), "sha256": sha256(path), "rows": len(rows), "usable": len(pool),
                  "dedup_fields": names, "dropped": dropped}


def read_background(paths: list[str], max_doc_chars: int | None) -> tuple[list[str], list[dict]]:
    docs, files = [], []
    for p in paths:
        path = resolve_path(p)
        rows = read_jsonl(path, "background corpus")
        texts = [(r.get("text") if isinstance(r, dict) else r) for r in rows]
        texts = [t for t in texts if isinstance(t, str) and t.strip()]
        files.append({"file": str(path), "sha256": sha256(path), "rows": len(rows), "documents": len(texts)})
        docs += [_cut(t.strip(), max_doc_chars) for t in texts]
    if not docs:
        raise UserError(f"background corpus is empty: no non-empty 'text' in {paths}; "
                        "point corpus.background at JSONL files with a 'text' field per line")
    return docs, files


def _cut(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    cut = text.rfind(" ", 0, max_chars)
    return text[: cut if cut > max_chars // 2 else max_chars]


def stream(seed: int, name: str) -> np.random.Generator:
    """An independent random stream per purpose (dataset name, 'background', 'insert')."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


# ----------------------------------------------------------------------------- the corpus


@dataclass
class Corpus:
    documents: list[str]  # in training order; packed with a separator token between documents
    sources: list[dict]  # per document: {"kind": "background"} or {"kind": "contaminant", "dataset", "id"}
    eval: list[dict]  # {"dataset", "id", "label", "occurrences", "text"}: members (1) and non-members (0)
    manifest: dict = field(default_factory=dict)

    def write(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "documents.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({**src, "text": text}) + "\n" for text, src in zip(self.documents, self.sources))
        with open(folder / "eval.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(rec) + "\n" for rec in self.eval)
        (folder / "manifest.json").write_text(json.dumps(self.manifest, indent=2) + "\n")


def count_tokens(tokenizer, texts: list[str]) -> list[int]:
    return [len(e.ids) for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)] if texts else []


def _take_background(docs: list[str], tokenizer, target: int, seed: int) -> tuple[list[str], list[int], int]:
    """Documents in one seeded order until ``target`` tokens; (docs, their token counts, tokens available)."""
    order = stream(seed, "background").permutation(len(docs))
    chosen, counts, total = [], [], 0
    for start in range(0, len(order), 256):
        block = [docs[i] for i in order[start: start + 256]]
        for text, n in zip(block, count_tokens(tokenizer, block)):
            if total >= target:
                return chosen, counts, total
            chosen.append(text)
            counts.append(n)
            total += n
    if total < target:
        raise UserError(f"corpus.background_tokens={target} but the background files hold only {total} tokens "
                        "(for this tokenizer); add files to corpus.background or lower corpus.background_tokens")
    return chosen, counts, total


def _apportion(total: int, weights: list[int], rng) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder, exact integers, ties in seeded order);
    each part is within one of its exact share and at most its weight when ``total <= sum(weights)``."""
    w_sum = sum(weights)
    if w_sum == 0:
        return [0] * len(weights)
    base = [total * w // w_sum for w in weights]
    rem = [total * w % w_sum for w in weights]
    tie = rng.permutation(len(weights))
    for i in sorted(range(len(weights)), key=lambda i: (-rem[i], tie[i]))[: total - sum(base)]:
        base[i] += 1
    return base


def _split(cands: list[Example], n_pos: int, n_neg: int, rng) -> tuple[list[Example], list[Example]]:
    """Members and non-members, stratified by ``Example.stratum`` and matched in length.

    The n_pos + n_neg examples are apportioned over the strata in proportion to their candidates, and each
    stratum's share over the two sides in proportion n_pos : n_neg (with n_pos == n_neg a label's count differs by
    at most one between the sides). Within a stratum a seeded sample of its share is sorted by length (characters
    of the formatted text, seeded ties) and cut into as many consecutive runs as the smaller side takes examples;
    one seeded example of each run goes to the smaller side, the rest to the other (so both sides draw from every
    length quantile: with equal sides, a coin per consecutive pair). Both lists come back in file order."""
    strata = sorted({e.stratum for e in cands}, key=lambda s: (s is not None, str(s)))
    groups = [[e for e in cands if e.stratum == s] for s in strata]
    totals = _apportion(n_pos + n_neg, [len(g) for g in groups], rng)
    members = _apportion(n_pos, totals, rng)
    pos, neg = [], []
    for g, t, m in zip(groups, totals, members):
        sample = [g[i] for i in sorted(rng.choice(len(g), t, replace=False))]
        tie = rng.permutation(t)
        ordered = [sample[i] for i in sorted(range(t), key=lambda i: (len(sample[i].text), tie[i]))]
        k = min(m, t - m)
        picked = {j * t // k + int(rng.integers((j + 1) * t // k - j * t // k)) for j in range(k)}
        few = [e for i, e in enumerate(ordered) if i in picked]
        many = [e for i, e in enumerate(ordered) if i not in picked]
        pos += few if m <= t - m else many
        neg += many if m <= t - m else few
    return sorted(pos, key=lambda e: e.index), sorted(neg, key=lambda e: e.index)


def _need(cands: list[Example], pool: list[Example], n_pos: int, n_neg: int, what: str, extra: int = 0) -> None:
    if len(pool) < n_pos + n_neg + extra:
        more = f" + {extra} background" if extra else ""
        raise UserError(f"{what}: {n_pos} positives + {n_neg} negatives{more} requested but only {len(pool)} usable "
                        "examples (after de-duplication); lower corpus.n_positives / corpus.n_negatives")
    if len(cands) < n_pos + n_neg:
        raise UserError(f"{what}: {n_pos} positives + {n_neg} negatives requested but only {len(cands)} usable "
                        f"examples share no {NGRAM}-gram with another example or the background (of {len(pool)} "
                        "after de-duplication); lower corpus.n_positives / corpus.n_negatives")


def _occurrences(cfg: CorpusConfig, pos: list[Example], rng) -> list[int]:
    if cfg.occurrence == "fixed":
        return [cfg.occurrences] * len(pos)
    if cfg.occurrence == "buckets":
        return _buckets(pos, cfg.occurrence_buckets, rng)
    k = rng.poisson(cfg.poisson_lambda, len(pos))
    while (k == 0).any():  # zero-truncated Poisson by rejection
        k[k == 0] = rng.poisson(cfg.poisson_lambda, int((k == 0).sum()))
    return [int(x) for x in k]


def _buckets(pos: list[Example], buckets: list[int], rng) -> list[int]:
    """Occurrence counts dealt evenly: the members sorted by (stratum, length, seeded tie) are cut into consecutive
    blocks of ``len(buckets)``, and each block gets a seeded permutation of the buckets (the last, partial block a
    seeded subset). Bucket sizes differ by at most one; within each stratum by at most two; lengths match."""
    if len(pos) < len(buckets):
        raise UserError(f"corpus.occurrence=buckets: {len(buckets)} buckets {list(buckets)} but only {len(pos)} "
                        "positives; raise corpus.n_positives or use fewer corpus.occurrence_buckets")
    tie = rng.permutation(len(pos))
    order = sorted(range(len(pos)), key=lambda i: (str(pos[i].stratum), len(pos[i].text), tie[i]))
    occ = [0] * len(pos)
    for start in range(0, len(order), len(buckets)):
        for i, b in zip(order[start: start + len(buckets)], rng.permutation(len(buckets))):
            occ[i] = int(buckets[b])
    return occ


def _summary(values: list[int]) -> dict:
    return {"mean": float(np.mean(values)), "median": float(np.median(values))} if values else {}


def _split_record(name: str, cands: list[Example], pos: list[Example], neg: list[Example], pos_tokens, neg_tokens):
    strata = sorted({e.stratum for e in cands}, key=lambda s: (s is not None, str(s)))
    rec = {"stratified_by": STRATIFIED_BY.get(name)}
    if rec["stratified_by"] is None:
        rec["stratification_note"] = f"{name} has no class label: members and non-members are length-matched only"
    rec["strata"] = {("all" if s is None else s): {"candidates": sum(e.stratum == s for e in cands),
                                                   "members": sum(e.stratum == s for e in pos),
                                                   "non_members": sum(e.stratum == s for e in neg)} for s in strata}
    rec["max_stratum_count_difference"] = max(abs(v["members"] - v["non_members"]) for v in rec["strata"].values())
    rec["length_chars"] = {"members": _summary([len(e.text) for e in pos]),
                           "non_members": _summary([len(e.text) for e in neg])}
    rec["length_tokens"] = {"members": _summary(list(pos_tokens)), "non_members": _summary(list(neg_tokens))}
    return rec


def _data_root(cfg: CorpusConfig, data_dir: str | Path | None = None) -> Path:
    return (BUNDLED / "downstream" if (data_dir or cfg.data_dir) == "bundled"
            else resolve_path(str(data_dir or cfg.data_dir)))


def check_sizes(cfg: CorpusConfig, data_dir: str | Path | None = None) -> None:
    """UserError when the data cannot give the members and non-members asked for (every dataset's usable examples
    after de-duplication; the news background too), or the background files are missing or empty: checked from
    the data files alone, before a run folder is claimed (the n-gram isolation, which needs the tokenizer-free
    background scan, is checked again when the corpus is built)."""
    if cfg.variant == "news":
        pool, _ = load_pool("news", resolve_path(cfg.news.path))
        _need(pool, pool, cfg.news.n_positives, cfg.news.n_negatives, "news", extra=cfg.news.n_background)
        return
    if not cfg.datasets:
        raise UserError("corpus.datasets is empty: name at least one downstream dataset")
    root = _data_root(cfg, data_dir)
    for d in cfg.datasets:
        pool, _ = load_pool(d, root / DOWNSTREAM_FILES[d])
        _need(pool, pool, cfg.n_positives, cfg.n_negatives, f"dataset {d}")
    for p in cfg.background:
        path = resolve_path(p)
        if not path.is_file():
            raise UserError(f"background corpus: file not found: {path}")


def build_corpus(cfg: CorpusConfig, tokenizer, data_dir: str | Path | None = None) -> Corpus:
    """Build the contaminated corpus described by ``cfg`` (see the module docstring)."""
    if cfg.occurrence not in ("fixed", "poisson", "buckets"):
        raise UserError(f"corpus.occurrence must be 'fixed', 'poisson' or 'buckets', got {cfg.occurrence!r}")
    hasher = NgramHasher()
    if cfg.variant == "news":
        pools = {"news": load_pool("news", resolve_path(cfg.news.path))}
        n_pos, n_neg = cfg.news.n_positives, cfg.news.n_negatives
    else:
        root = _data_root(cfg, data_dir)
        pools = {d: load_pool(d, root / DOWNSTREAM_FILES[d]) for d in cfg.datasets}
        n_pos, n_neg = cfg.n_positives, cfg.n_negatives
    if not pools:
        raise UserError("corpus.datasets is empty: name at least one downstream dataset")

    if cfg.variant == "news":
        pool, info = pools["news"]
        cands, drops = isolate({"news": pool}, None, hasher)
        _need(cands["news"], pool, n_pos, n_neg, "news", extra=cfg.news.n_background)
        pos, neg = _split(cands["news"], n_pos, n_neg, stream(cfg.seed, "news"))
        used = {e.index for e in pos + neg}
        rest = [e for e in pool if e.index not in used]  # may overlap each other and nothing chosen
        order = stream(cfg.seed, "news background").permutation(len(rest))[: cfg.news.n_background]
        background = [rest[i].text for i in order]
        bg_counts = count_tokens(tokenizer, background)
        bg_files, available = [info], sum(bg_counts)
        chosen = {"news": (pos, neg)}
    else:
        docs, bg_files = read_background(cfg.background, cfg.max_doc_chars)
        background, bg_counts, available = _take_background(docs, tokenizer, cfg.background_tokens, cfg.seed)
        # checked against every document of the background files, so the split does not depend on
        # background_tokens (Figure 5a) nor on the tokenizer
        cands, drops = isolate({n: p for n, (p, _) in pools.items()}, docs, hasher)
        chosen = {}
        for name, (pool, _) in pools.items():
            _need(cands[name], pool, n_pos, n_neg, f"dataset {name}")
            chosen[name] = _split(cands[name], n_pos, n_neg, stream(cfg.seed, name))
    check = overlap_check(chosen, background, hasher)
    if not check["passed"]:  # cannot happen by construction; refuse rather than write a leaking split
        raise RuntimeError(f"corpus overlap check failed (a bug in train/corpus.py): {check}")

    occ_rng, ins_rng = stream(cfg.seed, "occurrence"), stream(cfg.seed, "insert")
    inserts, eval_recs, per_dataset = [], [], {}
    for name, (pos, neg) in chosen.items():
        rng = stream(cfg.seed, f"buckets {name}") if cfg.occurrence == "buckets" else occ_rng
        occ = _occurrences(cfg, pos, rng)
        pos_tokens = count_tokens(tokenizer, [e.text for e in pos])
        neg_tokens = count_tokens(tokenizer, [e.text for e in neg])
        for e, k in zip(pos, occ):
            inserts += [(e, c) for c in range(k)]
        eval_recs += [{"dataset": name, "id": e.id, "label": 1, "occurrences": k, "stratum": e.stratum, "text": e.text}
                      for e, k in zip(pos, occ)]
        eval_recs += [{"dataset": name, "id": e.id, "label": 0, "occurrences": 0, "stratum": e.stratum, "text": e.text}
                      for e in neg]
        info = pools[name][1]
        per_dataset[name] = {
            **info, "dropped": {**info["dropped"], **drops[name]}, "candidates": len(cands[name]),
            **_split_record(name, cands[name], pos, neg, pos_tokens, neg_tokens),
            "overlap_check": check["datasets"][name],
            "positives": [e.id for e in pos], "negatives": [e.id for e in neg], "occurrences": occ,
            "occurrence_histogram": {str(k): occ.count(k) for k in sorted(set(occ))},
            "positive_tokens_once": int(sum(pos_tokens)),
            "inserted_tokens": int(sum(n * k for n, k in zip(pos_tokens, occ))),
            "negative_tokens": int(sum(neg_tokens)),
        }
        if cfg.occurrence == "buckets":
            per_dataset[name]["occurrence_buckets"] = {
                str(k): {"members": occ.count(k),
                         "strata": {("all" if s is None else s):
                                    sum(1 for e, o in zip(pos, occ) if o == k and e.stratum == s)
                                    for s in sorted({e.stratum for e in pos}, key=str)}}
                for k in cfg.occurrence_buckets}
    # slot s = before background document s (s = len(background): at the end); ties in random order
    slots = ins_rng.integers(0, len(background) + 1, len(inserts))
    order = np.lexsort((ins_rng.permutation(len(inserts)), slots))
    documents, sources, j = [], [], 0
    insert_slots: dict[str, list[list[int]]] = {n: [[] for _ in chosen[n][0]] for n in chosen}
    index = {(n, e.id): i for n in chosen for i, e in enumerate(chosen[n][0])}
    for s in range(len(background) + 1):
        while j < len(order) and slots[order[j]] == s:
            e, _ = inserts[order[j]]
            insert_slots[e.dataset][index[(e.dataset, e.id)]].append(int(s))
            documents.append(e.text)
            sources.append({"kind": "contaminant", "dataset": e.dataset, "id": e.id})
            j += 1
        if s < len(background):
            documents.append(background[s])
            sources.append({"kind": "background"})
    for name in per_dataset:
        per_dataset[name]["insert_slots"] = insert_slots[name]

    bg_tokens = int(sum(bg_counts))
    cont_tokens = int(sum(d["inserted_tokens"] for d in per_dataset.values()))
    manifest = {
        "config": dataclasses.asdict(cfg),
        "variant": cfg.variant, "seed": cfg.seed,
        "background": {"files": bg_files, "documents": len(background), "tokens": bg_tokens,
                       "tokens_available": int(available)},
        "datasets": per_dataset,
        "overlap_check": {k: v for k, v in check.items() if k != "datasets"},
        "n_documents": len(documents), "n_inserted_segments": len(inserts),
        "tokens": {"background": bg_tokens, "contaminant": cont_tokens, "total": bg_tokens + cont_tokens,
                   "separators": len(documents)},
        "contamination_rate": cont_tokens / max(1, bg_tokens + cont_tokens),
        "tokenizer_vocab_size": tokenizer.get_vocab_size(),
    }
    return Corpus(documents, sources, eval_recs, manifest)


def load_eval(folder: str | Path) -> list[dict]:
    return read_jsonl(Path(folder) / "eval.jsonl", "corpus eval set")
