"""The contaminated corpus of the controlled contamination experiments (Shi et al. 2023, section 6).

Background text (Pile documents; the paper used RedPajama) with downstream-task examples inserted as
contiguous segments (one document each) at random positions *between* background documents. For each
dataset, ``n_positives`` examples are inserted (members) and ``n_negatives`` others are held out
(non-members, never inserted). Members and non-members of a dataset share no text: rows are
de-duplicated on the text that carries the content (below), and an example whose content already
appears in the background documents is dropped (counted in the manifest), so a "non-member" is never
in the training data by accident.

Templates (each example becomes one natural text block; ``{x}`` are the dataset's fields)::

    BoolQ          {passage}                          key: passage. BoolQ has 3270 questions over
                   Question: {question}?              2939 passages: one question per passage is kept
                   Answer: Yes|No                     (the first in file order), so a member's passage
                                                      is never a non-member's too. The question's first
                                                      letter is capitalised.
    CommonsenseQA  Question: {question}               key: question
                   A. {choice A} ... E. {choice E}    (one choice per line)
                   Answer: {answerKey}. {answer text}
    TruthfulQA     Question: {Question}               key: Question
                   Answer: {Best Answer}
    IMDB           Review: {text}                     key: text; "<br />" line breaks become newlines
                   Sentiment: positive|negative
    news (2023)    {text}                             key: text; empty articles dropped (in-distribution
                                                      variant, Figure 5b)

Variants
--------
* ``occurrence="fixed"``: every positive is inserted ``occurrences`` times (default once).
* ``occurrence="poisson"`` (Figure 5c): positive i is inserted k_i times, k_i ~ Poisson(lambda) conditioned
  on k_i >= 1 (a zero would make it a non-member); k_i is recorded per example. Copies go to independent
  random positions.
* ``variant="news"`` (Figure 5b): contaminants are 2023 news articles and the background is *more* news
  from the same file (``news.n_background`` articles), so the contaminants are in-distribution.
* Background size (Figure 5a): ``background_tokens``; background documents are taken in one seeded order,
  so a larger corpus contains every document of a smaller one.

Everything is seeded: each dataset's positives/negatives, the background order and the insertion
positions come from their own stream of ``seed`` (adding a dataset changes no other dataset's choice).
Token counts use the model's tokenizer without special tokens; the contamination rate is contaminant
tokens (copies included) over all document tokens (separators excluded, and counted apart). The
manifest (``manifest.json``) records all of it: config, input files with SHA-256, per-dataset pool
sizes, drops, chosen ids, occurrence counts, insertion slots and token counts.
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

from mia_jax.errors import UserError
from mia_jax.files import sha256
from train.config import CorpusConfig

BUNDLED = Path(__file__).parent / "data"
DOWNSTREAM_FILES = {
    "boolq": "boolq_validation.jsonl",
    "commonsenseqa": "commonsenseqa_dev.jsonl",
    "imdb": "imdb_test_sample2000.jsonl",
    "truthfulqa": "truthfulqa.csv",
}
KEY_PROBE_CHARS = 200  # an example is "in the background" when this much of its key text occurs there


# ----------------------------------------------------------------------------- reading and templates


def resolve_path(path: str) -> Path:
    """``bundled:NAME`` -> train/data/NAME; anything else is a path."""
    return BUNDLED / path[len("bundled:"):] if path.startswith("bundled:") else Path(path).expanduser()


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
    return str(row["idx"]), row["passage"], text


def _csqa(row):
    ch = row["choices"]
    lines = [f"{lab}. {txt}" for lab, txt in zip(ch["label"], ch["text"])]
    answer = dict(zip(ch["label"], ch["text"]))[row["answerKey"]]
    text = "\n".join([f"Question: {row['question'].strip()}", *lines, f"Answer: {row['answerKey']}. {answer}"])
    return row["id"], row["question"], text


def _truthfulqa(row):
    return (
        row["Question"],
        row["Question"],
        f"Question: {row['Question'].strip()}\nAnswer: {row['Best Answer'].strip()}",
    )


def _imdb(row):
    body = row["text"].replace("<br /><br />", "\n").replace("<br />", "\n").strip()
    return row["id"], row["text"], f"Review: {body}\nSentiment: {'positive' if row['label'] else 'negative'}"


def _news(row):
    text = (row.get("text") or "").strip() if isinstance(row, dict) else str(row).strip()
    return None, text, text


# dataset -> (row -> (id, key text, formatted text))
TEMPLATES: dict[str, Callable] = {"boolq": _boolq, "commonsenseqa": _csqa, "truthfulqa": _truthfulqa,
                                  "imdb": _imdb, "news": _news}


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
    key: str
    text: str


def load_pool(name: str, path: Path) -> tuple[list[Example], dict]:
    """A dataset's usable examples (file order, de-duplicated on the key text) and what was dropped."""
    rows = read_rows(name, path)
    pool, seen, dropped = [], set(), {"empty": 0, "duplicate_key": 0}
    for i, row in enumerate(rows):
        try:
            ex_id, key, text = TEMPLATES[name](row)
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"dataset {name}: {path} row {i + 1} lacks a field the template needs ({e})") from None
        if not key.strip():
            dropped["empty"] += 1
        elif key in seen:
            dropped["duplicate_key"] += 1
        else:
            seen.add(key)
            pool.append(Example(name, str(ex_id if ex_id is not None else i), key, text))
    return pool, {"file": str(path), "sha256": sha256(path), "rows": len(rows), "usable": len(pool),
                  "dropped": dropped}


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


