"""Sharded scoring on 8 CPU devices and on 2 processes, each against single-device scores.

JAX fixes its device count when it starts, so the checks run in subprocesses (tests/sharding_check.py)
started with XLA_FLAGS=--xla_force_host_platform_device_count=N; this module only launches them (all at
once, to share the wall-clock) and asserts on what they write.
"""
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SCRIPT = HERE / "sharding_check.py"
TIMEOUT = 300
RTOL = 1e-5


def _env(n_devices):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n_devices}", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE), env.get("PYTHONPATH", "")])
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharding")
    port = str(_free_port())
    procs = {"meshes": subprocess.Popen([sys.executable, str(SCRIPT), "meshes", str(out)], env=_env(8),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)}
    for i in range(2):
        procs[f"process{i}"] = subprocess.Popen([sys.executable, str(SCRIPT), "process", str(i), "2", port, str(out)],
                                                env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                text=True)
    logs = {}
    for name, p in procs.items():
        try:
            logs[name] = p.communicate(timeout=TIMEOUT)[0]
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            pytest.fail(f"{name} did not finish in {TIMEOUT} s")
        logs[name] = (p.returncode, logs[name])
    return out, logs


def _ok(runs, name):
    rc, log = runs[1][name]
    assert rc == 0, f"{name} failed:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def report(runs):
    _ok(runs, "meshes")
    return json.loads((runs[0] / "meshes.json").read_text())


def test_eight_devices(report):
    assert report["devices"] == 8


@pytest.mark.parametrize("case", [
    "llama data=8",  # data parallel
    "llama fsdp=8",  # parameters and batch over fsdp
    "llama data=2,model=4",  # tensor parallel + vocabulary-sharded statistics (2 KV heads: not split over 4)
    "llama data=2,fsdp=2,model=2",
    "gpt_neox model=8",  # 330 vocabulary rows over 8 shards (padded), 4 heads over 8 (replicated)
    "gpt_neox data=2,fsdp=2,model=2",
])
def test_sharded_scores_equal_single_device(report, case):
    r = report["cases"][case]
    assert r["n"] == 13 and r["same_fields"] and r["null_same"]
    assert r["max_rel"] < RTOL, r["max_rel"]


def test_parameters_are_sharded_by_the_rules(report):
    tp = report["cases"]["llama data=2,fsdp=2,model=2"]["actual"]
    assert tp["lm_head"] == "P('model', 'fsdp')" and tp["embed"] == "P('model', 'fsdp')"
    assert tp["layers/wq"] == "P(None, 'fsdp', 'model', None)"
    assert tp["layers/w_down"] == "P(None, 'model', 'fsdp')"
    assert tp["norm"] == "P(None,)"
    # 2 KV heads cannot be split 4 ways: replicated over model instead of failing
    assert report["cases"]["llama data=2,model=4"]["actual"]["layers/wk"] == "P(None, None, None, None)"
    assert report["cases"]["gpt_neox model=8"]["actual"]["lm_head"] == "P(None, None)"  # 330 % 8 != 0


# Per-device shard shapes of the tiny models (Llama: L=2, D=32, F=64, 4 heads, 2 KV heads of 8, 320 rows, untied;
# GPT-NeoX: 330 rows, 4 heads), written out by hand from the partition rules; every other parameter is replicated.
FULL = {"embed": (320, 32), "lm_head": (320, 32), "layers/wq": (2, 32, 4, 8), "layers/wk": (2, 32, 2, 8),
        "layers/wo": (2, 4, 8, 32), "layers/w_gate": (2, 32, 64), "layers/w_down": (2, 64, 32), "norm": (32,),
        "neox/embed": (330, 32), "neox/layers/w_qkv": (2, 32, 4, 3, 8), "neox/layers/w_up": (2, 32, 64)}
SHARDS = {
    "llama data=8": {k: v for k, v in FULL.items() if not k.startswith("neox/")},  # all replicated
    "llama fsdp=8": {"embed": (320, 4), "lm_head": (320, 4), "layers/wq": (2, 4, 4, 8), "layers/wk": (2, 4, 2, 8),
                     "layers/wo": (2, 4, 8, 4), "layers/w_gate": (2, 4, 64), "layers/w_down": (2, 64, 4),
                     "norm": (32,)},
    "llama data=2,model=4": {"embed": (80, 32), "lm_head": (80, 32), "layers/wq": (2, 32, 1, 8),
                             "layers/wk": (2, 32, 2, 8),  # 2 KV heads over model=4: replicated
                             "layers/wo": (2, 1, 8, 32), "layers/w_gate": (2, 32, 16), "layers/w_down": (2, 16, 32),
                             "norm": (32,)},
    "llama data=2,fsdp=2,model=2": {"embed": (160, 16), "lm_head": (160, 16), "layers/wq": (2, 16, 2, 8),
                                    "layers/wk": (2, 16, 1, 8), "layers/wo": (2, 2, 8, 16),
                                    "layers/w_gate": (2, 16, 32), "layers/w_down": (2, 32, 16), "norm": (32,)},
    "gpt_neox model=8": {"neox/embed": (330, 32),  # 330 rows over 8: replicated
                         "neox/layers/w_qkv": (2, 32, 4, 3, 8),  # 4 heads over 8: replicated
                         "neox/layers/w_up": (2, 32, 8)},
    "gpt_neox data=2,fsdp=2,model=2": {"neox/embed": (165, 16), "neox/layers/w_qkv": (2, 16, 2, 3, 8),
                                       "neox/layers/w_up": (2, 16, 32)},
}


