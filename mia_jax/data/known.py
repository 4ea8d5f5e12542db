"""Known-membership benchmarks, read from files the user has (nothing here downloads): MIMIR's n-gram splits (two
layouts), WikiMIA-24 and WikiMIA-25 (Parquet, as their Hugging Face datasets ship them) and OLMoMIA (JSONL, as its
authors' scripts write it). Each reader returns a :class:`KnownDataset`: texts, 0/1 labels (1 = member), every file
read with its SHA-256 (the run's fingerprint records them) and the caveats a reader of the results must know.

Where each layout comes from (read in the datasets' own code and cards):

- MIMIR (Duan et al. 2024, ``iamgroot42/mimir``): the Hub's loading script reads
  ``cache_100_200_1000_512/train/<domain>_<split>.jsonl`` (members) and ``.../test/<domain>_<split>.jsonl``
  (non-members), one JSON string per line, splits ``ngram_7_0.2``, ``ngram_13_0.2``, ``ngram_13_0.8``, the domain
  ``wikipedia_(en)`` spelled so. The local copy (``../shared/data/mimir``) is ``<split>/members/<domain>.jsonl`` and
  ``<split>/nonmembers/<domain>.jsonl``. Both are accepted. The Hub's script zips members with non-members, dropping
  the rows of the longer file beyond the shorter one; here every row of both files is read.
- WikiMIA-24 (Fu et al., MIA-Tuner, ``wjfu99/WikiMIA-24``): splits ``WikiMIA_length{32,64,128,256}``, columns
  ``input`` (string) and ``label`` (int64); its construction script (``update_wikimia.py``) takes members from
  Wikipedia's event categories of January 2015 - December 2016 and non-members from March - December 2024. The Hub's
  Parquet shards (``data/<split>-*.parquet``) and the authors' ``save_to_disk`` copy (``<split>/data-*.arrow``).
- WikiMIA-25 (``SimMIA/WikiMIA-25``): same columns, splits ``WikiMIA_length{32,64,128}`` (and ``paper_subset``, not
  offered here), files ``data/<split>-*.parquet``.
- OLMoMIA (Kim et al. 2024, EM-MIA, ``gyuwankim/em-mia/olmomia``): rows ``{"input", "label"}``; ``filter.py`` writes
  ``<model>_<L>_<N>.jsonl`` (members from OLMo-7B's training batches of steps 0-100k, non-members of steps
  400k-450k, token lengths in (L/2, L]), ``clustering.py`` writes ``<model>_<L>_<M>_{easy,medium,hard}.jsonl``. Its
  data is not on the Hub (the authors' README: "will be uploaded soon"); the Random and Mix settings of the paper are
  built by hand from these files: give such a file with ``--data``.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mia_jax import data
from mia_jax.errors import UserError
from mia_jax.runs.files import sha256

MIMIR_DOMAINS = ("arxiv", "dm_mathematics", "github", "hackernews", "pile_cc", "pubmed_central", "wikipedia_en")
MIMIR_SPLITS = ("ngram_7_0.2", "ngram_13_0.2", "ngram_13_0.8")
MIMIR_SPLIT = MIMIR_SPLITS[0]  # the default split (the one of the papers' MIMIR tables)
MIMIR_HUB_CACHE = "cache_100_200_1000_512"  # the Hub's folder of the seven Pile domains
MIMIR_HUB_NAMES = {"wikipedia_en": "wikipedia_(en)"}  # the Hub's spelling where it differs
MIMIR_CAVEATS = {
    "github": "MIMIR's GitHub domain: its members and non-members are separable for reasons other than membership "
              "(the SoK of Meeus et al. flags it; compare the blind baseline), so a high AUROC here says little about "
              "what the model memorised",
}
WIKIMIA_NEW = {  # benchmark -> (Hugging Face dataset, lengths, its non-members)
    "wikimia-24": ("wjfu99/WikiMIA-24", (32, 64, 128, 256), "Wikipedia events of March - December 2024 (members: "
                   "2015 - 2016)"),
    "wikimia-25": ("SimMIA/WikiMIA-25", (32, 64, 128), "newer than WikiMIA-24's, by its card, which gives no dates"),
}
OLMOMIA_SETTINGS = ("random", "easy", "medium", "hard")
_OLMOMIA_POOL = re.compile(r"^.+_\d+_\d+\.jsonl$")  # filter.py's <model>_<L>_<N>.jsonl


@dataclass
class KnownDataset(data.Dataset):
    """A :class:`mia_jax.data.Dataset` with the ``caveats`` of its ground truth (reported beside the metrics)."""
    caveats: list[str] = field(default_factory=list)


def _pick_dir(root: str | os.PathLike | None, what: str, hint: str) -> Path:
    if root is None:
        raise UserError(f"{what} is read from files you have (nothing is downloaded): pass --data-dir DIR, {hint}")
    path = Path(root)
    if not path.is_dir():
        raise UserError(f"{what}: --data-dir {path} is not a folder" if path.exists() else
                        f"{what}: --data-dir {path} does not exist")
    return path


# ---------------------------------------------------------------------------------------------------------- MIMIR


def _mimir_candidates(root) -> list[Path]:
    """The folders MIMIR is looked for in: ``root``; else ``$MIA_JAX_MIMIR`` and its parent (it names the
    ngram_7_0.2 folder); else ``shared/data/mimir`` beside the working directory or this repository."""
    if root:
        return [Path(root)]
    if os.environ.get("MIA_JAX_MIMIR"):
        env = Path(os.environ["MIA_JAX_MIMIR"])
        return [env, env.parent]
    rel = Path("shared", "data", "mimir")
    return list(dict.fromkeys([Path.cwd().parent / rel, Path(__file__).resolve().parents[3] / rel]))


def _mimir_pair(base: Path, domain: str, split: str) -> tuple[Path, Path] | None:
    """(members file, non-members file) of ``domain`` / ``split`` under ``base`` in either layout; None when
    ``base`` holds neither layout."""
    names = [domain, MIMIR_HUB_NAMES.get(domain, domain)]
    for folder in (base / split, base):
        if (folder / "members").is_dir() and (folder / "nonmembers").is_dir():
            if folder == base and base.name in MIMIR_SPLITS and base.name != split:
                raise UserError(f"MIMIR: {base} is the {base.name} split, not {split}; pass the folder of {split} "
                                "(or the folder holding both) with --data-dir")
            name = next((n for n in names if (folder / "members" / f"{n}.jsonl").exists()), domain)
            return folder / "members" / f"{name}.jsonl", folder / "nonmembers" / f"{name}.jsonl"
    for folder in (base / MIMIR_HUB_CACHE, base):
        if (folder / "train").is_dir() and (folder / "test").is_dir():
            name = next((n for n in names if (folder / "train" / f"{n}_{split}.jsonl").exists()), names[-1])
            return folder / "train" / f"{name}_{split}.jsonl", folder / "test" / f"{name}_{split}.jsonl"
    return None


def mimir_files(domain: str, split: str = MIMIR_SPLIT, root: str | os.PathLike | None = None,
                flag: str = "--data-dir") -> tuple[Path, Path]:
    """(members file, non-members file) of MIMIR's ``domain`` / ``split`` under ``root`` (see
    :func:`_mimir_candidates`); a UserError naming where it looked and the option (``flag``) that gives the folder
    when they are not there."""
    if domain not in MIMIR_DOMAINS:
        raise UserError(f"unknown MIMIR domain {domain!r}; domains: {', '.join(MIMIR_DOMAINS)}")
    if split not in MIMIR_SPLITS:
        raise UserError(f"unknown MIMIR split {split!r}; splits: {', '.join(MIMIR_SPLITS)}")
    candidates = _mimir_candidates(root)
    pair = next((p for c in candidates if c.is_dir() and (p := _mimir_pair(c, domain, split))), None)
    if pair is None:
        raise UserError(f"MIMIR {split} not found (looked in {', '.join(map(str, candidates))}); pass {flag}: "
                        f"the folder holding {split}/members/ and nonmembers/, or the Hub's {MIMIR_HUB_CACHE}/")
    return pair


def mimir(domain: str, split: str = MIMIR_SPLIT, root: str | os.PathLike | None = None) -> KnownDataset:
    """MIMIR (Duan et al. 2024) ``split`` of one Pile ``domain``: members = Pile train (label 1), then non-members
    = Pile test (label 0), from ``root`` (see :func:`_mimir_candidates`) in the local layout
    (``<split>/members/<domain>.jsonl``) or the Hub's (``cache_100_200_1000_512/train/<domain>_<split>.jsonl``).
    The GitHub domain carries a caveat (:data:`MIMIR_CAVEATS`)."""
    parts = [data.load_records(path, "text", None) for path in mimir_files(domain, split, root)]
    name = f"mimir-{domain}" if split == MIMIR_SPLIT else f"mimir-{domain}-{split}"
    caveats = [MIMIR_CAVEATS[domain]] if domain in MIMIR_CAVEATS else []
    return KnownDataset(parts[0].texts + parts[1].texts, [1] * len(parts[0]) + [0] * len(parts[1]), name,
                        {**parts[0].files, **parts[1].files}, caveats=caveats)


# -------------------------------------------------------------------------------------------- WikiMIA-24 and -25


def _split_files(root: Path, split: str) -> list[Path]:
    """The files of ``split`` under ``root``: the Hub's Parquet shards, one Parquet file, or a ``save_to_disk``
    folder of Arrow shards; [] when none."""
    for pattern in (f"data/{split}-*.parquet", f"{split}-*.parquet", f"{split}.parquet", f"{split}/data-*.arrow"):
        found = sorted(p for p in root.glob(pattern) if p.is_file())
        if found:
            return found
    return []


def _read_table(path: Path, what: str):
    """The Arrow table of a Parquet file or a ``save_to_disk`` Arrow shard; a UserError when it is neither."""
    import pyarrow as pa  # here, not at the top: every command imports this module, few read Parquet (start-up time)
    import pyarrow.parquet as pq  # (as above)

    try:
        if path.suffix == ".arrow":
            with pa.memory_map(str(path)) as f:
                return pa.ipc.open_stream(f).read_all()
        return pq.read_table(path)
    except (OSError, ValueError, pa.ArrowException) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        kind = "an Arrow stream" if path.suffix == ".arrow" else "Parquet"
        raise UserError(f"{what}: {path}: cannot read it as {kind} ({first}); the file is corrupt or not {kind}: "
                        "fetch it again") from None


def _columns(table, path: Path, what: str) -> tuple[list, list]:
    """The ``input`` and ``label`` columns of ``table`` (strings, 0/1 integers), checked."""
    import pyarrow as pa  # (see _read_table)

    missing = [c for c in ("input", "label") if c not in table.column_names]
    if missing:
        raise UserError(f"{what}: {path} has no column {missing[0]!r} (columns: {', '.join(table.column_names)}); "
                        "expected input (string) and label (int64), as the Hub's files have")
    types = table.schema.field("input").type, table.schema.field("label").type
    if not (pa.types.is_string(types[0]) or pa.types.is_large_string(types[0])) or not (
            pa.types.is_integer(types[1]) or pa.types.is_boolean(types[1])):
        raise UserError(f"{what}: {path}: column input is {types[0]} and label is {types[1]}; expected string and "
                        "int64")
    texts, labels = table.column("input").to_pylist(), table.column("label").to_pylist()
    for i, (text, label) in enumerate(zip(texts, labels), 1):
        if text is None or label is None or int(label) not in (0, 1):
            value = "an empty input" if text is None else f"label {label!r}"
            raise UserError(f"{what}: {path}: row {i} has {value}; labels must be 0 (non-member) or 1 (member)")
    return texts, [int(label) for label in labels]


def _both_classes(labels: list[int], what: str, where: str) -> None:
    if not labels:
        raise UserError(f"{what}: {where} has no rows; fetch the split again")
    if len(set(labels)) < 2:
        kind = "members" if labels[0] == 1 else "non-members"
        raise UserError(f"{what}: {where} holds only {kind} ({len(labels)} rows); a membership benchmark needs both")


def wikimia_new(benchmark: str, length: int = 32, root: str | os.PathLike | None = None) -> KnownDataset:
    """WikiMIA-24 or WikiMIA-25 (``benchmark``: a key of :data:`WIKIMIA_NEW`), split ``WikiMIA_length<length>``,
    read from ``root`` (the dataset's folder as the Hub ships it: ``data/<split>-*.parquet``; also ``<split>.parquet``
    or the ``save_to_disk`` layout ``<split>/data-*.arrow``)."""
    hub, lengths, nonmembers = WIKIMIA_NEW[benchmark]
    what = {"wikimia-24": "WikiMIA-24", "wikimia-25": "WikiMIA-25"}[benchmark]
    if length not in lengths:
        raise UserError(f"{what} has lengths {', '.join(map(str, lengths))}; got --length {length}")
    base = _pick_dir(root, what, f"the folder of the Hugging Face dataset {hub} (data/WikiMIA_length32-*.parquet)")
    split = f"WikiMIA_length{length}"
    paths = _split_files(base, split)
    if not paths:
        raise UserError(f"{what}: no {split} files in {base} (looked for data/{split}-*.parquet, {split}.parquet and "
                        f"{split}/data-*.arrow); pass the folder of {hub} with --data-dir")
    texts, labels = [], []
    for path in paths:
        t, y = _columns(_read_table(path, what), path, what)
        texts += t
        labels += y
    _both_classes(labels, what, f"{split} in {base}")
    caveat = (f"{what}: non-members are {nonmembers}; its labels hold only for models whose training data ends before "
              "its non-members' events")
    return KnownDataset(texts, labels, f"{benchmark}-{length}", {str(p): sha256(p) for p in paths}, caveats=[caveat])


# ------------------------------------------------------------------------------------------------------- OLMoMIA


def _olmomia_file(base: Path, setting: str, length: int | None) -> Path:
    """The one file of ``setting`` (and of max length ``length`` when given) in ``base``."""
    if setting == "random":
        found = sorted(p for p in base.glob("*_random.jsonl")) or sorted(
            p for p in base.glob("*.jsonl") if _OLMOMIA_POOL.match(p.name))
    else:
        found = sorted(base.glob(f"*_{setting}.jsonl"))
    if length is not None:
        found = [p for p in found if re.search(rf"_{length}_\d+(_{setting})?\.jsonl$", p.name)]
    found = [p for p in found if p.is_file()]
    if not found:
        want = ("<model>_<L>_<N>.jsonl (filter.py) or *_random.jsonl" if setting == "random" else
                f"<model>_<L>_<M>_{setting}.jsonl (clustering.py)")
        at = f" of length {length}" if length is not None else ""
        raise UserError(f"OLMoMIA: no {setting} file{at} in {base} (expected {want}); pass the folder of the files "
                        "the OLMoMIA scripts wrote with --data-dir")
    if len(found) > 1:
        raise UserError(f"OLMoMIA: several {setting} files in {base} ({', '.join(p.name for p in found)}); choose one "
                        "with --length L, or keep one per folder")
    return found[0]


def _check_olmomia_rows(path: Path) -> None:
    """The first row of an OLMoMIA file is an object with ``input`` and ``label`` (the fields its scripts write)."""
    with open(path, "rb") as f:
        first = next((line for line in f if line.strip()), b"")
    if not first:
        raise UserError(f"OLMoMIA: {path} has no rows; run the OLMoMIA scripts again")
    try:
        row = json.loads(first)
    except ValueError:
        return  # load_records names the line and the column
    if not isinstance(row, dict) or not {"input", "label"} <= set(row):
        fields = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
        raise UserError(f"OLMoMIA: {path}: row 1 has fields {fields}; expected input and label, as the OLMoMIA "
                        "scripts write them")


def olmomia(setting: str = "random", length: int | None = None, root: str | os.PathLike | None = None
            ) -> KnownDataset:
    """OLMoMIA (Kim et al. 2024): the ``setting`` file (random, easy, medium, hard; :data:`OLMOMIA_SETTINGS`) of
    max length ``length`` (None: the one file there is) in ``root``."""
    if setting not in OLMOMIA_SETTINGS:
        raise UserError(f"unknown OLMoMIA setting {setting!r}; settings: {', '.join(OLMOMIA_SETTINGS)}")
    base = _pick_dir(root, "OLMoMIA", "the folder of the files the OLMoMIA scripts (gyuwankim/em-mia) wrote")
    path = _olmomia_file(base, setting, length)
    _check_olmomia_rows(path)
    ds = data.load_records(path, "input", "label", name=f"olmomia-{setting}")
    _both_classes(ds.labels, "OLMoMIA", str(path))
    caveat = ("OLMoMIA: members come from OLMo-7B's training steps 0-100k, non-members from steps 400k-450k; its "
              "labels hold for the OLMo-7B checkpoints of steps 100k-400k only")
    return KnownDataset(ds.texts, ds.labels, ds.name, ds.files, caveats=[caveat])
