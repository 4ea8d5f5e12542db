"""The trainer on a device mesh (8 CPU devices) and on 2 processes, each against the single-device run.

JAX fixes its device count when it starts, so the runs are subprocesses (tests/train_sharding_check.py) started with
XLA_FLAGS=--xla_force_host_platform_device_count=N, all at once to share the wall-clock; this module asserts on what
they write. The chunked loss against float64 is tests/test_train_loss.py.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_sharding import _env, _free_port, _ok

HERE = Path(__file__).parent
SCRIPT = HERE / "train_sharding_check.py"
TIMEOUT = 600
RTOL = 1e-5
MESHES = ["data=8", "fsdp=8", "data=2,fsdp=2,model=2"]


def _start(*args, devices=8):
    return subprocess.Popen([sys.executable, str(SCRIPT), *map(str, args)], env=_env(devices),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait(procs: dict, logs: dict):
    for name, p in procs.items():
        try:
            logs[name] = (p.wait(timeout=TIMEOUT), p.stdout.read())
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            pytest.fail(f"{name} did not finish in {TIMEOUT} s")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_sharding")
    port = _free_port()
    procs = {"meshes": _start("meshes", out),
             "uninterrupted": _start("run", "data=8", out / "uninterrupted", out / "uninterrupted.json"),
             "killed": _start("run", "data=8", out / "resumed", out / "killed.json", 3)}
    for i in range(2):
        procs[f"process{i}"] = _start("process", i, 2, port, out, devices=2)
    logs = {}
    _wait({"killed": procs.pop("killed")}, logs)
    # the killed run's folder, resumed on another mesh shape
    procs["resumed"] = _start("run", "fsdp=4,model=2", out / "resumed", out / "resumed.json")
    _wait(procs, logs)
    return out, logs


@pytest.fixture(scope="module")
def report(runs):
    _ok(runs, "meshes")
    return json.loads((runs[0] / "meshes.json").read_text())


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("mesh", MESHES)
def test_three_steps_on_a_mesh_give_the_single_device_parameters(report, family, mesh):
    assert report["devices"] == 8
    assert report["rel"][f"{family} {mesh}"] < RTOL
    assert report["metrics_rel"][f"{family} {mesh}"] < RTOL  # loss and gradient norm of each step


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("mesh", MESHES)
def test_parameters_and_adam_moments_are_sharded_by_the_rules(report, family, mesh):
    """Each parameter and its two AdamW moments, after a step: the spec the partition rules give, over 8 devices,
    and the device's shard really is the fraction of the array the spec says."""
    shardings = report["shardings"][f"{family} {mesh}"]
    params = [p for p in shardings if not p.startswith(("mu/", "nu/"))]
    assert {f"{m}/{p}" for p in params for m in ("mu", "nu")} <= set(shardings)
    sizes = dict(x.split("=") for x in mesh.split(","))
    split = 0
    for path, (spec, expected, shard, full, n_devices) in shardings.items():
        assert spec == expected, path
        assert n_devices == 8, path
        axes = [a for a in ("data", "fsdp", "model") if f"'{a}'" in spec]
        factor = int(np.prod([int(sizes.get(a, 1)) for a in axes]))
        assert np.prod(full) == np.prod(shard) * factor, (path, spec, shard, full)
        split += factor > 1
    if mesh != "data=8":  # fsdp / model really split the big matrices (data only replicates)
        for name in ("embed", "layers/wq", "layers/w_up", "mu/layers/wq", "nu/embed"):
            assert "fsdp" in shardings[name][0], name
        assert split >= len(shardings) // 2
    else:
        assert split == 0


def test_killed_run_resumes_on_another_mesh_with_the_same_result(runs):
    """Killed (SIGKILL) right after step 3 on data=8, with checkpoints every 2 steps; resumed on fsdp=4,model=2: the
    checkpoint of step 2 is restored onto the new mesh (2 steps reused, exactly steps 3..6 run again), and the run
    ends with the parameters and per-step metrics of the uninterrupted data=8 run."""
    out, logs = runs
    assert logs["killed"][0] == -9, logs["killed"][1][-3000:]
    assert not (out / "killed.json").exists()
    _ok(runs, "resumed")
    _ok(runs, "uninterrupted")
    resumed = json.loads((out / "resumed.json").read_text())
    whole = json.loads((out / "uninterrupted.json").read_text())
    assert resumed["resumed_from"] == 2 and whole["resumed_from"] is None
    assert resumed["steps_run"] == [3, 4, 5, 6] and whole["steps_run"] == [1, 2, 3, 4, 5, 6]
    assert [m["step"] for m in resumed["metrics"]] == list(range(1, 7))
    assert resumed["metrics"][:2] == whole["metrics"][:2]  # restored from the checkpoint, as written
    for a, b in zip(resumed["metrics"], whole["metrics"]):
        assert a["tokens"] == b["tokens"]
        for k in ("loss", "grad_norm", "lr"):
            assert abs(a[k] - b[k]) <= RTOL * abs(b[k]), (a, b)
    for k, v in whole["params"].items():
        a, b = np.asarray(resumed["params"][k]), np.asarray(v)
        assert np.max(np.abs(a - b)) <= RTOL * np.max(np.abs(b)), k