@pytest.mark.parametrize("case", list(SHARDS))
def test_parameter_shards_have_the_expected_shape_on_distinct_devices(report, case):
    """The placed arrays themselves (``.sharding`` and ``addressable_shards``), not only their specs: one shard per
    device on 8 distinct devices, every shard of the shape the rules give (a weight over model=2 has shards half
    its size), as many distinct blocks as the array holds shards' worth, and each shard holding its block's values."""
    layout = report["cases"][case]["layout"]
    for key, shard in SHARDS[case].items():
        r = layout[key.removeprefix("neox/")]
        full = FULL[key]
        assert r["shape"] == list(full), (key, r)
        assert r["shard_shapes"] == [list(shard)], (key, r)
        assert r["shards"] == r["devices"] == 8, (key, r)
        assert r["blocks"] == math.prod(full) // math.prod(shard), (key, r)
    for key, r in layout.items():  # every parameter, the unlisted ones included
        assert r["shards"] == r["devices"] == 8 and r["shards_hold_their_blocks"], (key, r)
        assert r["blocks"] * math.prod(r["shard_shapes"][0]) == math.prod(r["shape"]), (key, r)


@pytest.mark.parametrize("mesh,rows_per_device", [("data=8", 3), ("fsdp=8", 3), ("data=2,fsdp=2,model=2", 6)])
def test_scoring_batch_is_split_over_data_and_fsdp(report, mesh, rows_per_device):
    """``score_step.make_stats_fn(loaded, mesh=mesh)`` on a [24, 13] batch from ``sharding.global_batch``: the ids and
    every TokenStats field are split by rows over data x fsdp (24 / (data*fsdp) rows per device, each row block on
    the ``model`` devices of its (data, fsdp) position), the outputs equal the unsharded model's, and the compiled
    per-device program takes only its own rows."""
    b = report["cases"][f"llama {mesh}"]["batch"]
    assert b["batch_shards"] == 24 // rows_per_device
    assert b["ids"]["shape"] == [24, 13] and b["out"]["logprob"]["shape"] == [24, 12]
    for name, r in [("ids", b["ids"]), *b["out"].items()]:
        assert r["spec"] == "P(('data', 'fsdp'), None)", (name, r)
        assert len(r["shard_shapes"]) == 1 and r["shard_shapes"][0][0] == rows_per_device, (name, r)
        assert r["shards"] == r["devices"] == 8 and r["blocks"] == b["batch_shards"], (name, r)
        assert r["shards_hold_their_blocks"], name
    assert b["ids_rows_follow_mesh"] and b["out_rows_follow_mesh"]
    assert max(b["out_max_rel"].values()) < RTOL, b["out_max_rel"]
    assert b["hlo_local_ids"]  # the per-device program's ids are s32[rows_per_device, 13]
    # nothing but the embedding lookup (jnp.take) ever holds the whole batch on one device
    assert all("_take" in op for op in b["hlo_full_batch_ops"]), b["hlo_full_batch_ops"]
    if mesh == "data=8":
        assert b["hlo_full_batch_shapes"] == []


@pytest.mark.parametrize("mesh,rows_per_device", [("data=8", 3), ("fsdp=8", 3), ("data=2,fsdp=2,model=2", 6)])
def test_packed_score_step_is_split_over_data_and_fsdp(report, mesh, rows_per_device):
    """``score_step.make_score_step(loaded, mesh=mesh)`` on a packed [24, 13] step (two texts per row): the per-text
    scores [24, 2] come out split by rows over data x fsdp like the batch, each device holding its own row block,
    and equal the unsharded model's."""
    s = report["cases"][f"llama {mesh}"]["batch"]["score_step"]
    for name, r in s["scores"].items():
        # rows over the batch axes (JAX names only those of size > 1 in an output's spec), never over model
        assert r["shape"] == [24, 2] and "model" not in r["spec"] and r["blocks"] == 24 // rows_per_device, r
        assert r["shard_shapes"] == [[rows_per_device, 2]], (name, r)
        assert r["shards"] == r["devices"] == 8 and r["shards_hold_their_blocks"], (name, r)
    assert s["rows_follow_mesh"]
    assert s["max_abs"] < 1e-4, s["max_abs"]


@pytest.mark.parametrize("mesh", ["fsdp=8", "data=2,fsdp=2,model=2"])
def test_embedding_lookup_holds_only_the_local_rows(report, mesh):
    """With the hidden dimension of the table split over fsdp like the batch, the table is gathered over fsdp before
    the lookup (``sharding.gathered_for_lookup``), so no device holds the whole batch's [B, T, D] (or [B*T, D/fsdp])
    embeddings: on data x fsdp x model XLA replicated them before ("involuntary full rematerialization")."""
    b = report["cases"][f"llama {mesh}"]["batch"]
    assert b["hlo_full_batch_shapes"] == [], b["hlo_full_batch_shapes"]


