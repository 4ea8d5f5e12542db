"""The project's datasets as TensorFlow Datasets builders, built offline (nothing downloads) from the files the
package ships or that are present on the machine, in the ArrayRecord format that ``tfds.data_source`` reads without
TensorFlow (:mod:`mia_jax.data.tfds_source`). ``mia-jax datasets build NAME --data-dir DIR`` runs :func:`build`.

Each split keeps its file's order (``disable_shuffling``), so a dataset read back through TFDS gives the same texts,
labels and order as the JSONL path (``texts_sha256`` in a run's fingerprint is the same either way):

- ``wikimia``: configs ``length32`` / ``length64`` / ``length128`` / ``length256`` (Shi et al. 2023, the bundled
  ``files/WikiMIA_length*.jsonl``); features ``input`` (Text) and ``label`` (1 member, 0 non-member); split
  ``train``.
- ``mimir``: one config per Pile domain of MIMIR's ``ngram_7_0.2`` split (Duan et al. 2024; not bundled: read from
  ``--source``, ``$MIA_JAX_MIMIR`` or ``../shared/data/mimir``, see :func:`mia_jax.data.known.mimir_files`);
  features ``text`` and ``label``, members first then non-members, as ``--benchmark mimir`` reads them.
- ``contamination``: the contamination study's files (train/data, shipped with the package; read by path, the
  library never imports ``train``): the evaluation sets ``boolq``, ``commonsenseqa``, ``truthfulqa``, ``imdb`` with
  their fields as in the files (the study's text templates are applied by ``train/``, not here), the 2023 news
  sample ``news`` and the Pile background sample ``pile``; every text field is Text, no membership label (which
  side an example lands on is decided by each run's seeded split).

A new dataset: a :class:`Bundled` subclass (its configs, ``_features`` and ``_rows``) listed in :data:`BUILDERS`.
"""
from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core import writer as tfds_writer
from tensorflow_datasets.proto import tf_example_pb2

from mia_jax import data
from mia_jax.runs import rundir
from mia_jax.data import corpora, known, tfds_source
from mia_jax.errors import UserError

FORMAT = "array_record"
MEMBER_LABEL = tfds.features.ClassLabel(names=["non-member", "member"])  # 0 non-member, 1 member


class SortedFeatures(tfds_writer.ExampleWriter):
    """TFDS's example writer, each example's features in the order of their names. TFDS serializes an example as a
    ``tf.train.Example``, whose features are a protobuf map: written in the order of the process's hash table, which
    varies from one process to the next (the same build gave files of different SHA-256 about half the time).
    Serialized deterministically (keys sorted), the same rows give the same bytes, and the same sizes as before."""

    def write(self, path, examples):
        """Write ``examples`` ((key, serialized example) pairs) to ``path``, each re-serialized with sorted keys;
        returns what TFDS's writer returns."""
        return super().write(path, ((key, tf_example_pb2.Example.FromString(blob).SerializeToString(deterministic=True))
                                    for key, blob in examples))


