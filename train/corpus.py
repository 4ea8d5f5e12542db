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

Splits: stratified and length-matched (``split.split``)
------------------------------------------------------
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

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mia_jax.errors import UserError
from train import split, traps
from train.config import CorpusConfig
from train.overlap import NgramHasher, isolate, overlap_check
from train.sources import BUNDLED, DOWNSTREAM_FILES, load_pool, read_background, read_jsonl, resolve_path, stream


@dataclass
class Corpus:
    """A contaminated corpus: the training ``documents`` and each one's source, the ``eval`` set (members and
    non-members) and the ``manifest``."""
    documents: list[str]  # in training order; packed with a separator token between documents
    sources: list[dict]  # per document: {"kind": "background"} or {"kind": "contaminant", "dataset", "id"}
    eval: list[dict]  # {"dataset", "id", "label", "occurrences", "text"}: members (1) and non-members (0)
    manifest: dict = field(default_factory=dict)

    def write(self, folder: str | Path) -> None:
        """documents.jsonl, eval.jsonl and manifest.json in ``folder`` (made if needed)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "documents.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({**src, "text": text}) + "\n" for text, src in zip(self.documents, self.sources))
        with open(folder / "eval.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(rec) + "\n" for rec in self.eval)
        (folder / "manifest.json").write_text(json.dumps(self.manifest, indent=2) + "\n")


def count_tokens(tokenizer, texts: list[str]) -> list[int]:
    """Tokens of each text (the model's ``tokenizer``, no special tokens)."""
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
        split.check_enough(pool, pool, cfg.news.n_positives, cfg.news.n_negatives, "news", extra=cfg.news.n_background)
        return
    if not cfg.datasets and cfg.variant != "traps":
        raise UserError("corpus.datasets is empty: name at least one downstream dataset")
    root = _data_root(cfg, data_dir)
    for d in cfg.datasets if cfg.variant != "traps" else ():
        pool, _ = load_pool(d, root / DOWNSTREAM_FILES[d])
        split.check_enough(pool, pool, cfg.n_positives, cfg.n_negatives, f"dataset {d}")
    for p in cfg.background:
        path = resolve_path(p)
        if not path.is_file():
            raise UserError(f"background corpus: file not found: {path}")


def _choose_news(cfg: CorpusConfig, pools: dict, tokenizer, hasher: NgramHasher):
    """The news variant: (chosen {"news": (members, non-members)}, candidates, drops, background articles, their
    token counts, background file records, background tokens available)."""
    n_pos, n_neg = cfg.news.n_positives, cfg.news.n_negatives
    pool, info = pools["news"]
    cands, drops = isolate({"news": pool}, None, hasher)
    split.check_enough(cands["news"], pool, n_pos, n_neg, "news", extra=cfg.news.n_background)
    pos, neg = split.split(cands["news"], n_pos, n_neg, stream(cfg.seed, "news"))
    used = {e.index for e in pos + neg}
    rest = [e for e in pool if e.index not in used]  # may overlap each other and nothing chosen
    order = stream(cfg.seed, "news background").permutation(len(rest))[: cfg.news.n_background]
    background = [rest[i].text for i in order]
    bg_counts = count_tokens(tokenizer, background)
    return {"news": (pos, neg)}, cands, drops, background, bg_counts, [info], sum(bg_counts)


def _choose_downstream(cfg: CorpusConfig, pools: dict, tokenizer, hasher: NgramHasher):
    """The downstream variant: the same tuple as :func:`_choose_news`."""
    docs, bg_files = read_background(cfg.background, cfg.max_doc_chars)
    background, bg_counts, available = _take_background(docs, tokenizer, cfg.background_tokens, cfg.seed)
    # checked against every document of the background files, so the split does not depend on
    # background_tokens (Figure 5a) nor on the tokenizer
    cands, drops = isolate({n: p for n, (p, _) in pools.items()}, docs, hasher)
    chosen = {}
    for name, (pool, _) in pools.items():
        split.check_enough(cands[name], pool, cfg.n_positives, cfg.n_negatives, f"dataset {name}")
        chosen[name] = split.split(cands[name], cfg.n_positives, cfg.n_negatives, stream(cfg.seed, name))
    return chosen, cands, drops, background, bg_counts, bg_files, available


def _choose_traps(cfg: CorpusConfig, pools: dict, tokenizer, hasher: NgramHasher):
    """The traps variant (train/traps.py): the trap pool isolated from the background (13-grams), the same number
    of traps per (length, bin) stratum, halved into members and non-members by ``split.split``."""
    docs, bg_files = read_background(cfg.background, cfg.max_doc_chars)
    background, bg_counts, available = _take_background(docs, tokenizer, cfg.background_tokens, cfg.seed)
    cands, drops = isolate({traps.DATASET: pools[traps.DATASET][0]}, docs, hasher)
    picked = traps.balanced(cands[traps.DATASET], cfg, stream(cfg.seed, "traps"))
    n = len(picked) // 2
    chosen = {traps.DATASET: split.split(picked, n, n, stream(cfg.seed, "traps split"))}
    return chosen, cands, drops, background, bg_counts, bg_files, available


def _bucket_record(cfg: CorpusConfig, pos: list, occ: list[int]) -> dict:
    """Members per occurrence bucket, and per stratum."""
    strata = sorted({e.stratum for e in pos}, key=str)
    return {str(k): {"members": occ.count(k),
                     "strata": {("all" if s is None else s):
                                sum(1 for e, o in zip(pos, occ) if o == k and e.stratum == s) for s in strata}}
            for k in cfg.occurrence_buckets}


def _members(cfg: CorpusConfig, tokenizer, chosen: dict, pools: dict, cands: dict, drops: dict, check: dict):
    """(inserts [(example, copy)], eval records, per-dataset manifest records) of the chosen splits."""
    occ_rng = stream(cfg.seed, "occurrence")
    inserts, eval_recs, per_dataset = [], [], {}
    for name, (pos, neg) in chosen.items():
        rng = stream(cfg.seed, f"buckets {name}") if cfg.occurrence == "buckets" else occ_rng
        occ = split.occurrences(cfg, pos, rng)
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
            **split.split_record(name, cands[name], pos, neg, pos_tokens, neg_tokens),
            "overlap_check": check["datasets"][name],
            "positives": [e.id for e in pos], "negatives": [e.id for e in neg], "occurrences": occ,
            "occurrence_histogram": {str(k): occ.count(k) for k in sorted(set(occ))},
            "positive_tokens_once": int(sum(pos_tokens)),
            "inserted_tokens": int(sum(n * k for n, k in zip(pos_tokens, occ))),
            "negative_tokens": int(sum(neg_tokens)),
        }
        if cfg.occurrence == "buckets":
            per_dataset[name]["occurrence_buckets"] = _bucket_record(cfg, pos, occ)
    return inserts, eval_recs, per_dataset