def test_two_processes_train_to_the_single_process_result(runs):
    """Two JAX processes (2 CPU devices each) on the mesh fsdp=2,model=2: parameters sharded across the processes,
    each process feeding only its own rows of every batch; the same parameters as one device."""
    out, _ = runs
    _ok(runs, "process0")
    _ok(runs, "process1")
    _ok(runs, "meshes")
    single, multi = np.load(out / "single_llama.npz"), np.load(out / "multi.npz")
    assert set(single.files) == set(multi.files)
    for k in single.files:
        assert np.max(np.abs(multi[k] - single[k])) <= RTOL * np.max(np.abs(single[k])), k


def test_bad_meshes_refused_before_any_step(report):
    """One message each; the work folder (checkpoints of an earlier run) unchanged."""
    refused = report["refused"]
    assert "cannot be split over data x fsdp = 8 devices" in refused["batch"]
    assert "does not divide the 4 attention heads" in refused["heads"]
    assert "GiB per device" in refused["memory"] and "available" in refused["memory"]
    assert all("\n" not in m for m in refused.values())
    assert report["unchanged_after_refusals"]


def test_contaminate_refuses_bad_meshes_with_one_line(tmp_path):
    """`train/contaminate.py --mesh` on 8 devices: a mesh that does not use the devices, or whose batch axes do not
    divide the micro-batch, is refused before anything is written (a folder holding an earlier run is unchanged);
    a model axis that does not divide the heads, or a memory estimate over the budget, before any training step.
    Exit code 2, one line, no traceback."""
    from mia_jax.runs import rundir

    earlier = tmp_path / "earlier"
    with rundir.claim(earlier, {"an": "earlier run"}):
        (earlier / "results.jsonl").write_text('{"index": 0}\n')
    before = {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(earlier.rglob("*")) if p.is_file()}
    config = str(HERE.parent / "configs/contamination/tiny.yaml")
    cases = {"devices": (["--mesh", "fsdp=3"], earlier, {}, "8 devices are not divisible by 3"),
             "batch": (["--mesh", "data=8", "train.batch_size=12", "train.grad_accum=1"], earlier, {},
                       "a micro-batch of 12 sequences"),
             "heads": (["--mesh", "data=1,model=8"], tmp_path / "heads", {}, "does not divide the 4 attention heads"),
             "memory": (["--mesh", "data=8"], tmp_path / "memory", {"MIA_JAX_DEVICE_MEMORY_GIB": "0.0001"},
                        "GiB per device")}
    procs = {name: subprocess.Popen([sys.executable, str(HERE.parent / "train/contaminate.py"), "--config", config,
                                     "--no-progress", "--out", str(out), *args], env={**_env(8), **env},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (args, out, env, _) in cases.items()}
    for name, p in procs.items():
        _, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 2, (name, err[-3000:])
        assert len(err.splitlines()) == 1 and err.startswith("python train/contaminate.py: error: "), err
        assert "Traceback" not in err, err
        assert cases[name][3] in err, (name, err)
        if name in ("heads", "memory"):  # refused before the first step: no checkpoint, no scores
            assert not (cases[name][1] / "train").exists() and not (cases[name][1] / "scores").exists()
    after = {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(earlier.rglob("*")) if p.is_file()}
    assert after == before


def test_paper_config_fits_eight_80gb_accelerators_only_when_sharded():
    """configs/contamination/paper.yaml (LLaMA-7B, 64 x 2048 tokens in 8 micro-batches, mesh fsdp=8, remat=layer):
    the trainer's memory estimate per device is under 80 GiB on its mesh, and over it with the parameters replicated
    (data=8) — the check that refuses a run before its first step."""
    from flax import nnx
    from jax.sharding import AbstractMesh

    from mia_jax.models import Llama, LlamaConfig
    from mia_jax.engine.sharding import AXES, parse_mesh
    from train.config import load_config
    from train.placement import estimate_bytes

    cfg = load_config(str(HERE.parent / "configs/contamination/paper.yaml"), [])
    t = cfg.train
    llama7b = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=2048)
    model = nnx.eval_shape(lambda: Llama(llama7b, dtype=cfg.model.dtype, rngs=nnx.Rngs(0)))

    def gib(mesh, remat=t.remat):
        sizes = parse_mesh(mesh, 8)
        return estimate_bytes(model, AbstractMesh(tuple(sizes[a] for a in AXES), AXES), t.batch_size // t.grad_accum,
                              t.seq_len, remat, t.loss_chunk) / 2**30

    assert t.mesh == "fsdp=8" and t.remat == "layer" and t.seq_len == 2048
    assert 12 < gib(t.mesh) < 80  # 6.7e9 parameters x 22 bytes / 8 = 17 GiB, plus activations
    assert gib("data=8") > 80
    assert gib(t.mesh, "none") > gib(t.mesh)
