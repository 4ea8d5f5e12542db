"""The readers: labeled or unlabeled texts from JSONL / CSV / TSV / Parquet files, the bundled WikiMIA, and the
``--data`` argument (a file or a ``tfds:`` spec)."""
from __future__ import annotations

import argparse
import codecs
import csv
import io
import json
import os
import re
from pathlib import Path
from typing import Iterator, Sequence

from mia_jax.data.dataset import TEXT_FIELDS, TFDS_DATASETS, Dataset, default_text_field, label_of  # noqa: F401
from mia_jax.errors import UserError
from mia_jax.runs.entry import input_file
from mia_jax.runs.files import sha256

FILES = Path(__file__).parent / "files"
WIKIMIA_LENGTHS = (32, 64, 128, 256)
def check_encoding(encoding: str) -> bool:
    """Refuse an unknown (or non-text) encoding name; True when the encoding is line-splittable, i.e. a newline
    or carriage return is the single byte 0x0a / 0x0d and never part of another character (UTF-8, Latin-1,
    cp1252, Shift-JIS, ...; not UTF-16 or UTF-32)."""
    try:
        "".encode(encoding)
        b"".decode(encoding)
    except (LookupError, TypeError, ValueError):
        raise UserError(f"unknown text encoding {encoding!r}; give a name such as utf-8, latin-1, cp1252 or "
                        "utf-16") from None
    try:
        return b"\r\n\n\r ab".decode(encoding) == "\r\n\n\r ab"
    except UnicodeDecodeError:
        return False


def _decode_error(path: Path, lineno: int, offset: int, byte: int, encoding: str, head: bytes) -> UserError:
    if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig"):
        if head.startswith((b"\xff\xfe", b"\xfe\xff")):
            fix = "the file starts with a UTF-16 byte-order mark: pass --encoding utf-16 or re-save it as UTF-8"
        else:
            fix = "re-save the file as UTF-8 or pass its encoding, e.g. --encoding latin-1 or --encoding cp1252"
    else:
        fix = "pass the file's actual encoding with --encoding (latin-1 accepts any byte) or re-save it as UTF-8"
    return UserError(f"{path}: line {lineno} is not valid {encoding} (byte 0x{byte:02x} at file offset {offset}); "
                     f"{fix}")


_LONE_CR = re.compile(rb"(?<=\r)(?!\n)")  # a line break that is a carriage return alone (classic Mac files)


def _lines(path: Path, encoding: str):
    """Yield (line number from 1, decoded line with its line ending) of a text file.

    Lines end at \\n, \\r\\n or a lone \\r. A byte-order mark at the start of the file is dropped (utf-8-sig
    behaviour for any encoding). Bytes that are not valid in ``encoding`` raise a UserError naming the line,
    the byte and its offset in the file (from 0). Line-splittable encodings are read a line at a time; others
    (UTF-16, UTF-32) are decoded whole.
    """
    splittable = check_encoding(encoding)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    with f:
        head = f.read(4)
        f.seek(0)
        if not splittable:
            data = f.read()
            try:
                text = data.decode(encoding)
            except UnicodeDecodeError as e:
                try:
                    before = data[:e.start].decode(encoding)
                    lineno = len(io.StringIO(before, newline="").readlines()) + (before[-1:] in ("", "\n", "\r"))
                except UnicodeDecodeError:
                    lineno = data.count(b"\n", 0, e.start) + 1
                raise _decode_error(path, lineno, e.start, data[e.start], encoding, head) from None
            yield from enumerate(io.StringIO(text.removeprefix("\ufeff"), newline=""), 1)
            return
        lineno = offset = 0
        for raw in f:
            for piece in (_LONE_CR.split(raw) if b"\r" in raw else (raw,)):
                if not piece:
                    continue
                lineno += 1
                try:
                    line = piece.decode(encoding)
                except UnicodeDecodeError as e:
                    raise _decode_error(path, lineno, offset + e.start, piece[e.start], encoding, head) from None
                offset += len(piece)
                yield lineno, (line.removeprefix("\ufeff") if lineno == 1 else line)


