"""WikiMIA-concat (Min-K%++ section 4.4) and the same construction on a contamination corpus: texts made of
non-member text followed by member text, for online (window-level) detection with ``eval --window``.

The construction follows the paper: "each input text is created by concatenating a training text at the end of a
non-training text ... Both the training and non-training text have random length, varying among {32, 64, 128}";
windows are then labeled by the part they fall in. The authors publish the dataset (``zjysteven/WikiMIA_concat``,
387 rows) and the script that scores it (``run_concat.py``: 32-*word* chunks of each row, one label per chunk), not
the code that built it; so where the paper is silent we chose, and say so:

* One non-member part then one member part by default (``per_side``); each text is used at most once in the whole
  output, so never twice in one record. No pure non-member texts are added by default (neither the paper nor the
  authors' data has any: the negatives are the non-member windows before each member part); ``n_controls`` adds
  records made of non-member text only (label 0, every window labeled 0), whose later windows are negatives at the
  positions of the member windows, because a member window always follows a non-member prefix and a longer
  context alone lowers the loss.
* Lengths are counted in whitespace-separated words (WikiMIA's length-L texts have exactly L words, and a shorter
  WikiMIA text is the first words of the longer one of the same article). With ``lengths``, each part is the first
  L words of a text with at least L words; the lengths are balanced (each used by the same number of parts, the
  remainder going to the shortest), placed in random order, so how many records can be made is known beforehand
  (335 for WikiMIA at 32 / 64 / 128 words: 111 non-member articles reach 128 words).
* The windows here are of tokens (``--window``), not of 32 words: a window can straddle the boundary and is then
  left out of the metrics (``audits/windowed.py``). ``member_from`` is the character offset right after the
  non-member part: the separator (whitespace) counts with the member part, because byte-level BPE and SentencePiece
  tokenizers attach a word's leading space to its first token (" Gu" of " Gubernatorial" starts at the space);
  were ``member_from`` one character later, that token would count as non-member text.
"""
from __future__ import annotations

import csv
import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax import data as data_io
from mia_jax.engine import windowed
from mia_jax.data import Dataset
from mia_jax.errors import UserError
from mia_jax.runs.files import sha256, write_all
from mia_jax.evaluation.report import markdown_table

PAPER_LENGTHS = (32, 64, 128)
WINDOW_TEXT = "window_text"  # the last column of windows.csv: each window's decoded tokens
_WORD = re.compile(r"\S+")


def cut_words(text: str, n: int) -> str | None:
    """The text through its ``n``-th whitespace-separated word (verbatim), or None when it has fewer words."""
    for i, m in enumerate(_WORD.finditer(text), 1):
        if i == n:
            return text[: m.end()]
    return None


def _n_words(text: str) -> int:
    return sum(1 for _ in _WORD.finditer(text))


