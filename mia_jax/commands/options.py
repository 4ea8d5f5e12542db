"""The options several ``mia-jax`` commands share, each declared once here: the model (``--model``,
``--tokenizer``, ``--dtype``, ``--allow-download``), the data (``--data`` / ``--benchmark``, ``--data-dir``,
``--encoding``, ``--text-field``, ``--label-field``, ``--limit``), the run folder (``--out``, ``--overwrite``,
``--no-progress``), the device mesh (``--mesh``, ``--distributed``) and the batch sizes of scoring (``--batch-size``,
``--chunk-size``). A command passes what differs between commands (a default, what the option applies to) as
arguments; the option itself, its type and its help are the same everywhere."""
from __future__ import annotations

import argparse

from mia_jax import benchmarks
from mia_jax.data import data_input
from mia_jax.runs import entry

# What Ctrl-C tells the user of a command that keeps its finished work (a command module's RESUME_HINT).
RESUME = ("every finished batch is in the output folder's passes/*.jsonl: run the same command again to resume from "
          "them")
DTYPES = ["float32", "bfloat16"]


def model(p: argparse.ArgumentParser, *, dtype: str | None = "float32", weights: bool = True,
          tokenizer: bool = False, reads: str = "") -> None:
    """``--model`` (default smollm2; ``reads``: what of it the command reads, for the help), ``--tokenizer`` when
    ``tokenizer``, ``--dtype`` when the command loads the ``weights`` (default ``dtype``; None: chosen by the device,
    see its help) and ``--allow-download`` on ``p``."""
    p.add_argument("--model", default="smollm2",
                   help=f"a Hugging Face folder, a .gguf file, or an offline name (smollm2){reads}. Default: smollm2")
    if tokenizer:
        p.add_argument("--tokenizer", type=entry.input_file, help="tokenizer.json to use instead of the model's own")
    if weights:
        p.add_argument("--dtype", default=dtype, choices=DTYPES,
                       help="parameter dtype" if dtype else "parameter and forward dtype; the statistics are float32 "
                            "either way (default: bfloat16 on GPU and TPU, float32 on CPU)")
    p.add_argument("--allow-download", action="store_true",
                   help="let a --model that is not a local path be fetched from the Hugging Face Hub (also: an "
                        "hf://org/name model). Default: local paths and packaged names only, no network")


def data(p: argparse.ArgumentParser, *, labeled: bool) -> None:
    """The texts to score on ``p``: ``--data`` (required unless ``labeled``, where ``--benchmark`` and each
    benchmark's own options, :mod:`mia_jax.benchmarks`, are the other choice), ``--data-dir`` (:func:`data_dir`),
    ``--encoding`` / ``--text-field``
    (:func:`text`), ``--label-field`` when ``labeled``, and ``--limit``."""
    src = p.add_mutually_exclusive_group(required=not labeled)
    src.add_argument("--data", type=data_input, help="a .jsonl / .csv / .tsv / .parquet file, or a TFDS "
                     "dataset tfds:NAME[/CONFIG][:SPLIT] built in --data-dir (mia-jax datasets build)")
    if labeled:
        src.add_argument("--benchmark", choices=list(benchmarks.BENCHMARKS), help=benchmarks.choice_help())
        benchmarks.add_arguments(p)
    data_dir(p)
    text(p, "--data")
    if labeled:
        p.add_argument("--label-field", default="label", help="the field holding each text's label: 1 = member, "
                                                               "0 = non-member (default: label)")
    p.add_argument("--limit", type=entry.positive_int,
                   help="score only N texts: of labeled data a seeded sample balanced by label (N/2 of each class "
                        "where it has them, in file order), of unlabeled data the first N")


def data_dir(p: argparse.ArgumentParser) -> None:
    """``--data-dir`` on ``p``: the folder a ``--benchmark``'s files or a ``--data tfds:...`` dataset are read from."""
    p.add_argument("--data-dir", type=entry.input_dir,
                   help="folder of the data: a benchmark's files (--benchmark mimir: the folder of the --split, "
                        "or the one holding it, or the Hub's cache_100_200_1000_512, default $MIA_JAX_MIMIR or "
                        "../shared/data/mimir; wikimia-24 / wikimia-25: the Hub dataset's folder, data/*.parquet; "
                        "olmomia: the folder of the OLMoMIA scripts' .jsonl files), or the TFDS data folder of a "
                        "--data tfds:... dataset (default $TFDS_DATA_DIR, else ~/tensorflow_datasets)")


def text(p: argparse.ArgumentParser, of: str) -> None:
    """``--encoding`` (default utf-8) and ``--text-field`` (default: whichever of ``text`` and ``input`` the records
    have, :data:`mia_jax.data.TEXT_FIELDS`) of the text files ``of`` names (e.g. "--data") on ``p``."""
    p.add_argument("--encoding", default="utf-8",
                   help=f"text encoding of {of} (default: utf-8; e.g. latin-1, cp1252, utf-16)")
    p.add_argument("--text-field",
                   help=f"the field holding each text of {of} (default: the records' text or input field, as in "
                        "WikiMIA's files; a file with both must name one)")


def batches(p: argparse.ArgumentParser) -> None:
    """``--batch-size`` and ``--chunk-size`` of the scoring passes on ``p``."""
    p.add_argument("--batch-size", type=entry.positive_int, default=8,
                   help="texts per step of the passes that read one text per row (gradnorm, generated neighbours)")
    p.add_argument("--chunk-size", type=entry.positive_int,
                   help="vocabulary chunk of the statistics kernel (default: 1024 on the CPU, 8192 on accelerators)")


def run_folder(p: argparse.ArgumentParser, *, out_help: str, required: bool = False, redo: str = "start") -> None:
    """``--out`` (an output folder, ``entry.out_dir``; ``out_help`` says what it holds), ``--overwrite`` (``redo``:
    what starts afresh in the emptied folder) and ``--no-progress`` on ``p``."""
    p.add_argument("--out", required=required, type=entry.out_dir, help=out_help)
    p.add_argument("--overwrite", action="store_true",
                   help=f"replace the run in --out (even a run of another command) and {redo} afresh; a folder "
                        "that holds an input of this run, lies inside another run or holds no run is refused")
    no_progress(p)


def no_progress(p: argparse.ArgumentParser) -> None:
    """``--no-progress`` on ``p``: no progress bars."""
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def mesh(p: argparse.ArgumentParser) -> None:
    """``--mesh`` (how the model and the batches are sharded over the devices) and ``--distributed`` (multi-host)
    on ``p``."""
    p.add_argument("--mesh", metavar="SPEC",
                   help="shard the model and the batches over a device mesh: comma-separated axis=size over the axes "
                        "data, fsdp, model (e.g. data=4,model=2; an axis left out is 1, except data, which takes the "
                        "remaining devices; 'auto' = every device on data). Default: one device (on several "
                        "processes: auto)")
    p.add_argument("--distributed", action="store_true",
                   help="multi-host: call jax.distributed.initialize() first (also when $MIA_JAX_DISTRIBUTED=1); "
                        "the coordinator comes from $MIA_JAX_COORDINATOR, $MIA_JAX_NUM_PROCESSES, $MIA_JAX_PROCESS_ID "
                        "or JAX's cluster detection (TPU pods, SLURM, Open MPI). Run the same command on every host")
