"""Throughput of training: the model FLOP count, and ``speed.jsonl``, the trainer's per-step wall-clock log.

Model FLOPs (the project's one count: scripts/bench/benchmark.py, benchmark_train.py and gpu_suite.py call these): the
forward pass over a sequence of n tokens costs, per token, 2 x every weight matrix of the decoder layers plus
2 x V x D for the LM head, and 4 n^2 x layers x attention width for attention (QK^T and PV, the causal mask not
discounted); padding is not useful work and is not counted. A training step costs 3 x the forward (the backward
twice the forward): 6 x parameters x tokens plus attention. Remat's recomputation is not counted (model FLOPs, not
hardware FLOPs).

``speed.jsonl`` (``SpeedLog``; process 0 writes it in the run's workdir, one line per step, flushed): ``{"step",
"seconds", "tokens", "tokens_per_s", "mfu"}``, where ``seconds`` is the wall time of the step's whole iteration of
the loop (input, the step, its metrics, the blocking part of a checkpoint save started at it), ``tokens`` the
step's target tokens, and MFU = the model FLOPs of those tokens / seconds / (``train.peak_tflops`` x the mesh's
devices), null without a peak. The first step after a start carries ``"compile": true`` and no rates (it includes
the compilation); a step after which a checkpoint save started carries ``"save": true`` and ``"save_s"`` (what the
save blocked: waiting for the previous write, the device-to-host copy); one that began while an earlier save was
still being written in the background carries ``"saving": true``. Wall-clock figures never enter the deterministic
records (``metrics.jsonl``, ``batches.jsonl``, the checkpoints): a resumed run appends its steps' lines to the file.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

SPEED_LOG = "speed.jsonl"


def layer_weights(model) -> list:
    """The stacked per-layer weight matrices (state paths ``layers/w*``, [L, ...]) of ``model``'s forward matmuls."""
    import jax
    from flax import nnx

    from mia_jax.engine import sharding

    return [v for p, v in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]
            if sharding.path_str(p).startswith("layers/w") and np.ndim(v) >= 3]


def forward_flops(model, lengths: Iterable[int]) -> int:
    """Model FLOPs of ``model``'s forward pass over sequences of the given lengths (see the module docstring)."""
    import jax

    layer_matmul = sum(int(np.prod(np.shape(w))) for w in layer_weights(model))
    v, d = jax.eval_shape(model.unembedding).shape  # no device work (nor a copy of the array)
    cfg = model.config
    heads = cfg.num_attention_heads
    attn_width = heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    per_token = 2 * layer_matmul + 2 * v * d
    return sum(n * per_token + 4 * n * n * cfg.num_hidden_layers * attn_width for n in lengths)


def train_flops(model, lengths: Iterable[int]) -> int:
    """Model FLOPs of a training step (forward and backward) over sequences of the given lengths: 3 x the forward."""
    return 3 * forward_flops(model, lengths)


def train_flops_per_token(model, seq_len: int) -> float:
    """Training FLOPs per target token of the trainer's packed sequences of ``seq_len`` tokens (the forward runs on
    the first ``seq_len - 1``, each predicting the next)."""
    n = max(1, seq_len - 1)
    return train_flops(model, [n]) / n


class SpeedLog:
    """``speed.jsonl`` (module docstring) and the run's totals over its timed steps. ``path`` None: totals only (the
    processes other than 0). ``start``: the step resumed from (0: a new file; else the lines are appended).
    ``peak_flops``: FLOP/s of the whole mesh, or None (no MFU)."""

    def __init__(self, path: Path | None, start: int, flops_per_token: float, peak_flops: float | None):
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.file = path.open("a" if start else "w") if path is not None else None
        self.first, self.tokens, self.seconds = True, 0, 0.0

    def mfu(self, tokens: float, seconds: float) -> float | None:
        """Model FLOP utilisation of ``tokens`` target tokens in ``seconds`` (None without a peak)."""
        if self.peak_flops is None or not seconds:
            return None
        return tokens * self.flops_per_token / seconds / self.peak_flops

    def write(self, step: int, seconds: float, tokens: int, save_s: float | None = None,
              saving: bool = False) -> dict:
        """Record step ``step`` (its line appended and flushed); returns the line."""
        line = {"step": step, "seconds": seconds, "tokens": tokens, "tokens_per_s": None, "mfu": None}
        if self.first:
            line["compile"] = True
        else:
            self.tokens += tokens
            self.seconds += seconds
            line.update(tokens_per_s=tokens / seconds if seconds > 0 else None, mfu=self.mfu(tokens, seconds))
        if save_s is not None:
            line.update(save=True, save_s=save_s)
        if saving:
            line["saving"] = True
        self.first = False
        if self.file is not None:
            self.file.write(json.dumps(line) + "\n")
            self.file.flush()
        return line

    @property
    def tokens_per_s(self) -> float | None:
        """Target tokens per second over the timed steps (the compile step left out); None before any."""
        return self.tokens / self.seconds if self.seconds else None

    def postfix(self) -> dict:
        """The progress bar's throughput fields: tokens/s and MFU (when known) over the timed steps so far."""
        rate, mfu = self.tokens_per_s, self.mfu(self.tokens, self.seconds)
        return {"tok_s": f"{rate:.0f}" if rate else "-", **({"mfu": f"{100 * mfu:.1f}%"} if mfu is not None else {})}

    def close(self) -> None:
        """Close the file."""
        if self.file is not None:
            self.file.close()
            self.file = None


def read_log(path: str | Path) -> list[dict]:
    """The lines of a ``speed.jsonl``."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def window(lines: Sequence[dict]) -> dict:
    """Figures of a window of ``speed.jsonl`` lines, compile lines left out: ``steps``, ``step_s`` (mean seconds),
    ``tokens_per_s`` (tokens / seconds of the whole window) and ``mfu`` (of the whole window: the lines' MFU weighted
    by their seconds; None when a line has none). An empty window: steps 0 and the rest None."""
    timed = [r for r in lines if not r.get("compile")]
    seconds = sum(r["seconds"] for r in timed)
    if not timed or not seconds > 0:
        return {"steps": len(timed), "step_s": None, "tokens_per_s": None, "mfu": None}
    mfus = [r.get("mfu") for r in timed]
    mfu = None if any(m is None or not math.isfinite(m) for m in mfus) else \
        sum(m * r["seconds"] for m, r in zip(mfus, timed)) / seconds
    return {"steps": len(timed), "step_s": seconds / len(timed),
            "tokens_per_s": sum(r["tokens"] for r in timed) / seconds, "mfu": mfu}
