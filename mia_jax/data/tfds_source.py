"""Texts from a TensorFlow Datasets (TFDS) dataset: ``--data tfds:NAME[/CONFIG][:SPLIT]`` with ``--data-dir``.

A dataset is read through ``tfds.data_source``: random access over its ArrayRecord files, without TensorFlow, and
nothing is ever downloaded (``download=False``, ``try_gcs=False``). The dataset must already be built in the data
folder (``--data-dir``, else ``$TFDS_DATA_DIR``, else TFDS's default ``~/tensorflow_datasets``), in the ArrayRecord
format: ``mia-jax datasets build NAME`` builds the project's own (:mod:`mia_jax.data.builders`); any other TFDS
dataset is built with ``builder.download_and_prepare(file_format="array_record")``.

The folder is checked before TFDS is asked, so that each mistake is one line saying what is there: no such folder,
a folder that holds no TFDS dataset, an unknown name, config or split, a feature that is not text, a dataset written
in another file format (TFRecord, which only TensorFlow reads), a ``dataset_info.json`` that is not JSON.

The data are read as data, not as their description: the rows of a split are counted in its ArrayRecord files
themselves (:func:`record_count`), and a file whose count differs from the ``shardLengths`` that ``dataset_info.json``
gives it (TFDS would read that many rows and silently drop the rest), a file missing or one of the split that the
description does not list is refused, naming the file and both counts. :func:`problem` says why a built dataset cannot
be read (``mia-jax datasets list`` shows it as broken).

A run's fingerprint identifies the data by its files: :attr:`TfdsSource.files` maps the path of every file of the
split and the dataset's ``dataset_info.json`` and ``features.json`` to its SHA-256. TFDS lays a dataset out as
``DIR/NAME/[CONFIG/]VERSION/NAME-SPLIT.array_record-XXXXX-of-YYYYY``, so these paths hold the dataset's name, config,
version and split; ``Dataset.name`` is ``NAME-CONFIG`` (e.g. ``wikimia-length32``).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import tensorflow_datasets as tfds
from array_record.python.array_record_module import ArrayRecordReader
from google.protobuf import json_format

from mia_jax.data.dataset import TFDS_DATASETS, Dataset, default_text_field, label_of
from mia_jax.errors import UserError
from mia_jax.runs.files import sha256

PREFIX = "tfds:"
_NAME = r"[a-z][a-z0-9_]*"
_SPEC = re.compile(rf"^{PREFIX}(?P<name>{_NAME})(?:/(?P<config>[\w.\-]+))?(?::(?P<split>[\w.\-]+))?$")
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
FORMAT = "array_record"
READ_CHUNK = 256  # rows fetched from the data source at once by rows()


def parse_spec(spec: str) -> tuple[str, str | None, str | None]:
    """``tfds:NAME[/CONFIG][:SPLIT]`` -> (name, config or None, split or None); a UserError saying the syntax
    otherwise. Only the syntax is checked here: the name, config and split are looked up by :func:`open_source`."""
    m = _SPEC.match(spec)
    if m is None:
        raise UserError(f"{spec!r} is not a TFDS dataset spec: write tfds:NAME[/CONFIG][:SPLIT] (NAME in snake_case, "
                        "e.g. tfds:wikimia/length32 or tfds:wikimia/length32:train)")
    return m["name"], m["config"], m["split"]


def is_spec(text: str | os.PathLike) -> bool:
    """Whether ``text`` names a TFDS dataset (starts with ``tfds:``) rather than a file."""
    return isinstance(text, str) and text.startswith(PREFIX)


def default_data_dir() -> Path:
    """``$TFDS_DATA_DIR``, else TFDS's default folder (``~/tensorflow_datasets``)."""
    return Path(os.environ.get("TFDS_DATA_DIR") or Path("~", "tensorflow_datasets")).expanduser()


def _how_to_build(name: str, data_dir: Path) -> str:
    if name in TFDS_DATASETS:
        return f"build it with: mia-jax datasets build {name} --data-dir {data_dir}"
    return ("build it there in the ArrayRecord format, e.g. tfds.builder(NAME, data_dir=DIR)"
            ".download_and_prepare(file_format='array_record')")


def _built(folder: Path) -> list[Path]:
    """The version folders under ``folder`` that hold a built dataset (a dataset_info.json), oldest first."""
    found = [p for p in folder.iterdir() if _VERSION.match(p.name) and (p / "dataset_info.json").is_file()] \
        if folder.is_dir() else []
    return sorted(found, key=lambda p: tuple(int(x) for x in p.name.split(".")))