def _length_counts(n_parts: int, lengths: Sequence[int]) -> dict[int, int]:
    """Each length used by ``n_parts // len(lengths)`` parts, the remainder one each to the shortest lengths."""
    ls = sorted(lengths)
    return {L: n_parts // len(ls) + (i < n_parts % len(ls)) for i, L in enumerate(ls)}


def _fits(n_words: np.ndarray, n_parts: int, lengths: Sequence[int] | None) -> bool:
    """Whether ``n_parts`` distinct texts can be drawn (each long enough for its length)."""
    if lengths is None:
        return n_parts <= n_words.size
    need = 0
    for L, c in sorted(_length_counts(n_parts, lengths).items(), reverse=True):  # nested pools: longest first
        need += c
        if need > int((n_words >= L).sum()):
            return False
    return True


def _draw(rng: np.random.Generator, n_words: np.ndarray, n_parts: int, lengths: Sequence[int] | None):
    """(text index, length or None) for each of ``n_parts`` slots, distinct texts, lengths in random order."""
    if lengths is None:
        return [(int(i), None) for i in rng.choice(n_words.size, size=n_parts, replace=False)]
    counts = _length_counts(n_parts, lengths)
    slots = rng.permutation(np.repeat(sorted(counts), [counts[L] for L in sorted(counts)]))
    chosen = np.full(n_parts, -1)
    used = np.zeros(n_words.size, bool)
    for L in sorted(counts, reverse=True):
        where = np.flatnonzero(slots == L)
        pick = rng.choice(np.flatnonzero(~used & (n_words >= L)), size=where.size, replace=False)
        chosen[where] = pick
        used[pick] = True
    return [(int(i), int(L)) for i, L in zip(chosen, slots)]


def _check_args(per_side, lengths, sep: str) -> tuple[tuple[int, int], tuple[int, ...] | None]:
    k = (per_side, per_side) if isinstance(per_side, int) else tuple(per_side)
    if len(k) != 2 or any(not isinstance(x, (int, np.integer)) or x < 1 for x in k):
        raise UserError(f"per_side must be a count of at least 1, or (non-member parts, member parts); got {per_side}")
    if lengths is not None:
        lengths = tuple(int(L) for L in lengths)
        if not lengths or min(lengths) < 1 or len(set(lengths)) != len(lengths):
            raise UserError(f"lengths must be distinct word counts of at least 1, got {list(lengths)}")
    if sep.strip():
        raise UserError(f"sep must be whitespace (it is counted with the member part), got {sep!r}")
    return (int(k[0]), int(k[1])), lengths


def max_records(nonmembers: Sequence[str], members: Sequence[str], *, per_side=1, lengths=None,
                n_controls: int = 0) -> int:
    """The most records :func:`concat_texts` can make from these texts (0: none)."""
    (k0, k1), lengths = _check_args(per_side, lengths, " ")
    w0 = np.array([_n_words(t) for t in nonmembers], np.int64)
    w1 = np.array([_n_words(t) for t in members], np.int64)
    n = min(w0.size // k0, w1.size // k1)
    while n > 0 and not (_fits(w0, n * k0 + n_controls * (k0 + k1), lengths) and _fits(w1, n * k1, lengths)):
        n -= 1
    return n


def concat_texts(nonmembers: Sequence[str], members: Sequence[str], *, n_texts: int | None = None, per_side=1,
                 lengths: Sequence[int] | None = None, n_controls: int = 0, seed=0, sep: str = " ") -> list[dict]:
    """Records ``{"text", "label": 1, "member_from", "parts"}``: ``per_side`` non-member parts, then member parts,
    joined by ``sep``; ``text[:member_from]`` is exactly the non-member parts, ``text[member_from:]`` is ``sep`` and
    the member parts. ``parts``: per part ``{"label", "index" (into its list), "start", "end" (characters of the
    text), "words" (its length, None without ``lengths``)}``. With ``lengths`` each part is the first L words of a
    text, L drawn from ``lengths`` (balanced, see the module docstring); without, whole texts (stripped).
    ``n_texts`` (default: the most that can be made) records, then ``n_controls`` records of non-member parts only
    (label 0, ``member_from`` = the text's length: every window is non-member). No text is used twice in the
    output; the same ``seed`` gives the same records. ``per_side``: a count, or (non-member, member) counts."""
    (k0, k1), lengths = _check_args(per_side, lengths, sep)
    for side, texts in (("non-member", nonmembers), ("member", members)):
        empty = [i for i, t in enumerate(texts) if not t.strip()]
        if empty:
            raise UserError(f"{side} texts {empty[:5]} are empty; drop them first")
    if n_controls < 0:
        raise UserError(f"n_controls must be at least 0, got {n_controls}")
    most = max_records(nonmembers, members, per_side=(k0, k1), lengths=lengths, n_controls=n_controls)
    what = (f"{k0} non-member and {k1} member part{'s' if k0 + k1 > 2 else ''} per record"
            + (f" of {'/'.join(map(str, lengths))} words" if lengths else "")
            + (f" and {n_controls} control records" if n_controls else ""))
    if n_texts is None:
        n_texts = most
        if most < 1:
            raise UserError(f"too few texts for one record of {what}: {len(nonmembers)} non-member and "
                            f"{len(members)} member texts")
    elif n_texts < 1 or n_texts > most:
        raise UserError(f"cannot make {n_texts} records of {what} from {len(nonmembers)} non-member and "
                        f"{len(members)} member texts (each used once): at most {most}")
    rng = np.random.default_rng(seed)
    w0 = np.array([_n_words(t) for t in nonmembers], np.int64)
    w1 = np.array([_n_words(t) for t in members], np.int64)
    drawn0 = _draw(rng, w0, n_texts * k0 + n_controls * (k0 + k1), lengths)
    drawn1 = _draw(rng, w1, n_texts * k1, lengths)
    out = []
    for r in range(n_texts + n_controls):
        if r < n_texts:
            sides = [(0, nonmembers, drawn0[r * k0: (r + 1) * k0]), (1, members, drawn1[r * k1: (r + 1) * k1])]
        else:
            s = n_texts * k0 + (r - n_texts) * (k0 + k1)
            sides = [(0, nonmembers, drawn0[s: s + k0 + k1])]
        text, parts, member_from = "", [], None
        for label, texts, drawn in sides:
            for i, L in drawn:
                piece = cut_words(texts[i], L) if L is not None else texts[i].strip()
                if text:
                    if label == 1 and member_from is None:
                        member_from = len(text)  # the separator counts with the member part
                    text += sep
                parts.append({"label": label, "index": i, "start": len(text), "end": len(text) + len(piece),
                              "words": L})
                text += piece
        out.append({"text": text, "label": int(member_from is not None),
                    "member_from": member_from if member_from is not None else len(text), "parts": parts})
    return out


def _records_dataset(records: list[dict], name: str, files: dict):
    extra = {k: [r.get(k) for r in records] for k in ("member_from", "parts", "dataset") if k in records[0]}
    return Dataset([r["text"] for r in records], [r["label"] for r in records], name, dict(files), extra)


def wikimia_concat(lengths: Sequence[int] = PAPER_LENGTHS, n_texts: int | None = None, *, n_controls: int = 0,
                   seed=0, sep: str = " "):
    """WikiMIA-concat as a :class:`mia_jax.data.Dataset` (``extra``: ``member_from``, ``parts``): one non-member
    then one member WikiMIA text, each of a length drawn from ``lengths`` (words; the paper: 32, 64, 128). Texts are
    drawn per article (the longest version in the bundled files, cut to the length drawn), so no article is used
    twice; each part equals the WikiMIA text of its length. ``parts[i]["index"]``: the article's row in the
    length-32 file among that file's texts of the part's label."""
    lengths = tuple(lengths)
    bad = [L for L in lengths if L not in data_io.WIKIMIA_LENGTHS]
    if bad or not lengths:
        raise UserError(f"WikiMIA has lengths {', '.join(map(str, data_io.WIKIMIA_LENGTHS))}; got {list(lengths)}")
    files: dict = {}
    articles: dict[int, dict[str, str]] = {0: {}, 1: {}}  # label -> {first 32 words: longest text}
    for L in [x for x in data_io.WIKIMIA_LENGTHS if x <= max(lengths)]:
        ds = data_io.wikimia(L)
        files.update(ds.files)
        for text, y in zip(ds.texts, ds.labels):
            articles[y][cut_words(text, data_io.WIKIMIA_LENGTHS[0])] = text  # later (longer) versions replace
    records = concat_texts(list(articles[0].values()), list(articles[1].values()), n_texts=n_texts, lengths=lengths,
                           n_controls=n_controls, seed=seed, sep=sep)
    return _records_dataset(records, "wikimia-concat", files)


def contamination_concat(eval_jsonl: str | Path, *, n_texts: int | None = None, per_side=1,
                         lengths: Sequence[int] | None = None, n_controls: int = 0, seed: int = 0, sep: str = " ",
                         datasets: Sequence[str] | None = None) -> list[dict]:
    """The construction on a contamination run's ``corpus/eval.jsonl`` (fields text, label, dataset, id), within
    each dataset: members are the texts trained into the model, non-members those held out. Records carry
    ``dataset`` and each part its ``id``; ``n_texts`` is per dataset (default: the most each allows). Each dataset's
    draw is seeded by (``seed``, its name), so one dataset's records do not depend on the others."""
    ds = data_io.load_records(eval_jsonl, "text", "label", extra=("dataset", "id"))
    names = list(dict.fromkeys(ds.extra["dataset"]))
    if datasets is not None:
        missing = [d for d in datasets if d not in names]
        if missing:
            raise UserError(f"{eval_jsonl}: no dataset {', '.join(missing)} (datasets: {', '.join(map(str, names))})")
        names = list(datasets)
    out = []
    for name in names:
        rows = [i for i, d in enumerate(ds.extra["dataset"]) if d == name]
        side = {y: [i for i in rows if ds.labels[i] == y] for y in (0, 1)}
        try:
            recs = concat_texts([ds.texts[i] for i in side[0]], [ds.texts[i] for i in side[1]], n_texts=n_texts,
                                per_side=per_side, lengths=lengths, n_controls=n_controls,
                                seed=[seed, zlib.crc32(str(name).encode())], sep=sep)
        except UserError as e:
            raise UserError(f"dataset {name}: {e}") from None
        for r in recs:
            for p in r["parts"]:
                p["id"] = ds.extra["id"][side[p["label"]][p["index"]]]
            out.append({**r, "dataset": name})
    return out


def check_out_file(path: str | Path, flag: str = "--out") -> Path:
    """An output file that can be written: not an existing folder, in an existing folder (UserError otherwise)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path} is an existing folder; give the path of the file to write (e.g. "
                        f"{path / 'concat.jsonl'})")
    if not path.parent.is_dir():
        raise UserError(f"{flag} {path}: folder {path.parent} does not exist")
    return path


def write_jsonl(records: Sequence[dict], path: str | Path) -> Path:
    """One JSON object per record for ``mia-jax eval --data PATH --window N``: the text under ``input`` (eval's
    default ``--text-field``), ``label``, ``member_from`` (eval's default ``--member-from-field``) and the rest.
    Written whole or not at all (a temporary file, then renamed)."""
    path = check_out_file(path)
    write_all(path.parent, {path.name: "".join(
        json.dumps({"input": r["text"], **{k: v for k, v in r.items() if k != "text"}}) + "\n" for r in records)})
    return path


def read_windows_csv(run_dir: str | Path) -> list[list[str]]:
    """The rows (header first) of an ``eval --window`` run's ``windows.csv``, or, where it is absent, of
    ``windows.csv.gz`` (the same file gzipped, e.g. in a committed results folder). Columns: text, window, n_tokens,
    label, one per method, then ``window_text`` (the window's decoded tokens; absent from files written before it
    was added)."""
    run_dir = Path(run_dir)
    plain, packed = run_dir / "windows.csv", run_dir / "windows.csv.gz"
    if plain.is_file():
        with open(plain, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    elif packed.is_file():
        try:
            with gzip.open(packed, "rt", newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
        except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip.BadGzipFile is an OSError
            raise UserError(f"{packed}: not a readable gzip file ({e})") from None
    else:
        raise UserError(f"{run_dir}: no windows.csv (or windows.csv.gz); run `mia-jax eval ... --window N --out "
                        f"{run_dir}` first")
    if not rows or rows[0][:4] != ["text", "window", "n_tokens", "label"]:
        where = plain if plain.is_file() else packed
        raise UserError(f"{where}: not an eval --window windows.csv (header text, window, n_tokens, label, methods, "
                        "window_text)")
    return rows


def window_metrics(run_dir: str | Path, data: str | Path | None = None, *, by: str = "dataset",
                   method: str | None = None, n_bootstrap: int = 1000, seed: int = 0) -> dict:
    """Window-level metrics of a finished ``eval --window`` run per group of texts: ``{group: report}`` with
    :func:`mia_jax.engine.windowed.report` on each group's windows (labels and scores read back from the run's
    ``windows.csv``, or ``windows.csv.gz`` where there is no ``windows.csv``: :func:`read_windows_csv`), with the
    blind baseline's row on the windows' texts where the file has them (column ``window_text``). Groups:
    the ``by`` field of each row of ``data`` (the run's own ``--data`` file, checked against the SHA-256 in
    run.json), or one group ``"all"``."""
    run_dir = Path(run_dir)
    rows = read_windows_csv(run_dir)
    has_text = rows[0][-1] == WINDOW_TEXT
    methods = rows[0][4: len(rows[0]) - has_text]
    num = lambda s: float(s) if s != "" else None  # noqa: E731
    texts: dict[int, dict] = {}
    for r in rows[1:]:
        t = texts.setdefault(int(r[0]), {"n_tokens": [], "scores": {m: [] for m in methods}, "labels": [],
                                         "texts": []})
        t["texts"].append(r[4 + len(methods)] if has_text else None)
        t["n_tokens"].append(int(r[2]))
        t["labels"].append(int(r[3]) if r[3] != "" else None)
        for m, v in zip(methods, r[4: 4 + len(methods)]):
            t["scores"][m].append(num(v))
    groups = {i: "all" for i in texts}
    if data is not None:
        meta = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else {}
        digest = sha256(data)
        if digest not in (meta.get("data") or {}).get("files", {}).values():
            raise UserError(f"{data} is not the data file of the run in {run_dir} (SHA-256 differs from run.json)")
        values = data_io.load_records(data, "input", None, extra=(by,)).extra[by]
        groups = {i: values[i] for i in texts}
    method = method or next((m for m in methods if m.startswith("min_k_pp@")), methods[0])
    out = {}
    for g in dict.fromkeys(groups[i] for i in sorted(texts)):
        idx = [i for i in sorted(texts) if groups[i] == g]
        recs = [{"windows": {"n_tokens": texts[i]["n_tokens"], "scores": texts[i]["scores"]}} for i in idx]
        out[g] = windowed.report(recs, [texts[i]["labels"] for i in idx], methods, method=method, threshold=None,
                                 fpr=0.05, n_bootstrap=n_bootstrap, seed=seed,
                                 texts=[texts[i]["texts"] for i in idx] if has_text else None)
    return out


def window_metrics_markdown(reports: dict) -> str:
    """One markdown table per group (windows pooled over the group's texts)."""
    parts = []
    for g, rep in reports.items():
        head = f"{g}: {rep['n_labeled']} labeled windows ({rep['n_straddling']} straddling or unlabeled)"
        parts.append(head + "\n\n" + (markdown_table(rep["metrics"]) if "metrics" in rep
                                      else "(needs member and non-member windows)")
                     + (f"\n\n{rep['blind_note']}" if rep.get("blind_note") else ""))
    return "\n\n".join(parts)
