"""The audits' demonstrations on a ground truth the toolkit makes itself (no offline model has known book membership):

1. Books (Shi et al. 2023 section 5): long Pile test documents stand in for books. Per source domain (Wikipedia,
   Pile-CC, OpenWebText2) ``--books-per-domain`` documents of at least ``--book-words`` words are drawn (seeded) and
   cut to that length; half of each domain's books are "seen": the model is continued-pretrained on them
   (``python -m train.finetune``). Two seen and two unseen books per domain form the labeled validation set, the rest
   are audited with ``mia-jax audit-books``; the per-book contamination rate should separate seen from unseen books.
   The same audit with the untrained model is the control (it never saw any of them: any separation is chance).
2. Unlearning (section 7): the forget set is ``--forget`` of the audited seen books; the "unlearned" model is the
   books model after gradient ascent on the forget set (``train.objective=ascent``); ``mia-jax audit-unlearning``
   compares it with the books model, and, as the control, the never-trained model with the books model.

    python scripts/audits_demo.py --out runs/audits            # SmolLM2-135M, about 40 min on 2 CPU cores

Every step is a resumable command of the toolkit (printed as it runs); rerun the same command to continue.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mia_jax.runs import entry, rundir  # noqa: E402
from mia_jax.errors import UserError  # noqa: E402

PROG = "python scripts/audits_demo.py"
RESUME_HINT = "every finished step is kept: run the same command again to continue"

DOMAINS = ("wikipedia_en", "pile_cc", "openwebtext2")


def make_books(pile_dir: Path, out: Path, *, per_domain: int, book_words: int, n_forget: int, seed: int,
               n_validation: int = 2) -> dict:
    """Write train.jsonl (the seen books), validation.jsonl, audit.jsonl (title, text, label, domain) and
    forget.jsonl; returns the manifest (also written)."""
    rng = np.random.default_rng(seed)
    books = []
    for domain in DOMAINS:
        path = pile_dir / f"{domain}.jsonl"
        if not path.exists():
            raise UserError(f"{path} not found (the Pile test documents of ../shared/data/pile; see --pile)")
        docs = [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        long = [i for i, d in enumerate(docs) if len(d.split()) >= book_words]
        if len(long) < per_domain:
            raise UserError(f"only {len(long)} {domain} documents of >= {book_words} words in {path}; lower "
                            "--books-per-domain or --book-words")
        pick = rng.permutation(long)[:per_domain]
        for j, i in enumerate(pick):
            text = " ".join(docs[i].split()[:book_words])  # whitespace normalised: the snippets are whole words
            books.append({"title": f"{domain}-{int(i)}", "domain": domain, "label": int(j < per_domain // 2),
                          "text": text})
    validation, audit = [], []
    for domain in DOMAINS:
        for label in (1, 0):
            cell = [b for b in books if b["domain"] == domain and b["label"] == label]
            validation.extend(cell[:n_validation])
            audit.extend(cell[n_validation:])
    forget = [b for b in audit if b["label"] == 1][:n_forget]
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", [b for b in books if b["label"] == 1]), ("validation", validation),
                       ("audit", audit), ("forget", forget)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    manifest = {"seed": seed, "book_words": book_words, "per_domain": per_domain,
                "seen": [b["title"] for b in books if b["label"] == 1],
                "unseen": [b["title"] for b in books if b["label"] == 0],
                "validation": [b["title"] for b in validation], "forget": [b["title"] for b in forget]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


class StepFailed(Exception):
    """A step's command failed; it has reported why (its own one line): the demo stops with its exit status."""

    def __init__(self, rc: int):
        super().__init__(rc)
        self.rc = rc