def _json_rows(path: Path, encoding: str):
    """(line number, value) of each non-blank line. An error's column is that of the line as an editor shows
    it: characters (not bytes) from 1, leading whitespace included, after a byte-order mark."""
    for lineno, line in _lines(path, encoding):
        line = line.rstrip("\r\n")  # json counts a line ending inside the text as a new line (column 1 after it)
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            where = "the end of the line" if e.pos >= len(line) else f"column {e.pos + 1}"
            raise UserError(f"{path}: line {lineno} is not valid JSON ({e.msg} at {where}); each line must be one "
                            "JSON object") from None


def _csv_rows(path: Path, encoding: str, delimiter: str, header_out: list | None = None):
    """Rows of a CSV / TSV file as dicts, each with the line number where it starts (a quoted field may span
    lines). Unclosed quotes and rows with more or fewer fields than the header are refused, never read as a
    silently merged or cut row. ``header_out``: the header's field names are appended to it."""
    start = [0, None]  # the line last read, the line where the current row starts

    def lines():
        for lineno, line in _lines(path, encoding):
            start[0] = lineno
            if start[1] is None and line not in ("\n", "\r\n", "\r"):  # the reader skips blank lines
                start[1] = lineno
            yield line

    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # book-length texts are fields too
    reader = csv.DictReader(lines(), delimiter=delimiter, strict=True)
    kind = "TSV" if delimiter == "\t" else "CSV"

    def read(step):
        try:
            return step()
        except csv.Error as e:
            if "unexpected end of data" in str(e):
                raise UserError(f"{path}: line {start[1]}: a quoted field starting on this line is never closed; "
                                "close the double quote (a quote inside a quoted field is written twice: \"\")"
                                ) from None
            raise UserError(f"{path}: line {start[0]} is not valid {kind} ({e}); quote a field that holds the "
                            "delimiter, a quote or a line break, writing each quote inside it twice") from None

    if read(lambda: reader.fieldnames) is None:  # reads the header line; None: an empty file
        return
    n_fields = len(reader.fieldnames)
    if header_out is not None:
        header_out.append(list(reader.fieldnames))
    start[1] = None
    while (row := read(lambda: next(reader, None))) is not None:
        where, start[1] = start[1], None
        if None in row:
            raise UserError(f"{path}: row {where} has {n_fields + len(row[None])} fields, the header has {n_fields}; "
                            f"quote a field that holds the delimiter {delimiter!r}")
        if None in row.values():
            n = sum(v is not None for v in row.values())
            raise UserError(f"{path}: row {where} has {n} field(s), the header has {n_fields}; give every row one "
                            "value per column")
        yield where, row


def parquet_rows(path: Path, start: int = 0) -> Iterator[tuple[int, dict]]:
    """(row number from 1, row dict) of a Parquet file from row ``start`` on, one row group in memory at a time (the
    row groups before ``start`` are skipped by their metadata, never read)."""
    import pyarrow as pa  # a dependency, imported here: only .parquet input pays its start-up time
    import pyarrow.parquet as pq  # (as above)

    try:
        pf = pq.ParquetFile(path)
        first = 0
        for g in range(pf.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if first + n > start:
                rows = pf.read_row_group(g).to_pylist()
                for k in range(max(start - first, 0), n):
                    yield first + k + 1, rows[k]
            first += n
    except (OSError, ValueError, pa.ArrowException) as e:
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{path}: cannot read it as Parquet ({msg}); the file is corrupt or not Parquet: re-export "
                        "it, or give a .jsonl / .csv file") from None


