"""train/speed.py and what the trainer does with it: ``speed.jsonl`` (one line per step: wall time, tokens, tokens/s,
MFU against ``train.peak_tflops``; the compile step and the save steps marked; appended on resume), kept out of the
deterministic records; the model FLOP count shared with the benchmark scripts; asynchronous checkpoint saves (steps
go on while a checkpoint is written; ``on_step`` and a resume still see complete checkpoints). No wall-clock value
is asserted beyond being positive and finite."""
import asyncio
import json
import math
from pathlib import Path

import jax
import pytest

from mia_jax import models
from train import finetune, speed
from train.config import TrainConfig, load_config
from train.data import Batches, pack, separator_id
from train.experiment import NOT_COMPARED
from train.trainer import NOT_IN_FINGERPRINT, fingerprint, train

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tiny_llama_dir):
    loaded = models.load(str(tiny_llama_dir))
    docs = [f"Line {i}: a small text about the number {i % 7} and nothing else." for i in range(60)]
    data = pack(docs, loaded.tokenizer, 32, separator_id(loaded.tokenizer, loaded.eos_token_id))
    return loaded, data


def cfg_(**kw) -> TrainConfig:
    return TrainConfig(**{"seq_len": 32, "batch_size": 4, "lr": 1e-3, "checkpoint_every": 3, "progress": False, **kw})


def _lines(workdir: Path) -> list[dict]:
    return speed.read_log(workdir / speed.SPEED_LOG)


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_speed_log_one_line_per_step(setup, tmp_path):
    loaded, data = setup
    b = Batches(data, 4)
    total = b.total_steps
    assert total >= 5
    plain = train(loaded.model, b, cfg_(), tmp_path / "plain", fingerprint(cfg_()))
    peaked = train(loaded.model, b, cfg_(peak_tflops=0.5), tmp_path / "peak", fingerprint(cfg_(peak_tflops=0.5)))
    for run, result, with_peak in ((tmp_path / "plain", plain, False), (tmp_path / "peak", peaked, True)):
        lines = _lines(run)
        assert [r["step"] for r in lines] == list(range(1, total + 1))
        first, rest = lines[0], lines[1:]
        assert first["compile"] is True and first["tokens_per_s"] is None and first["mfu"] is None
        assert _finite_positive(first["seconds"])
        for r in rest:
            assert "compile" not in r
            assert _finite_positive(r["seconds"]) and _finite_positive(r["tokens_per_s"]) and r["tokens"] > 0
            assert _finite_positive(r["mfu"]) if with_peak else r["mfu"] is None
        saves = [r["step"] for r in lines if r.get("save")]
        assert saves == [s for s in range(1, total + 1) if s % 3 == 0 or s == total]
        assert all(r["save_s"] >= 0 for r in lines if r.get("save"))
        # the result's throughput is the file's, the compile step left out
        w = speed.window(lines)
        assert w["steps"] == total - 1 and result.tokens_per_second == pytest.approx(w["tokens_per_s"])
        assert result.seconds == pytest.approx(sum(r["seconds"] for r in rest))
    # MFU = the step's model FLOPs / seconds / (peak x devices)
    per_token = speed.train_flops_per_token(loaded.model, 32)
    for r in _lines(tmp_path / "peak")[1:]:
        assert r["mfu"] == pytest.approx(r["tokens"] * per_token / r["seconds"] / (0.5e12 * jax.device_count()))
    # the peak is display only: the same fingerprint, and the deterministic records carry no wall-clock figure
    assert fingerprint(cfg_()) == fingerprint(cfg_(peak_tflops=0.5))
    for name in ("metrics.jsonl", "batches.jsonl", "fingerprint.json"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "peak" / name).read_bytes(), name
    assert set(json.loads((tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()[0])) == {
        "step", "loss", "grad_norm", "lr", "tokens"}


def test_speed_log_appended_on_resume(setup, tmp_path):
    loaded, data = setup
    b = Batches(data, 4)
    total, cfg = b.total_steps, cfg_()

    class Killed(Exception):
        pass

    def kill_at_5(step):
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        train(loaded.model, b, cfg, tmp_path, fingerprint(cfg), on_step=kill_at_5)
    assert train(loaded.model, b, cfg, tmp_path, fingerprint(cfg)).resumed_from == 3
    lines = _lines(tmp_path)
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5] + list(range(4, total + 1))
    assert [i for i, r in enumerate(lines) if r.get("compile")] == [0, 5]  # each start's first step
    # a fresh start (no checkpoint) begins the file again
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / speed.SPEED_LOG).write_text('{"step": 99}\n')
    train(loaded.model, b, cfg, fresh, fingerprint(cfg))
    assert [r["step"] for r in _lines(fresh)] == list(range(1, total + 1))


@pytest.fixture
def slow_meta_write(monkeypatch):
    """The checkpoints' ``meta`` item written 0.5 s late, in Orbax's background thread (the blocking part of a save is
    unchanged): a step that overlaps the write shows it."""
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as J

    original = J.JsonCheckpointHandler._save_fn

    async def slow(self, x, directory):
        await asyncio.sleep(0.5)
        return await original(self, x, directory)

    monkeypatch.setattr(J.JsonCheckpointHandler, "_save_fn", slow)