def step(name: str, argv: list[str], fn) -> None:
    print(f"== {name}: {' '.join(argv)}", file=sys.stderr, flush=True)
    rc = fn(argv)
    if rc:
        raise StepFailed(rc)


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--pile", type=entry.input_dir, default=ROOT.parent / "shared" / "data" / "pile")
    ap.add_argument("--out", type=entry.out_dir, required=True)
    ap.add_argument("--books-per-domain", type=entry.positive_int, default=10)
    ap.add_argument("--validation-per-cell", type=entry.positive_int, default=2,
                    help="validation books per domain and label")
    ap.add_argument("--book-words", type=entry.positive_int, default=2048)
    ap.add_argument("--snippet-words", type=entry.positive_int, default=512)
    ap.add_argument("--forget", type=entry.positive_int, default=2, help="seen audited books forming the forget set")
    ap.add_argument("--epochs", type=entry.positive_int, default=2, help="epochs over the seen books")
    ap.add_argument("--lr", type=entry.positive_float, default=1e-4)
    ap.add_argument("--ascent-lr", type=entry.positive_float, default=2e-5)
    ap.add_argument("--ascent-epochs", type=entry.positive_int, default=4)
    ap.add_argument("--seq-len", type=entry.positive_int, default=512)
    ap.add_argument("--n-samples", type=entry.positive_int, default=20, help="story-completion samples per chunk")
    ap.add_argument("--prompt-words", type=entry.positive_int, default=200, help="story-completion prompt words")
    ap.add_argument("--embed-model", type=entry.input_dir,
                    help="all-MiniLM-L6-v2 folder for embedding similarity (optional)")
    ap.add_argument("--seed", type=entry.nonneg_int, default=0)
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv, resume_hint=RESUME_HINT)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    seen = args.books_per_domain // 2
    if seen - args.validation_per_cell < 1 or args.books_per_domain - seen - args.validation_per_cell < 1:
        raise UserError(f"--books-per-domain {args.books_per_domain} leaves no book to audit after "
                        f"{args.validation_per_cell} validation books per domain and label; give more books or "
                        "fewer --validation-per-cell")
    if args.forget > 3 * (seen - args.validation_per_cell):
        raise UserError(f"--forget {args.forget}: only {3 * (seen - args.validation_per_cell)} seen books are "
                        "audited")
    try:
        return _demo(args)
    except StepFailed as e:  # the step said why
        return e.rc


def _demo(args) -> int:
    from mia_jax import cli
    from train import finetune

    data = args.out / "data"
    books = dict(per_domain=args.books_per_domain, book_words=args.book_words, n_forget=args.forget, seed=args.seed,
                 n_validation=args.validation_per_cell)
    # the books of an earlier run of other settings are refused, not replaced under the models trained on them
    fingerprint = {"audits_demo_books": books, "pile": str(Path(args.pile).resolve())}
    with rundir.claim(data, fingerprint, hint="use another --out"):
        make_books(args.pile, data, **books)
    quiet = ["--no-progress"] if args.no_progress else []
    train_over = [f"train.seq_len={args.seq_len}", "train.batch_size=8", "train.checkpoint_every=10"]
    step("train on the seen books", ["--model", args.model, "--texts", str(data / "train.jsonl"),
                                     "--out", str(args.out / "books_model"), *quiet, *train_over,
                                     f"train.epochs={args.epochs}", f"train.lr={args.lr:g}"], finetune.main)
    books_model = str(args.out / "books_model" / "model")
    for name, model in (("books", books_model), ("books_control", args.model)):
        step(f"audit-books ({name})", ["audit-books", "--books", str(data / "audit.jsonl"), "--validation",
                                       str(data / "validation.jsonl"), "--model", model, "--snippet-words",
                                       str(args.snippet_words), "--seed", str(args.seed),
                                       "--out", str(args.out / name), *quiet], cli.main)
    step("unlearn the forget set (gradient ascent)",
         ["--model", books_model, "--texts", str(data / "forget.jsonl"), "--out", str(args.out / "unlearned"),
          *quiet, *train_over, "train.objective=ascent", f"train.epochs={args.ascent_epochs}",
          f"train.lr={args.ascent_lr:g}"], finetune.main)
    embed = ["--embed-model", args.embed_model] if args.embed_model else []
    for name, unlearned in (("unlearning", str(args.out / "unlearned" / "model")),
                            ("unlearning_control", args.model)):
        step(f"audit-unlearning ({name})", ["audit-unlearning", "--original", books_model, "--unlearned", unlearned,
                                            "--texts", str(data / "forget.jsonl"), "--chunk-words",
                                            str(args.snippet_words), "--n-samples", str(args.n_samples),
                                            "--prompt-words", str(args.prompt_words),
                                            "--seed", str(args.seed), "--out", str(args.out / name), *embed,
                                            *quiet], cli.main)
    print(f"wrote {args.out}/ (books/books.md, books_control/books.md, unlearning/unlearning.md, "
          "unlearning_control/unlearning.md)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
