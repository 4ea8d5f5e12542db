"""train/grain_input.py and train/data.py: the packed sequences round-trip through ArrayRecord exactly, grain's
seeded order (and the NumPy order of the runs made before it), per-process shards of every global batch disjoint
and covering it, and ``python -m train.finetune`` killed with SIGKILL mid-epoch after a checkpoint and resumed on
another mesh: the same batches in the same order (batches.jsonl) and the uninterrupted run's losses and parameters
within 1e-5.

The runs are subprocesses with 4 CPU devices (JAX fixes its device count when it starts), as in
test_train_sharding.py: the uninterrupted and the killed run on ``data=2,model=2`` (tensor parallel, the batch split
in two), the resumed run on ``data=4`` (replicated parameters, the batch split in four); the uninterrupted and the
killed run start together to share the wall-clock.
"""
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import grain.python as grain
import jax
import numpy as np
import pytest
from safetensors.numpy import load_file
from test_sharding import _env
from tokenizers import Tokenizer

from mia_jax import models
from train.config import TrainConfig
from train.data import Batches, make_sampler, pack, pack_stream
from train.grain_input import (RECORDS, decode, open_records, packed_records, process_shard, shard_rows, step_batch,
                               step_iterator)
from train.trainer import fingerprint, train

HERE = Path(__file__).parent
HELPER = HERE / "grain_train_check.py"
TIMEOUT = 600
DEVICES, MESH, OTHER_MESH = 4, "data=2,model=2", "data=4"
N_TEXTS = 26  # 49 sequences of 32 tokens: 7 steps of 8 per epoch
KILL_AT = 5  # checkpoints every 4 steps: killed one step after the checkpoint of step 4, in the first epoch
OVERRIDES = ["train.seq_len=32", "train.batch_size=8", "train.grad_accum=2", "train.lr=3e-3", "train.epochs=2",
             "train.checkpoint_every=4", "train.schedule=cosine", "train.warmup_steps=2", "train.seed=7"]


def _texts(path: Path, n: int = 60) -> list[str]:
    texts = [f"Chapter {i}. The lighthouse keeper counted {i % 7} ships before the storm of year {1900 + i}."
             for i in range(n)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return texts


@pytest.fixture(scope="module")
def tok(tiny_llama_dir):
    return Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))


# ----------------------------------------------------------------------------- the file and the order


def test_array_record_round_trips_the_packed_sequences(tok, tmp_path):
    docs = _texts(tmp_path / "t.jsonl", 80)
    packed = pack(docs, tok, 24, separator=0)
    data = packed_records(tmp_path / "data", docs, tok, 24, 0)
    assert (data.n_sequences, data.n_tokens, data.digest()) == (packed.n_sequences, packed.n_tokens, packed.digest())
    assert pack_stream(docs, tok, 24, 0).sha256 == packed.digest()
    tokens, mask = data.rows(np.arange(data.n_sequences))
    assert tokens.dtype == np.int32 and np.array_equal(tokens, packed.tokens) and np.array_equal(mask, packed.mask)
    assert not packed.mask[-1].all()  # the last sequence's padding is in the file, masked
    source = grain.ArrayRecordDataSource(str(tmp_path / "data" / RECORDS))  # grain reads every record on its own
    assert len(source) == packed.n_sequences
    for i in (0, 5, packed.n_sequences - 1):
        assert all(np.array_equal(a, b) for a, b in zip(decode(source[i], 24), (packed.tokens[i], packed.mask[i])))
    ids, m = data.rows(np.array([[3, -1]]))  # a dummy row: separators, fully masked
    assert ids.shape == (1, 2, 24) and (ids[0, 1] == 0).all() and not m[0, 1].any()
    assert np.array_equal(ids[0, 0], packed.tokens[3])
    # written once: the same packing reuses the file, another one writes it again
    mtime = (tmp_path / "data" / RECORDS).stat().st_mtime_ns
    assert packed_records(tmp_path / "data", docs, tok, 24, 0).digest() == packed.digest()
    assert (tmp_path / "data" / RECORDS).stat().st_mtime_ns == mtime
    other = packed_records(tmp_path / "data", docs[:-1], tok, 24, 0)
    assert other.digest() == pack(docs[:-1], tok, 24, 0).digest() == open_records(tmp_path / "data").digest()
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [RECORDS, "sequences.json"]  # no temporary left