def _interleave(cfg: CorpusConfig, background: list[str], inserts: list, chosen: dict):
    """(documents, sources, {dataset: insertion slots per member}): each insert at a seeded slot between the
    background documents."""
    ins_rng = stream(cfg.seed, "insert")
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
    return documents, sources, insert_slots


def build_corpus(cfg: CorpusConfig, tokenizer, data_dir: str | Path | None = None, trap_pool=None) -> Corpus:
    """The contaminated corpus described by ``cfg`` (see the module docstring), its texts counted with the model's
    ``tokenizer``; ``data_dir``: the downstream files' folder instead of ``cfg.data_dir``; ``trap_pool``: the
    (examples, generation record) of ``traps.trap_pool`` for the traps variant."""
    if cfg.occurrence not in ("fixed", "poisson", "buckets"):
        raise UserError(f"corpus.occurrence must be 'fixed', 'poisson' or 'buckets', got {cfg.occurrence!r}")
    hasher = NgramHasher()
    if cfg.variant == "news":
        pools = {"news": load_pool("news", resolve_path(cfg.news.path))}
    elif cfg.variant == "traps":
        pools = {traps.DATASET: (trap_pool[0], {"generation": trap_pool[1], "dropped": {}})}
    else:
        root = _data_root(cfg, data_dir)
        pools = {d: load_pool(d, root / DOWNSTREAM_FILES[d]) for d in cfg.datasets}
    if not pools:
        raise UserError("corpus.datasets is empty: name at least one downstream dataset")
    choose = {"news": _choose_news, "traps": _choose_traps}.get(cfg.variant, _choose_downstream)
    chosen, cands, drops, background, bg_counts, bg_files, available = choose(cfg, pools, tokenizer, hasher)
    check = overlap_check(chosen, background, hasher)
    if not check["passed"]:  # cannot happen by construction; refuse rather than write a leaking split
        raise RuntimeError(f"corpus overlap check failed (a bug in train/corpus.py): {check}")
    inserts, eval_recs, per_dataset = _members(cfg, tokenizer, chosen, pools, cands, drops, check)
    documents, sources, insert_slots = _interleave(cfg, background, inserts, chosen)
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
    """The eval records (eval.jsonl) of a corpus written by :meth:`Corpus.write` in ``folder``."""
    return read_jsonl(Path(folder) / "eval.jsonl", "corpus eval set")