def read_rows(path: Path, encoding: str = "utf-8"):
    """Yield (row number, dict) from a .jsonl / .json / .csv / .tsv / .parquet file. The row number is the
    line (from 1) where the row starts in a text file, the row's position (from 1) in a Parquet file."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        yield from _json_rows(path, encoding)
    elif suffix in (".csv", ".tsv"):
        yield from _csv_rows(path, encoding, "\t" if suffix == ".tsv" else ",")
    elif suffix == ".parquet":
        yield from parquet_rows(path)
    else:
        raise UserError(f"{path}: unsupported file type {suffix!r}; use .jsonl, .csv, .tsv or .parquet")


DATA_SUFFIXES = (".jsonl", ".json", ".ndjson", ".csv", ".tsv", ".parquet")


def check_data_file(path: str | Path) -> Path:
    """``path`` is an existing data file: a UserError saying what it is otherwise (missing; a folder, with the
    data files in it; not a regular file)."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix.lower() in DATA_SUFFIXES)
        listed = f"data files in it: {', '.join(found[:10])}{', ...' if len(found) > 10 else ''}" if found else (
            "it holds no .jsonl, .csv, .tsv or .parquet file")
        raise UserError(f"{path} is a folder, not a data file; pass one file ({listed})")
    if not path.exists():
        raise UserError(f"data file not found: {path}")
    if not path.is_file():
        raise UserError(f"{path} is not a regular file; pass a .jsonl, .csv, .tsv or .parquet data file")
    return path