class Bundled(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A dataset built from local files, one split ``train`` in the files' order. Subclasses set ``BUILDER_CONFIGS``,
    ``DESCRIPTION`` and ``HOMEPAGE`` and define ``_features()`` (name -> tfds feature) and ``_rows()`` (the rows, as
    dicts of those features). ``source``: a folder to read instead of the default one (datasets not bundled)."""
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release: the files' rows in their order."}
    DESCRIPTION = ""
    HOMEPAGE = ""

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> tfds.core.Path:
        """This module's file. TFDS's own lookup of a builder's code in a package needs the importlib_resources
        backport (absent on Python >= 3.9 installs); the file is what it would find."""
        return tfds.core.Path(__file__)

    def __init__(self, *, source: str | os.PathLike | None = None, **kwargs):
        self.source = source
        super().__init__(**kwargs)

    def _example_writer(self) -> tfds_writer.ExampleWriter:
        return SortedFeatures(file_format=self.info.file_format)

    def _log_download_bytes(self) -> None:  # TFDS prints "Downloading ...": nothing downloads here
        pass

    def _log_download_done(self) -> None:  # (as above; `mia-jax datasets build` says what it built)
        pass

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(builder=self, description=self.DESCRIPTION, homepage=self.HOMEPAGE,
                                     features=tfds.features.FeaturesDict(self._features()), disable_shuffling=True)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i, row in enumerate(self._rows()):
            yield i, row

    def check_source(self) -> None:
        """A UserError when the files this config is built from are not there (before anything is written)."""

    def _features(self) -> dict:
        raise NotImplementedError

    def _rows(self) -> Iterator[dict]:
        raise NotImplementedError


class Wikimia(Bundled):
    """WikiMIA (Shi et al. 2023), one config per text length, from the bundled JSONL files."""
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=f"length{n}", description=f"WikiMIA, texts of {n} words")
                       for n in data.WIKIMIA_LENGTHS]
    DESCRIPTION = ("WikiMIA: Wikipedia event texts, members (before 2017) and non-members (2023 events); "
                   "label 1 = member. MIT licence (Shi et al. 2023).")
    HOMEPAGE = "https://huggingface.co/datasets/swj0419/WikiMIA"

    def _features(self) -> dict:
        return {"input": tfds.features.Text(), "label": MEMBER_LABEL}

    def _rows(self) -> Iterator[dict]:
        ds = data.wikimia(int(self.builder_config.name.removeprefix("length")))
        for text, label in zip(ds.texts, ds.labels):
            yield {"input": text, "label": label}


class Mimir(Bundled):
    """MIMIR (Duan et al. 2024), split ngram_7_0.2, one config per Pile domain."""
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=d, description=f"MIMIR {known.MIMIR_SPLIT}, Pile domain {d}")
                       for d in known.MIMIR_DOMAINS]
    DESCRIPTION = (f"MIMIR {known.MIMIR_SPLIT}: Pile train documents (members, label 1) and Pile test documents "
                   "(non-members, label 0) of one domain, members first.")
    HOMEPAGE = "https://huggingface.co/datasets/iamgroot42/mimir"

    def _features(self) -> dict:
        return {"text": tfds.features.Text(), "label": MEMBER_LABEL}

    def check_source(self) -> None:
        known.mimir_files(self.builder_config.name, root=self.source, flag="--source")

    def _rows(self) -> Iterator[dict]:
        ds = known.mimir(self.builder_config.name, root=self.source)
        for text, label in zip(ds.texts, ds.labels):
            yield {"text": text, "label": label}


_TEXT = tfds.features.Text
_INT = tfds.features.Scalar(dtype=np.int64)
# config -> (file under train/data (None: the package's Pile sample), {feature: (type, source field or getter)})
CONTAMINATION = {
    "boolq": ("downstream/boolq_validation.jsonl",
              {"idx": (_INT, "idx"), "question": (_TEXT, "question"), "passage": (_TEXT, "passage"),
               "answer": (_TEXT, lambda r: "yes" if r["label"] else "no")}),
    "commonsenseqa": ("downstream/commonsenseqa_dev.jsonl",
                      {"id": (_TEXT, "id"), "question": (_TEXT, "question"),
                       "question_concept": (_TEXT, "question_concept"),
                       "choices": (tfds.features.Sequence(_TEXT()), lambda r: r["choices"]["text"]),
                       "choice_labels": (tfds.features.Sequence(_TEXT()), lambda r: r["choices"]["label"]),
                       "answer_key": (_TEXT, "answerKey")}),
    "truthfulqa": ("downstream/truthfulqa.csv",
                   {k.lower().replace(" ", "_"): (_TEXT, k) for k in
                    ("Type", "Category", "Question", "Best Answer", "Correct Answers", "Incorrect Answers", "Source")}),
    "imdb": ("downstream/imdb_test_sample2000.jsonl",
             {"id": (_TEXT, "id"), "text": (_TEXT, "text"), "rating": (_INT, "rating"),
              "sentiment": (_TEXT, lambda r: "positive" if r["label"] else "negative")}),
    "news": ("news2023_sample.jsonl", {"text": (_TEXT, "text")}),
    "pile": (None, {"text": (_TEXT, "text")}),
}


def train_data_dir() -> Path:
    """The folder of the contamination study's files (``train/data`` of the installed package), found without
    importing ``train`` (the library never does)."""
    spec = importlib.util.find_spec("train")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the contamination study's files (package train, shipped with mia-jax) are not installed; "
                        "reinstall mia-jax from its source folder (pip install .)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


class Contamination(Bundled):
    """The contamination study's evaluation sets, news sample and background sample, fields as in their files."""
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=n, description=f"{n}: the contamination study's file")
                       for n in CONTAMINATION]
    DESCRIPTION = ("The contamination study's data (Shi et al. 2023, section 6): the downstream evaluation sets "
                   "(BoolQ, CommonsenseQA, TruthfulQA, IMDB samples), the 2023 news sample and the Pile sample; "
                   "licences in train/data/LICENSE.md and mia_jax/data/files/LICENSE.md.")

    def path(self) -> Path:
        """The file this config is built from."""
        rel = CONTAMINATION[self.builder_config.name][0]
        return corpora.PILE_SAMPLE if rel is None else train_data_dir() / rel

    def _features(self) -> dict:
        return {k: (t() if isinstance(t, type) else t) for k, (t, _) in CONTAMINATION[self.builder_config.name][1]
                .items()}

    def check_source(self) -> None:
        data.check_data_file(self.path())

    def _rows(self) -> Iterator[dict]:
        spec = CONTAMINATION[self.builder_config.name][1]
        for _, row in data.read_rows(self.path()):
            yield {k: (get(row) if callable(get) else row[get]) for k, (_, get) in spec.items()}


