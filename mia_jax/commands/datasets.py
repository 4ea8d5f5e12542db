"""``mia-jax datasets``: the project's datasets as TensorFlow Datasets (``build``: written offline as ArrayRecord into
``--data-dir``, under a lock on it, byte for byte the same files each time; ``list``: the datasets, their configs and
which are built there, each built one opened and checked as ``--data tfds:`` reads it: a broken one is listed as
broken, with why). Scoring then reads them with ``--data tfds:NAME/CONFIG --data-dir DIR``
(:mod:`mia_jax.data.tfds_source`); the builders: :mod:`mia_jax.data.builders`."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from mia_jax import data
from mia_jax.runs import entry
from mia_jax.commands import options
from mia_jax.commands.request import CommandRequest
from mia_jax.errors import UserError

NAME = "datasets"
HELP = "build the project's datasets (WikiMIA, MIMIR, the contamination study's) as TFDS datasets, offline"
DESCRIPTION = ("mia-jax datasets build NAME --data-dir DIR writes dataset NAME (every config, or --config ...) in "
               "TFDS's ArrayRecord format, from the files the package ships (MIMIR: from --source); nothing "
               "downloads; --data-dir is locked meanwhile, and the same files give the same bytes. mia-jax datasets "
               "list shows the datasets and what is built in --data-dir, each built one checked (a broken one listed "
               "as broken, with why). Score one with mia-jax eval --data tfds:NAME/CONFIG --data-dir DIR.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``mia-jax datasets`` on ``p``."""
    p.add_argument("action", choices=["build", "list"], help="build a dataset, or list them")
    p.add_argument("name", nargs="?", choices=list(data.TFDS_DATASETS), help="the dataset (build: required)")
    p.add_argument("--config", nargs="+", metavar="CONFIG", help="build only these configs (default: all)")
    p.add_argument("--data-dir", type=entry.out_dir,
                   help="the TFDS data folder (default: $TFDS_DATA_DIR, else ~/tensorflow_datasets)")
    p.add_argument("--source", type=entry.input_dir,
                   help="folder of the files of a dataset the package does not ship (mimir: the ngram_7_0.2 folder "
                        "holding members/ and nonmembers/, or the folder holding it; default $MIA_JAX_MIMIR or "
                        "../shared/data/mimir)")
    options.no_progress(p)


@dataclass(frozen=True)
class DatasetsRequest(CommandRequest):
    """``mia-jax datasets`` as asked: the ``action`` on dataset ``name`` (its configs ``config``; ``source``: the
    files of one the package does not ship) in ``data_dir``."""
    COMMAND: ClassVar[str] = NAME
    action: Literal["build", "list"]
    name: str | None
    config: tuple[str, ...] | None
    data_dir: Path | None
    source: Path | None
    no_progress: bool


def run(args: argparse.Namespace) -> None:
    """``mia-jax datasets`` with the parsed ``args`` made into its request (:meth:`DatasetsRequest.from_args`, the
    only reader of ``args``), then :func:`run_request`."""
    run_request(DatasetsRequest.from_args(args))


def run_request(request: DatasetsRequest) -> None:
    """``mia-jax datasets`` as ``request`` asks: every argument checked before anything is written."""
    r = request
    # here, not at the top: they import tensorflow-datasets (~0.3 s and more on a loaded machine), which no other
    # command needs at start-up (every command module is imported by the CLI)
    from mia_jax.data import builders, tfds_source

    data_dir = Path(r.data_dir).expanduser() if r.data_dir else tfds_source.default_data_dir()
    if r.action == "list":
        if r.config or r.source:
            raise UserError("--config and --source apply to build, not list")
        for name in ([r.name] if r.name else builders.BUILDERS):
            for config in builders.configs(name):
                print(f"tfds:{name}/{config}\t{_state(f'tfds:{name}/{config}', data_dir)} in {data_dir}")
        return
    if r.name is None:
        raise UserError(f"name the dataset to build: mia-jax datasets build NAME ({', '.join(data.TFDS_DATASETS)})")
    if r.source and r.name != "mimir":
        raise UserError(f"--source: {r.name} is built from the files the package ships; --source is for mimir")
    entry.check_out(data_dir, "--data-dir")
    for config, folder, n, new in builders.build(r.name, data_dir, list(r.config or ()), r.source,
                                                 progress=not r.no_progress):
        print(f"tfds:{r.name}/{config}: {n} rows in {folder}{'' if new else ' (already built: kept)'}")
    print(f"next: mia-jax eval --data tfds:{r.name}/{(r.config or builders.configs(r.name))[0]} "
          f"--data-dir {data_dir}")


def _state(spec: str, data_dir: Path) -> str:
    """What ``datasets list`` says of ``spec`` in ``data_dir``: ``built VERSION, ...`` for the versions that read,
    ``broken VERSION (why)`` for each that does not (:func:`mia_jax.data.tfds_source.problem`), or ``not built``."""
    from mia_jax.data import tfds_source

    name, config, _ = tfds_source.parse_spec(spec)
    versions = [v.name for v in tfds_source._built(data_dir / name / config)]
    why = {v: tfds_source.problem(spec, data_dir, v) for v in versions}
    good = [v for v in versions if why[v] is None]
    parts = [f"built {', '.join(good)}"] if good else []
    parts += [f"broken {v} ({why[v]})" for v in versions if why[v] is not None]
    return "; ".join(parts) or "not built"