def _datasets_in(data_dir: Path) -> list[str]:
    """The names of the datasets built in ``data_dir`` (with or without configs)."""
    return sorted(p.name for p in data_dir.iterdir() if p.is_dir() and (
        _built(p) or any(_built(c) for c in p.iterdir() if c.is_dir())))


def _configs(folder: Path) -> list[str]:
    return sorted(c.name for c in folder.iterdir() if c.is_dir() and not c.name.startswith(".") and _built(c))


def _default_config(folder: Path, configs: list[str]) -> str | None:
    try:
        default = json.loads((folder / ".config" / "metadata.json").read_text()).get("default_config_name")
    except (OSError, ValueError, AttributeError):
        default = None
    return default if default in configs else (configs[0] if len(configs) == 1 else None)


def locate(spec: str, data_dir: str | os.PathLike | None,
           version: str | None = None) -> tuple[Path, str, str | None, dict]:
    """Find the built dataset ``spec`` names in ``data_dir`` (None: :func:`default_data_dir`): its ``version``, else
    the newest built.

    Returns (its version folder, its name, its config or None, its dataset_info.json as :func:`read_info` reads it).
    A UserError for a folder that is missing or holds no TFDS dataset, an unknown name or config (listing those built
    there), a config left out where several are built and none is the default, or a description :func:`read_info`
    refuses.
    """
    name, config, _ = parse_spec(spec)
    data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    if not data_dir.is_dir():
        raise UserError(f"TFDS data folder {data_dir} does not exist; pass --data-dir (or set $TFDS_DATA_DIR) to "
                        f"the folder the dataset was built in, or {_how_to_build(name, data_dir)}")
    built = _datasets_in(data_dir)
    if not built:
        raise UserError(f"{data_dir} is not a TFDS data folder (no NAME/[CONFIG/]VERSION/dataset_info.json in it); "
                        f"pass the folder TFDS built {name} in, or {_how_to_build(name, data_dir)}")
    folder = data_dir / name
    if name not in built:
        raise UserError(f"no TFDS dataset {name!r} in {data_dir} (built there: {', '.join(built)}); "
                        f"{_how_to_build(name, data_dir)}")
    configs = _configs(folder)
    if config is None and configs and not _built(folder):
        config = _default_config(folder, configs)
        if config is None:
            raise UserError(f"{name} has several configs in {data_dir}: {', '.join(configs)}; choose one: "
                            f"tfds:{name}/{configs[0]}")
    if config is not None and config not in configs:
        raise UserError(f"{name} has no config {config!r} in {data_dir} (configs built: "
                        f"{', '.join(configs) or 'none, it has no configs'}); {_how_to_build(name, data_dir)}")
    versions = _built(folder / config if config else folder)
    chosen = [v for v in versions if version is None or v.name == version][-1:]
    if not chosen:
        raise UserError(f"{spec} has no version {version} built in {data_dir} (built: "
                        f"{', '.join(v.name for v in versions)})")
    return chosen[0], name, config, read_info(chosen[0], name)


def read_info(version: Path, name: str) -> dict:
    """The ``dataset_info.json`` of the dataset ``name`` built in the folder ``version``; a UserError when it is not a
    JSON object listing the splits by name, or says another file format than ArrayRecord."""
    path = version / "dataset_info.json"
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path} cannot be read ({e}); rebuild the dataset") from None
    splits = info.get("splits", []) if isinstance(info, dict) else None
    if not isinstance(splits, list) or not all(isinstance(s, dict) and isinstance(s.get("name"), str) for s in splits):
        raise UserError(f"{path} is not a TFDS dataset description (a JSON object listing its splits by name); "
                        "rebuild the dataset")
    fmt = info.get("fileFormat") or "tfrecord"  # TFDS leaves the field out for its historical default, TFRecord
    if fmt != FORMAT:
        raise UserError(f"{name} in {version} is stored as {fmt}, which needs TensorFlow to read; rebuild it as "
                        "ArrayRecord (download_and_prepare(file_format='array_record')) into another --data-dir")
    return info


def record_count(path: Path, spec: str) -> int:
    """The rows of the ArrayRecord file ``path`` as the file itself records them (its footer), whatever the dataset's
    description says; a UserError naming the file when it is not a readable ArrayRecord file (cut, garbled)."""
    reader = ArrayRecordReader(str(path))
    if reader.ok():
        try:
            return reader.num_records()
        finally:
            reader.close()
    try:  # a reader that failed to open says why only when asked for a row
        reader.read([0])
        why = "not an ArrayRecord file"
    except (RuntimeError, ValueError, OSError) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise UserError(f"{spec}: {path} cannot be read ({why}); the dataset's files are damaged: rebuild it")


