"""``mia-jax audit-books``: what share of each book's snippets has a model seen? The options, the audit run
(inputs checked and the model loaded before anything is written; the folder and its scoring runs claimed) and the
``--from`` rebuild. The audit itself: :mod:`mia_jax.audits.books`."""
from __future__ import annotations

from mia_jax import entry
from mia_jax.audits import model_options
from mia_jax.audits import books
from mia_jax.audits.books import FPR, METHODS, N_BOOTSTRAP, RATE_METHOD, SNIPPET_WORDS, SNIPPETS

NAME = "audit-books"
HELP = "what share of each book's snippets has a model seen? (Min-K%% contamination rates, Shi et al. 2023 section 5)"


def add_arguments(p) -> None:
    """The options of ``mia-jax audit-books`` on the argparse parser ``p``."""
    p.add_argument("--books", help="the books to audit: a folder of BOOK.txt files (or of seen/ and unseen/ "
                                   "subfolders), or a .jsonl with title and text fields")
    p.add_argument("--model", help="a Hugging Face folder, a .gguf file or an offline name")
    p.add_argument("--from", dest="source", metavar="DIR",
                   type=entry.source_dir("audit-books", example="results/audits/books"),
                   help="rebuild every output of the audit in DIR (its --out) from DIR/snippets.csv, books.csv and "
                        "info.json (checked against DIR/manifest.json), without the model, into --out (new, empty, "
                        "an earlier rebuild of DIR, or DIR itself); its settings are DIR's (no --books, --model, "
                        "--validation or --threshold)")
    p.add_argument("--validation", help="labeled books that set the thresholds: a .jsonl with title, text and label "
                                        "(1 = seen, 0 = unseen), or a folder with seen/ and unseen/ subfolders")
    p.add_argument("--out", required=True, type=entry.out_dir,
                   help="output folder: books.md, books.csv, snippets.csv, histogram.png, info.json, manifest.json; "
                        "the scoring runs in OUT/books and OUT/validation. A folder of another run is refused")
    p.add_argument("--snippets", type=entry.positive_int, default=SNIPPETS,
                   help=f"snippets drawn per book (default {SNIPPETS})")
    p.add_argument("--snippet-words", type=entry.positive_int, default=SNIPPET_WORDS,
                   help=f"words per snippet (default {SNIPPET_WORDS})")
    p.add_argument("--seed", type=entry.nonneg_int, default=0,
                   help="seed of the snippet draw and the bootstrap (default 0)")
    p.add_argument("--methods", nargs="+", default=list(METHODS),
                   help=f"methods whose validation AUROC is reported (default: {' '.join(METHODS)})")
    p.add_argument("--method-for-rate", default=RATE_METHOD,
                   help=f"the method whose threshold flags snippets (default {RATE_METHOD})")
    p.add_argument("--fpr", type=entry.nonneg_float, default=FPR,
                   help=f"target validation FPR of the second threshold (default {FPR})")
    p.add_argument("--threshold", type=float,
                   help="a threshold on the rate method's score (higher = seen; min_k@0.2: the mean log-probability "
                        "of the 20%% least likely tokens); required without --validation")
    p.add_argument("--n-bootstrap", type=entry.nonneg_int, default=N_BOOTSTRAP,
                   help="bootstrap resamples of the AUROC intervals")
    p.add_argument("--encoding", default="utf-8", help="text encoding of the books (default: utf-8)")
    model_options(p, "OUT/books and OUT/validation")


def run(args) -> None:
    """``mia-jax audit-books`` with the parsed ``args`` (with ``--from``: the rebuild)."""
    books.command(args)
