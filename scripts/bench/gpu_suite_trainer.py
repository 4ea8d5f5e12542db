"""The ``trainer`` part of ``scripts/bench/gpu_suite.py`` (its worker runs in a process of its own, as every part's).

``trainer``: the trainer's own loop (``train.trainer.train``, as a contamination run or ``python -m train.finetune``
trains) on the ``--trainer-shape`` folder (default ``llama-1b``): float32 master weights and AdamW, bfloat16 compute,
``--trainer-batch`` x ``--trainer-seq-len`` tokens a step (default 16 x 2048; random token ids: speed does not depend
on them), FSDP over the local devices (``train.mesh=fsdp=N``), ``--trainer-remat`` (default layer), 2W steps (W =
``--trainer-window``, default 32) with an Orbax checkpoint every W steps (``train.checkpoint_every``), written
asynchronously: after step W and after step 2W. From the run's ``speed.jsonl`` (train/speed.py; one line per step,
the wall time of the loop's iteration): the first step (compilation included); the window of steps 2..W - 1 (no
save); the first save's blocking part (step W's line: the device-to-host copy, the host's buffers allocated for the
first time); the window of steps W + 1..2W: the first checkpoint's background write overlapping its steps and the
second save's blocking part in its last (a save every W steps in a steady run). Of each window: mean step time,
tokens/s (target tokens: seq-len - 1 per sequence) and MFU (``train.speed.train_flops``: 3 x the forward's model
FLOPs) against ``--peak-tflops`` x devices. W must give the first write time to finish (about 11 GiB at the 1B
shape; the H200 of BENCHMARKS.md wrote it in about 11 s, 21 steps), or the second save's line includes the wait.
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from mia_jax.runs import entry


def _window(value: str) -> int:
    """``--trainer-window``: an integer >= 3 (a window of steps 2..W - 1 without a save)."""
    w = entry.positive_int(value)
    if w < 3:
        raise argparse.ArgumentTypeError(f"{w}: the trainer part needs W >= 3 (steps 2..W - 1 without a save)")
    return w


def add_trainer_args(ap) -> None:
    """The trainer part's options on the suite's parser."""
    ap.add_argument("--trainer-shape", help="shape of the trainer part (default llama-1b; --smoke: tiny)")
    ap.add_argument("--trainer-batch", type=entry.positive_int,
                    help="sequences per step of the trainer part (default 16; --smoke: 2)")
    ap.add_argument("--trainer-seq-len", type=entry.positive_int,
                    help="tokens per sequence of the trainer part (default 2048; --smoke: 64)")
    ap.add_argument("--trainer-window", type=_window,
                    help="steps between the trainer part's checkpoints: 2W steps in all, W >= 3 "
                    "(default 32; --smoke: 3)")
    ap.add_argument("--trainer-remat", default="layer", choices=["none", "layer"],
                    help="train.remat of the trainer part (default layer)")


def trainer_spec(args, work: Path, shape: str) -> dict:
    """The spec of the trainer part (``worker_trainer``)."""
    return dict(kind="trainer", model=str(work / "models" / shape), cache=str(work / "jax-cache-trainer"),
                workdir=str(work / "trainer-run"), batch_size=args.trainer_batch, seq_len=args.trainer_seq_len,
                window=args.trainer_window, remat=args.trainer_remat, peak_tflops=args.peak_tflops)


def worker_trainer(spec, result):
    """``train.trainer.train`` at the spec's shape (see the module docstring); ``result``: the speed.jsonl
    lines and what the figures need."""
    if spec.get("cache"):
        from mia_jax.engine import compilation

        compilation.enable(spec["cache"])  # before any jit
    import jax
    import numpy as np

    from mia_jax import models
    from train.config import TrainConfig
    from train.data import Batches, PackedData
    from train.speed import SPEED_LOG, read_log, train_flops_per_token
    from train.trainer import fingerprint, train

    t0 = time.perf_counter()
    loaded = models.load(spec["model"])  # float32: the trainer's master weights
    result["load_s"] = time.perf_counter() - t0
    w, batch, seq = spec["window"], spec["batch_size"], spec["seq_len"]
    ids = np.random.default_rng(0).integers(0, loaded.config.vocab_size, (2 * w * batch, seq), dtype=np.int32)
    data = PackedData(ids, np.ones(ids.shape, bool), ids.size, 0)
    cfg = TrainConfig(seq_len=seq, batch_size=batch, compute_dtype="bfloat16", remat=spec["remat"],
                      mesh=f"fsdp={jax.device_count()}", checkpoint_every=w, keep_checkpoints=1,
                      peak_tflops=spec["peak_tflops"], shuffle=False, progress=False)
    workdir = Path(spec["workdir"])
    shutil.rmtree(workdir, ignore_errors=True)
    train(loaded.model, Batches(data, batch, shuffle=False), cfg, workdir, fingerprint(cfg, data=data.digest()))
    dev = jax.devices()[0]
    result.update(lines=read_log(workdir / SPEED_LOG), window=w, batch_size=batch, seq_len=seq, remat=cfg.remat,
                  mesh=cfg.mesh, devices=jax.device_count(), flops_per_token=train_flops_per_token(loaded.model, seq),
                  checkpoint_bytes=sum(f.stat().st_size for f in (workdir / "checkpoints").rglob("*") if f.is_file()),
                  device=f"JAX {dev.platform}: {dev.device_kind}", versions={"jax": jax.__version__},
                  device_peak=(dev.memory_stats() or {}).get("peak_bytes_in_use"))
    shutil.rmtree(workdir / "checkpoints", ignore_errors=True)  # gigabytes at the 1B shape
