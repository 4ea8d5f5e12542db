"""Continued pretraining of a model on your own texts, exported in the Hugging Face layout: the recipe behind the
audit demonstrations (books a model was trained on; a forget set learned, then unlearned by gradient ascent).

    python -m train.finetune --model smollm2 --texts seen.jsonl --out runs/seen train.epochs=2
    python -m train.finetune --model runs/seen/model --texts forget.jsonl --out runs/unlearned \\
        train.objective=ascent train.lr=1e-5

``--texts``: a JSONL / CSV / Parquet file with a ``text`` field (``--text-field``), or bare JSON strings. The texts
are packed as in the contamination experiments (train/data.py: separator between documents, ``train.seq_len``
tokens per sequence, each token trained on once per epoch), written once as ArrayRecord to ``OUT/train/data`` and
read by grain in a seeded global shuffle (train/grain_input.py; ``train.sampler=numpy`` for the order of the runs
made before grain); ``OUT/train/batches.jsonl`` records each step's sequences. Overrides are the ``train.*`` keys
of the contamination configs (train/config.py; e.g. ``train.lr=3e-5 train.epochs=3 train.objective=ascent``) and
``model.dtype``; other sections are refused, since they would do nothing here. The run resumes from its last
checkpoint when the same command is run again, also on another mesh (``train.mesh=...``); the finished model is
``OUT/model`` and ``OUT/train.json`` holds the losses and the speed (``OUT/train/speed.jsonl``: each step's tokens/s and
MFU against ``train.peak_tflops``, train/speed.py). On several hosts each runs the same command with
``--distributed`` (or ``MIA_JAX_DISTRIBUTED=1``) on a shared ``--out``; a ``SIGTERM`` (a preemption notice) to any
process stops every process after the same step, checkpointed, with exit status 75: the same command resumes it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mia_jax.runs import processes
from mia_jax.runs import entry, rundir
from mia_jax import models
from mia_jax.commands import options
from mia_jax.data import load_records
from mia_jax.errors import UserError
from train.config import load_config
from train.data import pack_stream, separator_id
from train.grain_input import packed_records
from train.placement import memory_from_env

PROG = "python -m train.finetune"
ALLOWED = ("train.", "model.dtype=")
# what may change between a run and its resumption (as the trainer's fingerprint: train.trainer.NOT_IN_FINGERPRINT)
NOT_IN_FINGERPRINT = ("progress", "mesh", "checkpoint_every", "keep_checkpoints", "peak_tflops")


def build_parser() -> entry.ArgumentParser:
    """The argument parser of ``python -m train.finetune``."""
    p = entry.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the model to train (a Hugging Face folder, a .gguf, smollm2, ...)")
    p.add_argument("--texts", required=True, type=entry.input_file,
                   help="the training texts (JSONL / CSV / Parquet)")
    options.text(p, "--texts")
    p.add_argument("--out", required=True, type=entry.out_dir, help="output folder (an interrupted run in it resumes)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run in --out (a folder of another run of this toolkit; never one holding an "
                        "input, one inside a run or a folder of anything else)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--distributed", action="store_true",
                   help="multi-host: call jax.distributed.initialize() first (also when $MIA_JAX_DISTRIBUTED=1; see "
                        "the README's multi-host section for $MIA_JAX_COORDINATOR etc.); every host runs the same "
                        "command")
    p.add_argument("overrides", nargs="*", help="train.key=value (and model.dtype=...) overrides")
    return p


def finetune(model: str, texts: list[str], out: str | Path, overrides=(), *, progress: bool = True,
             overwrite: bool = False, texts_name: str = "texts", on_step=None, inputs=()) -> dict:
    """Train ``model`` on ``texts`` with the ``train.*`` ``overrides``; ``on_step(step)`` is called after each step
    (and its checkpoint, if any). ``overwrite``: replace the run in ``out`` (``rundir.claim``: refused for a folder
    that is no run, is inside one, or holds the model or one of ``inputs``, the files the texts were read from).
    Returns OUT/train.json's content."""
    from train.experiment import check_seq_len, model_context, train_and_export  # ~0.15 s (runner): only to train

    bad = [o for o in overrides if not o.startswith(ALLOWED)]
    if bad:
        raise UserError(f"only train.* and model.dtype overrides apply to finetuning, got {', '.join(bad)}")
    cfg = load_config(None, overrides)
    if not progress:
        cfg.train.progress = False
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise UserError(f"{texts_name}: no non-empty text to train on")
    out = entry.check_out(out)
    memory_from_env()
    source = models.resolve_model(model)
    check_seq_len(cfg.train.seq_len, model_context(source), f"model {model}")  # before loading it
    loaded = models.load(model, dtype=cfg.model.dtype)
    check_seq_len(cfg.train.seq_len, loaded.max_length, f"model {model}")
    sep = separator_id(loaded.tokenizer, loaded.eos_token_id, cfg.train.separator)
    packing = pack_stream(texts, loaded.tokenizer, cfg.train.seq_len, sep)  # refused before the claim if too short
    kept = {k: v for k, v in vars(cfg.train).items() if k not in NOT_IN_FINGERPRINT and (k, v) != ("sampler", "numpy")}
    fp = {"model_files": loaded.files, "data": packing.sha256, "train": json.loads(json.dumps(kept))}
    with rundir.claim(out, fp, overwrite=overwrite, inputs=[*inputs, model, source, *loaded.files],
                      hint="use another --out, the original command, or --overwrite to start afresh"):
        data = packed_records(out / "train" / "data", texts, loaded.tokenizer, cfg.train.seq_len, sep, packing.sha256)
        info = train_and_export(loaded, data, cfg.train, sep, out, on_step=on_step)
        info = {"model": loaded.name, "texts": texts_name, "n_texts": len(texts), "train": vars(cfg.train),
                "command": " ".join(sys.argv), **info}
        if processes.is_main_process():
            (out / "train.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    print(f"{info['steps']} steps (objective {cfg.train.objective}), loss "
          f"{info['first_loss']:.3f} -> {info['final_loss']:.3f}; model in {out / 'model'}", file=sys.stderr)
    return info


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    processes.initialize_distributed(args.distributed)  # before anything touches a device
    ds = load_records(str(args.texts), args.text_field, None, encoding=args.encoding)
    finetune(args.model, list(ds.texts), args.out, args.overrides, progress=not args.no_progress,
             overwrite=args.overwrite, texts_name=str(args.texts), inputs=[args.texts, *ds.files])
    return 0


def main(argv=None) -> int:
    """Runs the command with ``argv`` (default: sys.argv[1:]); returns the exit status."""
    return entry.run(PROG, _main, argv, resume_hint="run the same command again to resume from the last checkpoint")


if __name__ == "__main__":
    sys.exit(main())
