"""The copyrighted-book audit's inputs (step 1 of :mod:`mia_jax.audits.books`): books read from a folder or a file,
each cut into non-overlapping snippets on a word grid, and the seeded draw of the snippets scored."""
from __future__ import annotations

import codecs
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax import data
from mia_jax.audits.common import chunk_words
from mia_jax.errors import UserError
from mia_jax.runs.files import sha256

SNIPPETS = 100
SNIPPET_WORDS = 512


@dataclass
class Book:
    """A book: its title (unique), text, label and where it was read from."""
    title: str
    text: str
    label: int | None = None  # 1 = seen, 0 = unseen, None = unknown
    source: str = ""  # the file (and row) it came from


@dataclass
class Snippet:
    """A drawn snippet: its book, its place on the book's grid and its text ("" when rebuilt from a folder)."""
    book: int  # index of its book in the book list
    position: int  # its place on the book's grid of snippets
    word_offset: int
    n_words: int
    text: str


@dataclass
class SnippetPlan:
    """Books and their drawn snippets (``make_snippets``)."""
    books: list[Book]
    snippets: list[Snippet]
    n_pieces: list[int]  # per book: full snippets available (0: skipped)
    skipped: list[dict]  # {"title", "words"} of the books shorter than one snippet

    @property
    def kept(self) -> list[int]:
        """Indices of the books with at least one snippet."""
        return [i for i, n in enumerate(self.n_pieces) if n]

    @property
    def labels(self) -> np.ndarray:
        """int64 [n_snippets]: each snippet's book's label."""
        return np.array([self.books[s.book].label for s in self.snippets], np.int64)


def draw(n_pieces: int, n: int, seed: int, text: str) -> np.ndarray:
    """Sorted indices of the ``n`` snippets drawn from a book's ``n_pieces`` (all when it has no more)."""
    h = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
    if n >= n_pieces:
        return np.arange(n_pieces)
    return np.sort(np.random.default_rng([seed, h]).choice(n_pieces, size=n, replace=False))


def make_snippets(books: Sequence[Book], n_snippets: int = SNIPPETS, snippet_words: int = SNIPPET_WORDS,
                  seed: int = 0) -> SnippetPlan:
    """Each book's drawn snippets (module docstring, step 1), books shorter than one snippet skipped and listed."""
    snippets, n_pieces, skipped = [], [], []
    for b, book in enumerate(books):
        pieces, _ = chunk_words(book.text, snippet_words, snippet_words)
        n_pieces.append(len(pieces))
        if not pieces:
            skipped.append({"title": book.title, "words": len(book.text.split())})
            continue
        for j in draw(len(pieces), n_snippets, seed, book.text):
            snippets.append(Snippet(b, int(j), int(j) * snippet_words, snippet_words, pieces[j]))
    return SnippetPlan(list(books), snippets, n_pieces, skipped)


def book_label(value, where: str) -> int | None:
    """A book's ``label`` field as 1 (seen), 0 (unseen) or None (no label); ``where`` names the record in the
    UserError for anything else. Returns the label."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip() in ("0", "1"):
        return int(value)
    if isinstance(value, (bool, int, float)) and value in (0, 1):
        return int(value)
    raise UserError(f"{where} has label {value!r}; labels must be 1 (seen) or 0 (unseen)")


def _read_txt(path: Path, encoding: str) -> str:
    try:
        return path.read_text(encoding=encoding)
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not valid {encoding} text (byte {e.start}); give its encoding with --encoding") \
            from None


def load_books(path: str | Path, *, encoding: str = "utf-8", flag: str = "--books",
               data_dir: str | Path | None = None) -> tuple[list[Book], dict]:
    """(books, {file: sha256}) from a folder of .txt files (title = file stem; unlabeled), a folder with ``seen/``
    and / or ``unseen/`` subfolders of .txt files (labels 1 / 0), or a .jsonl / .csv / .tsv / .parquet file or a
    TFDS dataset ``tfds:NAME[/CONFIG][:SPLIT]`` (built in ``data_dir``) with ``title`` and ``text`` fields (and
    optionally ``label``, on every row or none)."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise UserError(f"unknown --encoding {encoding!r}") from None
    spec = isinstance(path, str) and path.startswith("tfds:")
    path = path if spec else Path(path)
    if not spec and path.is_dir():
        parts = [(path / sub, label) for sub, label in (("seen", 1), ("unseen", 0)) if (path / sub).is_dir()]
        top = sorted(path.glob("*.txt"))
        if parts and top:
            raise UserError(f"{flag} {path}: holds .txt files beside seen/ or unseen/; put every book in seen/ or "
                            "unseen/, or use no subfolders")
        files = [(f, label) for folder, label in parts for f in sorted(folder.glob("*.txt"))] if parts else \
            [(f, None) for f in top]
        if not files:
            raise UserError(f"{flag} {path}: no .txt files (expected BOOK.txt files, or seen/ and unseen/ "
                            "subfolders of them)")
        books = [Book(f.stem, _read_txt(f, encoding), label, str(f)) for f, label in files]
        digests = {str(f): sha256(f) for f, _ in files}
    elif spec or path.is_file():
        ds = data.load(path, data_dir, "text", None, encoding=encoding, extra=("title", "label"))
        books = []
        for i, (text, title, label) in enumerate(zip(ds.texts, ds.extra["title"], ds.extra["label"])):
            where = f"{path}: record {i + 1}"
            if title is None or not str(title).strip():
                raise UserError(f"{where} has no 'title'; every book needs a title and a text")
            books.append(Book(str(title), text, book_label(label, where), where))
        labeled = [b.label is not None for b in books]
        if any(labeled) and not all(labeled):
            raise UserError(f"{flag} {path}: record {labeled.index(False) + 1} has no 'label' but others do; label "
                            "every book (1 = seen, 0 = unseen) or none")
        digests = ds.files
    else:
        raise UserError(f"{flag} {path}: not found (a folder of .txt books or a .jsonl file with title and text)")
    seen = {}
    for b in books:
        if b.title in seen:
            raise UserError(f"{flag} {path}: two books titled {b.title!r} ({seen[b.title]} and {b.source}); titles "
                            "must be unique")
        seen[b.title] = b.source
    return books, digests


def as_books(books, encoding: str, flag: str, data_dir: str | Path | None = None) -> tuple[list[Book], dict]:
    """(books, {file: sha256}) of ``books``: a path (``load_books`` with ``encoding``; ``flag`` names the option in
    its messages) or a sequence of ``Book`` or dicts with ``title``, ``text`` (and ``label``; no files then)."""
    if isinstance(books, (str, Path)):
        return load_books(books, encoding=encoding, flag=flag, data_dir=data_dir)
    out = [b if isinstance(b, Book) else Book(str(b["title"]), b["text"], book_label(b.get("label"), f"{flag} book "
                                                                                  f"{b['title']!r}"))
           for b in books]
    return out, {}