def problem(spec: str, data_dir: str | os.PathLike | None, version: str) -> str | None:
    """Why ``version`` of the dataset ``spec`` (``tfds:NAME[/CONFIG]``) built in ``data_dir`` cannot be read: the
    refusal of its description or of the first split that does not open as :class:`TfdsSource` opens it (files
    missing, damaged, or holding other row counts than the description's); None when every split reads."""
    try:
        splits = [s["name"] for s in locate(spec, data_dir, version)[3].get("splits", [])]
        if not splits:
            return f"{spec}: its dataset_info.json lists no split; rebuild the dataset"
        for split in splits:
            TfdsSource(f"{spec}:{split}", data_dir, version)
    except UserError as e:
        return str(e)
    return None


def _choose_split(spec: str, info: dict, split: str | None) -> str:
    """``split``, else the dataset's only split, else ``train``; a UserError listing the splits otherwise."""
    splits = [s["name"] for s in info.get("splits", [])]
    if not splits:
        raise UserError(f"{spec}: the dataset has no split (its dataset_info.json lists none); rebuild it")
    base = spec.rsplit(":", 1)[0] if split is not None else spec
    if split is None:
        if len(splits) == 1 or "train" in splits:
            return splits[0] if len(splits) == 1 else "train"
        raise UserError(f"{spec} has splits {', '.join(splits)}; choose one, e.g. {base}:{splits[0]}")
    if split not in splits:
        raise UserError(f"{spec} has no split {split!r} (splits: {', '.join(splits) or 'none'}); choose one, e.g. "
                        f"{base}:{splits[0] if splits else 'train'}")
    return split