def read_csv(path: str | Path, columns: Sequence[str] = (), encoding: str = "utf-8") -> list[dict[str, str]]:
    """The rows of a CSV (or .tsv) file as dicts, read strictly: a UTF-8 byte-order mark is dropped, bytes that
    are not valid ``encoding``, an unclosed quote or a row with more or fewer fields than the header are a
    UserError naming the file and the line, as is an empty file or a header without one of ``columns``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} is a folder, not a CSV file" if path.is_dir() else f"file not found: {path}")
    check_encoding(encoding)
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    header: list[list[str]] = []
    rows = [row for _, row in _csv_rows(path, encoding, delimiter, header_out=header)]
    if not header:
        raise UserError(f"{path}: the file is empty; expected a header line ({', '.join(columns) or 'column names'})")
    missing = [c for c in columns if c not in header[0]]
    if missing:
        raise UserError(f"{path}: no column {missing[0]!r} (columns: {', '.join(header[0])}); the file is not the "
                        "one expected, or was edited")
    return rows


def record(row, path, where: int, text_field: str | None, label_field: str | None) -> tuple[str, int | None, str]:
    """(text, 0/1 label or None, the text field) of the raw ``row`` number ``where`` of the file ``path``: a bare
    string is the text; an object's text is its ``text_field`` (None: :func:`default_text_field` of this row, which
    the caller keeps for the rows after it), its label its ``label_field`` (None: unlabeled). Anything else is a
    UserError naming the row."""
    if isinstance(row, str):
        row = {text_field or TEXT_FIELDS[0]: row}
    if not isinstance(row, dict):
        kind = {list: "a list", int: "a number", float: "a number", bool: "true/false"}.get(type(row), "null")
        raise UserError(f"{path}: row {where} is {kind}, expected an object with a {text_field or 'text'!r} field "
                        "(or a string); each line must be one JSON object")
    if text_field is None:
        text_field = default_text_field(row, f"{path}: row {where}")
    for fld in (text_field, label_field):
        if fld is not None and fld not in row:
            raise UserError(f"{path}: row {where} has no field {fld!r} (fields: {', '.join(map(str, row))}); "
                            "choose the field with --text-field / --label-field")
    text = row[text_field]
    if not isinstance(text, str):
        raise UserError(f"{path}: row {where} field {text_field!r} is {type(text).__name__}, expected a string")
    return text, label_of(row[label_field], path, where) if label_field is not None else None, text_field


def load_records(path: str | Path, text_field: str | None = None, label_field: str | None = "label",
                 name: str | None = None, encoding: str = "utf-8", extra: Sequence[str] = ()) -> Dataset:
    """Read texts (and 0/1 labels unless ``label_field`` is None) from a file.

    ``text_field`` None: the one of :data:`TEXT_FIELDS` (``text`` or ``input``) that the file's first object has
    (both or neither: refused), the same for every row (``Dataset.text_field`` holds the field read).

    A row that is a bare JSON string is taken as the text (MIMIR's format); empty texts are kept
    (the runner records them as skipped with a reason) so that row indices stay those of the file.
    Text files (JSONL, CSV, TSV) are decoded with ``encoding`` (any Python codec name: utf-8, latin-1,
    cp1252, utf-16, ...); a byte-order mark at the start is dropped, and bytes that are not valid in the
    encoding are refused with their line and file offset. Parquet is always UTF-8. ``extra``: other fields to
    keep (``Dataset.extra``; None where a row has none).
    """
    check_encoding(encoding)
    path = Path(path)
    check_data_file(path)
    texts, labels = [], []
    kept: dict[str, list] = {f: [] for f in extra}
    for where, row in read_rows(path, encoding):
        text, label, text_field = record(row, path, where, text_field, label_field)
        texts.append(text)
        if label_field is not None:
            labels.append(label)
        for f in extra:
            kept[f].append(row.get(f) if isinstance(row, dict) else None)
    if not texts:
        raise UserError(f"{path}: no rows (the file is empty or holds only blank lines or a header); give a file "
                        "with at least one row")
    return Dataset(texts, labels if label_field is not None else None, name or path.stem, {str(path): sha256(path)},
                   kept, text_field)


def load(spec: str | Path, data_dir: str | os.PathLike | None = None, text_field: str | None = None,
         label_field: str | None = "label", encoding: str = "utf-8", extra: Sequence[str] = ()) -> Dataset:
    """The texts ``--data`` names: a TFDS dataset ``tfds:NAME[/CONFIG][:SPLIT]`` built in ``data_dir``
    (:func:`mia_jax.data.tfds_source.load`; ``encoding`` does not apply) or a file (:func:`load_records`)."""
    if isinstance(spec, str) and spec.startswith("tfds:"):
        # here, not at the top: tfds_source imports tensorflow_datasets (~0.3 s), which only a tfds: spec needs
        from mia_jax.data import tfds_source
        return tfds_source.load(spec, data_dir, text_field, label_field, extra)
    return load_records(spec, text_field, label_field, encoding=encoding, extra=extra)


def duplicate_report(texts: list[str], labels: list[int] | None = None, max_examples: int = 5) -> dict:
    """Exact duplicates among ``texts`` (no normalisation: a change of case or whitespace is a different text).

    Returns a JSON-ready dict: ``n_texts``; ``n_duplicate_texts``, the rows whose text equals the text of an
    earlier row; ``n_conflicting_texts``, the distinct texts that occur with both label 1 and label 0 (always
    0 without labels); ``duplicate_examples``, up to ``max_examples`` pairs ``[row, earlier row]`` (indices from
    0, the earlier row being the text's first occurrence); ``conflicting_examples``, for up to ``max_examples``
    conflicting texts (in order of first occurrence) the indices of all their rows.
    """
    if labels is not None and len(labels) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    rows: dict[str, list[int]] = {}
    duplicates = []
    for i, text in enumerate(texts):
        seen = rows.setdefault(text, [])
        if seen:
            duplicates.append([i, seen[0]])
        seen.append(i)
    conflicting = [] if labels is None else [
        where for where in rows.values() if len(where) > 1 and len({int(labels[i]) for i in where}) > 1]
    return {"n_texts": len(texts), "n_duplicate_texts": len(duplicates), "n_conflicting_texts": len(conflicting),
            "duplicate_examples": duplicates[:max_examples], "conflicting_examples": conflicting[:max_examples]}


def wikimia(length: int = 32) -> Dataset:
    """The bundled WikiMIA split of the given length (Shi et al. 2023; MIT licence, see files/LICENSE.md)."""
    if length not in WIKIMIA_LENGTHS:
        raise UserError(f"WikiMIA has lengths {', '.join(map(str, WIKIMIA_LENGTHS))}; got {length}")
    return load_records(FILES / f"WikiMIA_length{length}.jsonl", "input", "label", name=f"wikimia-{length}")


def data_input(text: str) -> Path | str:
    """``--data``: an existing, readable file (:func:`input_file`) or a TFDS dataset ``tfds:NAME[/CONFIG][:SPLIT]``
    (its syntax checked here; the dataset itself when it is read, :mod:`mia_jax.data.tfds_source`)."""
    if not text.startswith("tfds:"):
        return input_file(text)
    # here, not at the top: the spec's parser lives with the TFDS reader, which imports tensorflow_datasets
    from mia_jax.data import tfds_source
    try:
        tfds_source.parse_spec(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text