BUILDERS: dict[str, type[Bundled]] = {"wikimia": Wikimia, "mimir": Mimir, "contamination": Contamination}
assert tuple(BUILDERS) == data.TFDS_DATASETS, "list a new builder in mia_jax.data.TFDS_DATASETS too"


def configs(name: str) -> list[str]:
    """The config names of dataset ``name``."""
    return [c.name for c in BUILDERS[name].BUILDER_CONFIGS]


def build(name: str, data_dir: str | os.PathLike, only: Sequence[str] = (), source: str | os.PathLike | None = None,
          progress: bool = True) -> list[tuple[str, Path, int, bool]]:
    """Build dataset ``name`` (every config, or those in ``only``) as ArrayRecord into ``data_dir``, offline; a
    config already built there is kept as it is, once it reads (:func:`mia_jax.data.tfds_source.problem`: a broken
    one is refused). Every config's files are checked before the first is written; ``data_dir`` is then locked
    (:func:`mia_jax.runs.rundir.claim`): a second build into it meanwhile is refused with this one's PID. The same files
    give the same bytes (:class:`SortedFeatures`). ``source``: where to read a dataset that is not bundled (MIMIR).
    Returns (config, version folder, rows, whether it was built now: False for one kept)."""
    if name not in BUILDERS:
        raise UserError(f"unknown dataset {name!r}; datasets: {', '.join(BUILDERS)}")
    unknown = [c for c in only if c not in configs(name)]
    if unknown:
        raise UserError(f"{name} has no config {unknown[0]!r}; configs: {', '.join(configs(name))}")
    data_dir = Path(data_dir).expanduser().absolute()
    version = str(BUILDERS[name].VERSION)
    for c in only or configs(name):  # a kept one must read, checked before TFDS reads it (a bad description raises)
        folder = data_dir / name / c / version
        why = (folder / "dataset_info.json").is_file() and tfds_source.problem(f"tfds:{name}/{c}", data_dir, version)
        if why:
            raise UserError(f"tfds:{name}/{c} is built in {folder} but cannot be read ({why}); remove {folder} and "
                            "build it again")
    builders = [BUILDERS[name](config=c, data_dir=str(data_dir), file_format=FORMAT, source=source)
                for c in (only or configs(name))]
    for b in builders:
        b.check_source()
    tfds.display_progress_bar(progress)
    done = []
    with (rundir.claim(data_dir, None, flag="--data-dir"),  # the run folders' lock, without a fingerprint
          tempfile.TemporaryDirectory(prefix="mia_jax_tfds_") as downloads):  # nothing downloads; TFDS wants one
        for b in builders:
            old = (Path(b.data_dir) / "dataset_info.json").is_file()
            b.download_and_prepare(download_dir=downloads, download_config=tfds.download.DownloadConfig(
                try_download_gcs=False, download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS))
            done.append((b.builder_config.name, Path(b.data_dir), b.info.splits["train"].num_examples, not old))
    return done