def test_seeded_orders(tok, tmp_path):
    n, epochs = 37, 3
    s = make_sampler(n, epochs, True, 7)
    orders = [[s[e * n + j].record_key for j in range(n)] for e in range(epochs)]
    assert all(sorted(o) == list(range(n)) for o in orders)  # every sequence once per epoch
    assert orders[0] != orders[1] != orders[2] and orders[0] != list(range(n))
    again = make_sampler(n, epochs, True, 7)
    assert orders[1] == [again[n + j].record_key for j in range(n)]
    assert orders[0] != [make_sampler(n, epochs, True, 8)[j].record_key for j in range(n)]
    assert [make_sampler(n, 1, False, 7)[j].record_key for j in range(n)] == list(range(n))
    # the NumPy order of the runs made before grain (the committed contamination study), reachable as a sampler
    numpy = make_sampler(n, epochs, True, 7, "numpy")
    for e in range(epochs):
        expected = np.random.default_rng([7, e]).permutation(n).tolist()
        assert [numpy[e * n + j].record_key for j in range(n)] == expected


def test_process_shards_are_disjoint_and_cover_every_row(tok, tmp_path):
    """Two simulated processes (grain ShardOptions 0/2 and 1/2) over an ArrayRecord file: each reads its own block of
    every micro-batch; together they are the single-process batch, and an epoch covers every sequence once."""
    docs = _texts(tmp_path / "t.jsonl", 80)
    data = packed_records(tmp_path / "data", docs, tok, 16, 0)
    b = Batches(data, batch_size=8, grad_accum=2, epochs=2, seed=5)
    micro = 4
    shards = [grain.ShardOptions(shard_index=i, shard_count=2) for i in range(2)]
    rows = [shard_rows(o, micro) for o in shards]
    assert rows == [slice(0, 2), slice(2, 4)] and [process_shard(r, micro) for r in rows] == shards
    for epoch in range(b.epochs):
        seen = []
        for step in range(epoch * b.steps_per_epoch, (epoch + 1) * b.steps_per_epoch):
            whole = step_batch(b, None, step)
            parts = [step_batch(b, o, step) for o in shards]
            index = whole["index"].reshape(2, micro)
            own = [set(index[:, r].ravel().tolist()) - {-1} for r in rows]
            assert not own[0] & own[1] and own[0] | own[1] == set(index.ravel().tolist()) - {-1}
            for key in ("ids", "mask"):
                assert np.array_equal(np.concatenate([p[key] for p in parts], axis=1), whole[key])
            tokens, _ = data.rows(index)
            assert np.array_equal(tokens, whole["ids"])  # the rows read are the sequences the index names
            seen += [i for i in index.ravel().tolist() if i >= 0]
        assert sorted(seen) == list(range(data.n_sequences))
    # grain's iterator over the steps: its position is the step, set_state moves it there
    it = step_iterator(b, shards[1])
    assert next(it)["step"] == 0 and it.get_state() == {"next_index": 1}
    it.set_state({"next_index": 5})
    item = next(it)
    assert item["step"] == 5 and item["ids"].shape == (2, 2, 16)
    assert np.array_equal(item["ids"], step_batch(b, shards[1], 5)["ids"])
    it.close()


# ----------------------------------------------------------------------------- killed mid-epoch, resumed elsewhere


def _finetune(model, texts, out, mesh) -> list[str]:
    return [sys.executable, "-m", "train.finetune", "--model", str(model), "--texts", str(texts), "--out", str(out),
            "--no-progress", *OVERRIDES, f"train.mesh={mesh}"]


def _wait(procs: dict) -> dict:
    logs = {}
    for name, p in procs.items():
        try:
            out, _ = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            pytest.fail(f"{name} did not finish in {TIMEOUT} s")
        logs[name] = (p.returncode, out)
    return logs