def test_loading_streams_each_tensor_to_its_sharding(report):
    """models.load(place=sharding.placer(mesh)) on a safetensors folder: every block read from the checkpoint
    is one device's shard (the head and embedding over model x fsdp: a quarter each), nothing else is read,
    and the parameters and scores equal the eager load's."""
    r = report["streamed"]
    assert r["params_equal"] and r["placed_by_rules"] and r["paths_read"]
    assert r["blocks_are_shards"]
    assert r["largest_block_fraction"]["lm_head"] == 0.25 and r["largest_block_fraction"]["embed"] == 0.25
    assert r["largest_block_fraction"]["layers/w_down"] == 0.25 and r["largest_block_fraction"]["norm"] == 1.0
    assert r["max_rel"] < RTOL, r["max_rel"]


def test_vocabulary_sharded_kernel(report):
    """Bias, padded rows (vocab_size < rows) and 1003 rows over 4 shards."""
    assert report["kernel_rank_equal"]
    assert max(report["kernel"].values()) < RTOL, report["kernel"]


def test_two_processes_give_the_single_host_results(runs):
    out, _ = runs
    _ok(runs, "process0")
    _ok(runs, "process1")
    _ok(runs, "meshes")  # writes the single-device reference
    single = [json.loads(line) for line in (out / "single" / "results.jsonl").read_text().splitlines()]
    multi = [json.loads(line) for line in (out / "multi" / "results.jsonl").read_text().splitlines()]
    assert len(multi) == len(single) == 13
    assert not list((out / "multi" / "passes").glob("*.process*"))  # the per-process parts were merged
    for a, b in zip(single, multi):
        assert {k: v for k, v in a.items() if k != "scores"} == {k: v for k, v in b.items() if k != "scores"}
        for m, x in a["scores"].items():
            y = b["scores"][m]
            assert (x is None) == (y is None)
            if x is not None:
                assert abs(x - y) <= RTOL * max(abs(x), 1e-6), (a["index"], m, x, y)


# ----------------------------------------------------------------------------- in this process (no devices needed)


def test_mesh_spec_parsing():
    from mia_jax.errors import UserError
    from mia_jax.engine.sharding import parse_mesh

    assert parse_mesh(None, 8) == {"data": 8, "fsdp": 1, "model": 1}
    assert parse_mesh("model=2", 8) == {"data": 4, "fsdp": 1, "model": 2}
    assert parse_mesh("data=2,fsdp=2,model=2", 8) == {"data": 2, "fsdp": 2, "model": 2}
    assert parse_mesh("data=1,fsdp=-1", 8) == {"data": 1, "fsdp": 8, "model": 1}
    for bad, msg in [("data=3", "has 3 devices"), ("model=3", "not divisible"), ("tensor=2", "unknown axis"),
                     ("data=x", "axis=size"), ("data=0", "positive")]:
        with pytest.raises(UserError, match=msg):
            parse_mesh(bad, 8)


def test_fit_spec_leaves_indivisible_dimensions_unsharded():
    from jax.sharding import PartitionSpec as P

    from mia_jax.engine.sharding import PARTITION_RULES, fit_spec

    class FakeMesh:
        shape = {"data": 2, "fsdp": 2, "model": 4}

    assert fit_spec(P("model", "fsdp"), (320, 32), FakeMesh) == P("model", "fsdp")
    assert fit_spec(P("model", "fsdp"), (330, 32), FakeMesh) == P(None, "fsdp")
    assert fit_spec(P(None, "fsdp", "model", None), (2, 32, 2, 8), FakeMesh) == P(None, "fsdp", None, None)
    assert fit_spec(P(("data", "fsdp")), (8, 5), FakeMesh) == P(("data", "fsdp"), None)
    assert set(PARTITION_RULES) >= {"llama", "gemma3", "gpt_neox", "gpt2", "opt"}


def test_every_architecture_shards_its_large_matrices():
    """Each family's rule table on an abstract tiny model (every case of test_weights.py, which holds one per family
    of checkpoint.ARCHITECTURES): the vocabulary on model, every per-layer weight matrix on both fsdp and model, norms
    replicated."""
    from flax import nnx
    from test_weights import CASES

    from mia_jax.engine.sharding import state_specs

    class FakeMesh:
        shape = {"data": 1, "fsdp": 2, "model": 2}

    configs = list(CASES.values())
    for cls, cfg in configs:
        model = nnx.eval_shape(lambda: cls(cfg))  # shapes only
        specs = state_specs(model, FakeMesh)
        name = type(model).__name__
        assert specs["embed"][0] == "model", name
        for path, spec in specs.items():
            flat = [a for a in spec if a]
            if path.startswith("layers/w"):
                assert "model" in flat and "fsdp" in flat, (name, path, spec)
            if "norm" in path or path.startswith("layers/ln"):
                assert not flat, (name, path, spec)