def test_saves_are_asynchronous(setup, tmp_path, slow_meta_write):
    loaded, data = setup
    b = Batches(data, 4)
    total, cfg = b.total_steps, cfg_(checkpoint_every=4)
    full = train(loaded.model, b, cfg, tmp_path / "full", fingerprint(cfg))
    lines = _lines(tmp_path / "full")
    # the step after each save began while that checkpoint was still being written
    for s in range(4, total, 4):
        assert lines[s - 1].get("save") and lines[s].get("saving"), lines[s - 1: s + 1]
    # the run waited for the last write: every checkpoint complete, no temporary folder left
    names = sorted(p.name for p in (tmp_path / "full" / "checkpoints").iterdir())
    assert str(total) in names and not [n for n in names if "tmp" in n], names
    # on_step sees its step's checkpoint complete; a run killed there resumes from it, as the uninterrupted run ends
    seen = {}

    class Killed(Exception):
        pass

    def hook(step):
        seen[step] = (tmp_path / "cut" / "checkpoints" / str(step) / "meta").is_dir()
        if step == 4:
            raise Killed

    with pytest.raises(Killed):
        train(loaded.model, b, cfg, tmp_path / "cut", fingerprint(cfg), on_step=hook)
    assert seen[4] and not any(seen[s] for s in (1, 2, 3))
    resumed = train(loaded.model, b, cfg, tmp_path / "cut", fingerprint(cfg))
    assert resumed.resumed_from == 4 and resumed.metrics == full.metrics
    assert (tmp_path / "cut" / "metrics.jsonl").read_bytes() == (tmp_path / "full" / "metrics.jsonl").read_bytes()


def test_an_error_waits_for_the_write_in_flight(setup, tmp_path, slow_meta_write, monkeypatch):
    """An exception out of the loop (here one step after a checkpoint started) leaves no write of this process going:
    the checkpoint is complete when ``train`` raises, so a resume in the same process finds it."""
    loaded, data = setup
    b = Batches(data, 4)
    cfg = cfg_(checkpoint_every=2)

    class Boom(Exception):
        pass

    from train import placement

    calls = {"n": 0}
    original = placement.global_batch

    def failing(mesh, x, shape):
        calls["n"] += 1
        if calls["n"] == 5:  # step 3's ids: the checkpoint of step 2 is being written (0.5 s)
            raise Boom
        return original(mesh, x, shape)

    monkeypatch.setattr(placement, "global_batch", failing)
    with pytest.raises(Boom):
        train(loaded.model, b, cfg, tmp_path, fingerprint(cfg))
    monkeypatch.setattr(placement, "global_batch", original)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["2"], names
    assert train(loaded.model, b, cfg, tmp_path, fingerprint(cfg)).resumed_from == 2


def test_peak_tflops_is_display_only_everywhere():
    """The key is out of every fingerprint and resume comparison of the trainer, finetune and the experiment."""
    assert "peak_tflops" in NOT_IN_FINGERPRINT
    assert set(finetune.NOT_IN_FINGERPRINT) == set(NOT_IN_FINGERPRINT)
    assert {k for s, k in NOT_COMPARED if s == "train"} == set(NOT_IN_FINGERPRINT)
    assert load_config(None, ["train.peak_tflops=989"]).train.peak_tflops == 989.0
    assert load_config(None, ["train.peak_tflops=null"]).train.peak_tflops is None
    from mia_jax.errors import UserError

    with pytest.raises(UserError, match="train.peak_tflops must be positive"):
        load_config(None, ["train.peak_tflops=0"])


def test_one_flop_count_for_the_scripts(setup, monkeypatch):
    """scripts/bench/benchmark.py and benchmark_train.py count with train.speed (6 N per token plus attention)."""
    loaded, _ = setup
    monkeypatch.syspath_prepend(str(REPO / "scripts" / "bench"))
    import benchmark
    import benchmark_train

    lengths = [31, 7]
    assert benchmark.model_flops(loaded, lengths) == speed.forward_flops(loaded.model, lengths)
    args = type("A", (), {"seq_len": 32, "batch_size": 2})()
    assert benchmark_train.step_flops(loaded, args) == 3 * speed.forward_flops(loaded.model, [32, 32])
    cfg = loaded.config
    params = sum(int(x.size) for x in speed.layer_weights(loaded.model)) + int(loaded.model.unembedding().size)
    attn = 4 * 31 * 31 * cfg.num_hidden_layers * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    assert speed.train_flops(loaded.model, [31]) == 3 * (2 * params * 31 + attn)
    assert speed.train_flops_per_token(loaded.model, 32) == speed.train_flops(loaded.model, [31]) / 31


def test_window():
    lines = [{"step": 1, "seconds": 9.0, "tokens": 10, "tokens_per_s": None, "mfu": None, "compile": True},
             {"step": 2, "seconds": 1.0, "tokens": 10, "tokens_per_s": 10.0, "mfu": 0.2},
             {"step": 3, "seconds": 3.0, "tokens": 10, "tokens_per_s": 10 / 3, "mfu": 0.2 / 3}]
    w = speed.window(lines)
    assert w == pytest.approx({"steps": 2, "step_s": 2.0, "tokens_per_s": 5.0, "mfu": 0.1})
    assert speed.window(lines[:1]) == {"steps": 0, "step_s": None, "tokens_per_s": None, "mfu": None}
    assert speed.window([dict(r, mfu=None) for r in lines])["mfu"] is None