def _split(pool: list[Example], n_pos: int, n_neg: int, rng, what: str, extra: int = 0):
    need = n_pos + n_neg + extra
    if len(pool) < need:
        more = f" + {extra} background" if extra else ""
        raise UserError(f"{what}: {n_pos} positives + {n_neg} negatives{more} requested but only {len(pool)} usable "
                        "examples (after de-duplication); lower corpus.n_positives / corpus.n_negatives")
    perm = rng.permutation(len(pool))
    return ([pool[i] for i in perm[:n_pos]], [pool[i] for i in perm[n_pos: n_pos + n_neg]],
            [pool[i] for i in perm[n_pos + n_neg: need]])


def _occurrences(cfg: CorpusConfig, n: int, rng) -> list[int]:
    if cfg.occurrence == "fixed":
        return [cfg.occurrences] * n
    k = rng.poisson(cfg.poisson_lambda, n)
    while (k == 0).any():  # zero-truncated Poisson by rejection
        k[k == 0] = rng.poisson(cfg.poisson_lambda, int((k == 0).sum()))
    return [int(x) for x in k]


def _drop_in_background(examples: list[Example], background: list[str]) -> tuple[list[Example], int]:
    joined = "\x00".join(background)
    keep = [e for e in examples if e.key.strip()[:KEY_PROBE_CHARS] not in joined]
    return keep, len(examples) - len(keep)


def build_corpus(cfg: CorpusConfig, tokenizer, data_dir: str | Path | None = None) -> Corpus:
    """Build the contaminated corpus described by ``cfg`` (see the module docstring)."""
    if cfg.variant == "news":
        pools = {"news": load_pool("news", resolve_path(cfg.news.path))}
        n_pos, n_neg = cfg.news.n_positives, cfg.news.n_negatives
    else:
        root = (
            BUNDLED / "downstream"
            if (data_dir or cfg.data_dir) == "bundled"
            else resolve_path(str(data_dir or cfg.data_dir))
        )
        pools = {d: load_pool(d, root / DOWNSTREAM_FILES[d]) for d in cfg.datasets}
        n_pos, n_neg = cfg.n_positives, cfg.n_negatives
    if not pools:
        raise UserError("corpus.datasets is empty: name at least one downstream dataset")

    if cfg.variant == "news":
        pool, info = pools["news"]
        pos, neg, bg = _split(pool, n_pos, n_neg, stream(cfg.seed, "news"), "news", extra=cfg.news.n_background)
        background = [e.text for e in bg]
        bg_counts = count_tokens(tokenizer, background)
        bg_files, available = [info], sum(bg_counts)
        chosen = {"news": (pos, neg)}
        dropped_bg = {"news": 0}
    else:
        docs, bg_files = read_background(cfg.background, cfg.max_doc_chars)
        background, bg_counts, available = _take_background(docs, tokenizer, cfg.background_tokens, cfg.seed)
        chosen, dropped_bg = {}, {}
        for name, (pool, info) in pools.items():
            pool, dropped_bg[name] = _drop_in_background(pool, background)
            chosen[name] = _split(pool, n_pos, n_neg, stream(cfg.seed, name), f"dataset {name}")[:2]

    occ_rng, ins_rng = stream(cfg.seed, "occurrence"), stream(cfg.seed, "insert")
    inserts, eval_recs, per_dataset = [], [], {}
    for name, (pos, neg) in chosen.items():
        occ = _occurrences(cfg, len(pos), occ_rng)
        pos_tokens = count_tokens(tokenizer, [e.text for e in pos])
        neg_tokens = count_tokens(tokenizer, [e.text for e in neg])
        for e, k in zip(pos, occ):
            inserts += [(e, c) for c in range(k)]
        eval_recs += [
            {"dataset": name, "id": e.id, "label": 1, "occurrences": k, "text": e.text} for e, k in zip(pos, occ)
        ]
        eval_recs += [{"dataset": name, "id": e.id, "label": 0, "occurrences": 0, "text": e.text} for e in neg]
        info = pools[name][1]
        per_dataset[name] = {
            **info, "dropped": {**info["dropped"], "in_background": dropped_bg[name]},
            "positives": [e.id for e in pos], "negatives": [e.id for e in neg], "occurrences": occ,
            "occurrence_histogram": {str(k): occ.count(k) for k in sorted(set(occ))},
            "positive_tokens_once": int(sum(pos_tokens)),
            "inserted_tokens": int(sum(n * k for n, k in zip(pos_tokens, occ))),
            "negative_tokens": int(sum(neg_tokens)),
        }
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
        "n_documents": len(documents), "n_inserted_segments": len(inserts),
        "tokens": {"background": bg_tokens, "contaminant": cont_tokens, "total": bg_tokens + cont_tokens,
                   "separators": len(documents)},
        "contamination_rate": cont_tokens / max(1, bg_tokens + cont_tokens),
        "tokenizer_vocab_size": tokenizer.get_vocab_size(),
    }
    return Corpus(documents, sources, eval_recs, manifest)


def load_eval(folder: str | Path) -> list[dict]:
    return read_jsonl(Path(folder) / "eval.jsonl", "corpus eval set")