@pytest.fixture(scope="module")
def runs(tiny_llama_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("grain_runs")
    texts = out / "t.jsonl"
    _texts(texts, N_TEXTS)
    popen = dict(env=_env(DEVICES), cwd=HERE.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs = {"full": subprocess.Popen(_finetune(tiny_llama_dir, texts, out / "full", MESH), **popen),
             "killed": subprocess.Popen([sys.executable, str(HELPER), str(tiny_llama_dir), str(texts), str(out / "cut"),
                                         str(KILL_AT), *OVERRIDES, f"train.mesh={MESH}"], **popen)}
    logs = _wait({"killed": procs.pop("killed")})
    assert logs["killed"][0] == -signal.SIGKILL, logs["killed"][1][-3000:]
    cut = out / "cut" / "train"
    logs["after_kill"] = {"checkpoints": sorted(p.name for p in (cut / "checkpoints").iterdir()),
                          "batch_lines": len((cut / "batches.jsonl").read_text().splitlines()),
                          "model": (out / "cut" / "model").exists()}
    procs["resumed"] = subprocess.Popen(_finetune(tiny_llama_dir, texts, out / "cut", OTHER_MESH), **popen)
    logs.update(_wait(procs))
    return out, logs


def test_killed_mid_epoch_resumed_on_another_mesh_trains_the_same_batches(runs):
    out, logs = runs
    rc, log = logs["killed"]
    assert rc == -signal.SIGKILL, log[-3000:]
    for name in ("full", "resumed"):
        assert logs[name][0] == 0, f"{name} failed:\n{logs[name][1][-3000:]}"
    # the kill: after step 5, one step past the checkpoint of step 4 (in the first of the two epochs), no model yet
    after = logs["after_kill"]
    assert "4" in after["checkpoints"] and after["batch_lines"] == KILL_AT and not after["model"]
    full, cut = out / "full" / "train", out / "cut" / "train"
    info = json.loads((out / "cut" / "train.json").read_text())
    assert info["resumed_from"] == 4 and info["steps"] == json.loads((out / "full" / "train.json").read_text())["steps"]
    steps_per_epoch = info["steps"] // 2
    assert steps_per_epoch > KILL_AT  # mid-epoch
    # the same batches in the same order: the recorded sequence indices are identical, every sequence once per epoch
    batches = (full / "batches.jsonl").read_text()
    assert (cut / "batches.jsonl").read_text() == batches
    index = [json.loads(line)["index"] for line in batches.splitlines()]
    assert [json.loads(line)["step"] for line in batches.splitlines()] == list(range(1, info["steps"] + 1))
    n = info["sequences"]
    for e in range(2):
        seen = [i for row in index[e * steps_per_epoch:(e + 1) * steps_per_epoch] for i in row if i >= 0]
        assert sorted(seen) == list(range(n))
    assert index[:steps_per_epoch] != index[steps_per_epoch:]  # a new permutation each epoch
    # equal to the uninterrupted run: per-step losses and gradient norms, then every parameter, within 1e-5
    a = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["tokens"], m["lr"]) for m in a] == [(m["step"], m["tokens"], m["lr"]) for m in b]
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5) and x["grad_norm"] == pytest.approx(y["grad_norm"],
                                                                                                   rel=1e-5)
    pa, pb = (load_file(str(out / run / "model" / "model.safetensors")) for run in ("full", "cut"))
    assert pa.keys() == pb.keys()
    for k in pa:
        np.testing.assert_allclose(pb[k].astype(np.float64), pa[k].astype(np.float64), rtol=1e-5, atol=1e-6)
    assert a[-1]["loss"] < a[0]["loss"]
    # the data position is in the checkpoints: grain's iterator state, the next step to train
    last = max(int(p.name) for p in (cut / "checkpoints").iterdir() if p.name.isdigit())
    assert json.loads((cut / "checkpoints" / str(last) / "data" / "process_0-of-1.json").read_text()) == \
        {"next_index": last}
    assert (cut / "data" / RECORDS).is_file()  # the packed sequences, written once into the run folder


class Killed(Exception):
    pass


def test_checkpoint_without_a_data_position_resumes_at_its_step(tiny_llama_dir, tok, tmp_path):
    """A checkpoint written before the data position was saved (its ``data`` item removed here) resumes from its step,
    the position being a pure function of it: the same batches.jsonl, metrics and parameters as the uninterrupted
    run (in memory, one device)."""
    loaded = models.load(str(tiny_llama_dir))
    data = pack(_texts(tmp_path / "t.jsonl", 12), tok, 32, 0)
    cfg = TrainConfig(seq_len=32, batch_size=4, lr=3e-3, checkpoint_every=2, progress=False, seed=3)
    b = Batches(data, cfg.batch_size, epochs=1, seed=cfg.seed)
    assert b.total_steps >= 5
    full = train(loaded.model, b, cfg, tmp_path / "full", fingerprint(cfg))

    def kill_at_3(step):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        train(loaded.model, b, cfg, tmp_path / "cut", fingerprint(cfg), on_step=kill_at_3)
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "2" / "data")
    resumed = train(loaded.model, b, cfg, tmp_path / "cut", fingerprint(cfg))
    assert resumed.resumed_from == 2 and resumed.metrics == full.metrics
    for name in ("batches.jsonl", "metrics.jsonl"):
        assert (tmp_path / "cut" / name).read_text() == (tmp_path / "full" / name).read_text()
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(full.params)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
