"""Regenerate the bundled samples in train/data (and the Pile sample in mia_jax/data/files) from the full files
(../shared/data, see LICENSE.md here).

    python train/data/make_samples.py /path/to/shared/data

Seeded and deterministic: the same input files give byte-identical samples.
"""
import csv
import io
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
PILE_SAMPLE = HERE.parents[1] / "mia_jax" / "data" / "files" / "pile_sample.jsonl"  # shared with the library
PILE_DOMAINS = ("pile_cc", "openwebtext2", "wikipedia_en", "pubmed_abstracts", "stackexchange")
PILE_DOCS_PER_DOMAIN = 120
PILE_MAX_CHARS = 3000
DOWNSTREAM_ROWS = 300  # per dataset (cpu config: 100 positives + 100 negatives, with room for de-duplication)
NEWS_ARTICLES = 80
NEWS_MAX_CHARS = 1200


def cut(text, n):
    """``text`` cut to at most ``n`` characters, at a space in its second half when there is one."""
    if len(text) <= n:
        return text
    i = text.rfind(" ", 0, n)
    return text[: i if i > n // 2 else n]


def jsonl(path):
    """The records of the JSONL file at ``path`` (blank lines skipped)."""
    return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]


def write_jsonl(path, rows):
    """``rows`` written to ``path`` as JSONL (UTF-8, not ASCII-escaped)."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main(src):
    """The bundled samples regenerated from the full files under ``src`` (the shared data folder)."""
    src = Path(src)
    rng = np.random.default_rng(0)
    pile = []
    for domain in PILE_DOMAINS:
        rows = [r for r in jsonl(src / "pile" / f"{domain}.jsonl") if r["text"].strip()]
        for i in sorted(rng.choice(len(rows), PILE_DOCS_PER_DOMAIN, replace=False)):
            pile.append({"text": cut(rows[i]["text"].strip(), PILE_MAX_CHARS), "domain": domain})
    write_jsonl(PILE_SAMPLE, pile)
    for name in ("boolq_validation.jsonl", "commonsenseqa_dev.jsonl", "imdb_test_sample2000.jsonl"):
        rows = jsonl(src / "downstream" / name)
        keep = sorted(rng.choice(len(rows), DOWNSTREAM_ROWS, replace=False))
        write_jsonl(HERE / "downstream" / name, [rows[i] for i in keep])
    with open(src / "downstream" / "truthfulqa.csv", encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        rows, fields = list(reader), reader.fieldnames
    keep = sorted(rng.choice(len(rows), DOWNSTREAM_ROWS, replace=False))
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows[i] for i in keep)
    (HERE / "downstream" / "truthfulqa.csv").write_text(out.getvalue(), encoding="utf-8")
    news = [r for r in jsonl(src / "news2023" / "bbc_2023_articles.jsonl") if r["text"].strip()]
    keep = sorted(rng.choice(len(news), NEWS_ARTICLES, replace=False))
    write_jsonl(HERE / "news2023_sample.jsonl", [{"text": cut(news[i]["text"].strip(), NEWS_MAX_CHARS)} for i in keep])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "shared" / "data")