def plain(value):
    """A TFDS feature value as plain Python: bytes decoded (UTF-8) to str, NumPy scalars and arrays to numbers and
    lists, recursively through dicts and lists."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()] if value.dtype == object else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


class TfdsSource:
    """One split of a built TFDS dataset, read through ``tfds.data_source`` (random access, no TensorFlow).

    ``name``, ``config`` (or None), ``version``, ``split``, ``features`` (the dataset's ``tfds.features``),
    ``files`` (path -> SHA-256 of every file of the split and of dataset_info.json / features.json), ``len()`` and
    :meth:`rows`. See :func:`locate` for what is refused.
    """

    def __init__(self, spec: str, data_dir: str | os.PathLike | None = None, version: str | None = None):
        folder, self.name, self.config, info = locate(spec, data_dir, version)
        self.spec = spec
        self.version = folder.name
        self.split = _choose_split(spec, info, parse_spec(spec)[2])
        full = f"{self.name}/{self.config}:{self.version}" if self.config else f"{self.name}:{self.version}"
        try:
            self._source = tfds.data_source(full, split=self.split, data_dir=str(folder.parents[1 + bool(self.config)]),
                                            download=False, try_gcs=False)
        except (ValueError, NotImplementedError, FileNotFoundError, KeyError, AssertionError, RuntimeError,
                json_format.ParseError) as e:  # ParseError: a dataset_info.json whose fields TFDS cannot read
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"{spec}: TFDS cannot open {folder} ({first}); rebuild the dataset") from None
        self.features = self._source.dataset_info.features
        paths = self._check_files(folder, self._source.dataset_info.splits[self.split])
        meta = [folder / f for f in ("dataset_info.json", "features.json") if (folder / f).is_file()]
        self.files = {str(p): sha256(p) for p in [*meta, *paths]}

    def _check_files(self, folder: Path, split) -> list[Path]:
        """The split's files, each holding the rows the description gives it (``shardLengths``), none missing and
        none beside them; sets the split's length from the files' own counts."""
        paths = [Path(p) for p in split.filepaths]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise UserError(f"{self.spec}: file {missing[0]} of split {self.split} is missing; rebuild the dataset")
        stray = sorted(set(folder.glob(f"{self.name}-{self.split}.{FORMAT}-*")) - set(paths))
        if stray:
            raise UserError(f"{self.spec}: {stray[0]} is a file of split {self.split} that {folder}/dataset_info.json "
                            f"does not list (it lists {len(paths)}); rebuild the dataset")
        self._len = 0
        for path, listed in zip(paths, split.shard_lengths):
            found = record_count(path, self.spec)
            if found != listed:
                raise UserError(f"{self.spec}: {path} holds {found} rows but {folder}/dataset_info.json says {listed} "
                                "(shardLengths); rebuild the dataset")
            self._len += found
        return paths

    @property
    def label(self) -> str:
        """``NAME-CONFIG`` (``NAME`` without a config): the Dataset's name."""
        return f"{self.name}-{self.config}" if self.config else self.name

    def __len__(self) -> int:
        return self._len

    def rows(self, start: int = 0) -> Iterator[dict]:
        """Every row from index ``start`` on, in the split's order, as a dict of plain Python values (text as str);
        read :data:`READ_CHUNK` rows at a time, so a streaming reader holds only a window."""
        for lo in range(start, len(self), READ_CHUNK):
            hi = min(lo + READ_CHUNK, len(self))
            try:
                chunk = self._source.__getitems__(list(range(lo, hi)))
            except (RuntimeError, ValueError, OSError) as e:  # ArrayRecord's reader: a cut or garbled file
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise UserError(f"{self.spec}: rows {lo + 1}-{hi} cannot be read ({first}); the dataset's files are "
                                "damaged: rebuild it") from None
            for row in chunk:
                yield plain(row)

    def resolve_text_field(self, fld: str | None) -> str:
        """``fld`` checked (:meth:`check_text_field`), or when None the one of ``text`` and ``input`` among the
        features (:func:`mia_jax.data.default_text_field`: both or neither is a UserError)."""
        fld = fld if fld is not None else default_text_field(self.features, self.spec, "feature")
        self.check_text_field(fld)
        return fld

    def check_text_field(self, fld: str, what: str = "--text-field") -> None:
        """A UserError unless ``fld`` is a Text feature of the dataset."""
        self._check_field(fld, what)
        if not isinstance(self.features[fld], tfds.features.Text):
            raise UserError(f"{self.spec}: feature {fld!r} is {type(self.features[fld]).__name__}, not text; choose "
                            f"a text feature with {what} (text features: {', '.join(self.text_fields()) or 'none'})")

    def check_label_field(self, fld: str) -> None:
        """A UserError unless ``fld`` is a scalar integer, boolean, class-label or text feature (0/1 labels)."""
        self._check_field(fld, "--label-field")
        feature = self.features[fld]
        ok = isinstance(feature, (tfds.features.ClassLabel, tfds.features.Text)) or (
            isinstance(feature, tfds.features.Tensor) and feature.shape == ()
            and (np.issubdtype(feature.np_dtype, np.integer) or feature.np_dtype == np.bool_))
        if not ok:
            raise UserError(f"{self.spec}: feature {fld!r} is {feature!r}, not a 0/1 label; choose the label "
                            "feature with --label-field")

    def _check_field(self, fld: str, what: str) -> None:
        if fld not in self.features:
            raise UserError(f"{self.spec} has no feature {fld!r} (features: {', '.join(self.features)}); choose "
                            f"it with {what}")

    def text_fields(self) -> list[str]:
        """The dataset's Text features."""
        return [k for k, f in self.features.items() if isinstance(f, tfds.features.Text)]


def load(spec: str, data_dir: str | os.PathLike | None = None, text_field: str | None = None,
         label_field: str | None = "label", extra: Sequence[str] = ()) -> Dataset:
    """A split of a built TFDS dataset as a :class:`mia_jax.data.Dataset`, as :func:`mia_jax.data.load_records` reads
    a file: texts from ``text_field`` (None: the one of :data:`mia_jax.data.TEXT_FIELDS` among the features),
    0/1 labels from ``label_field`` unless it is None, the ``extra`` features (``Dataset.extra``; None for a feature
    the dataset lacks, as for a file's missing field). A missing text or label feature, a text feature that is not
    Text, a label that is not 0/1 or an empty split is a UserError naming it."""
    src = TfdsSource(spec, data_dir)
    text_field = src.resolve_text_field(text_field)
    if label_field is not None:
        src.check_label_field(label_field)
    texts, labels, kept = [], [], {f: [] for f in extra}
    for i, row in enumerate(src.rows()):
        texts.append(row[text_field])
        if label_field is not None:
            labels.append(label_of(row[label_field], spec, i + 1))
        for f in extra:
            kept[f].append(row.get(f))
    if not texts:
        raise UserError(f"{spec}: split {src.split} has no rows; choose another split")
    return Dataset(texts, labels if label_field is not None else None, src.label, src.files, kept, text_field)
