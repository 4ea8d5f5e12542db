"""Helper of test_train_sharding.py, run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=N
set before JAX starts.

    python tests/train_sharding_check.py meshes OUT_DIR            # 8 devices: 3 steps on each mesh vs one device
    python tests/train_sharding_check.py run MESH WORKDIR OUT_JSON [KILL_AT]  # 8 devices: one training run
    python tests/train_sharding_check.py process I N PORT OUT_DIR  # process I of N processes (2 devices each)

``meshes`` writes OUT_DIR/meshes.json (max relative parameter difference per family and mesh, the sharding of
every parameter and AdamW moment, the refusals of bad meshes) and OUT_DIR/single_llama.npz (the one-device
parameters the two-process run is compared with). ``run`` trains the tiny Llama for STEPS steps on MESH in WORKDIR
(resuming from its checkpoints) and writes the final parameters and metrics to OUT_JSON; with KILL_AT it SIGKILLs
itself right after that step (a real kill: no cleanup, no final checkpoint). ``process`` trains the tiny Llama on
the N processes' mesh fsdp=2,model=2 and writes OUT_DIR/multi.npz from process 0.
"""
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS = 6  # `run`: checkpoints every 2 steps
MESHES = ["data=8", "fsdp=8", "data=2,fsdp=2,model=2"]


def tiny_llama():
    from flax import nnx

    from mia_jax.models import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=328, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    return perturbed(Llama(cfg, rngs=nnx.Rngs(0)), 0)


def tiny_gemma3():
    from flax import nnx

    from mia_jax.models import Gemma3, Gemma3Config

    cfg = Gemma3Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                       query_pre_attn_scalar=24, max_position_embeddings=128,
                       layer_types=("sliding_attention", "full_attention"))
    return perturbed(Gemma3(cfg, rngs=nnx.Rngs(1)), 1)


def perturbed(model, seed):
    """Every parameter plus N(0, 0.1^2) noise: no parameter starts at exactly 0 (Gemma's norm offsets do), as in a
    pretrained model, so relative differences are measured against values of a realistic size."""
    import jax
    import numpy as np
    from flax import nnx

    rng = np.random.default_rng(seed)
    state = nnx.state(model)
    nnx.update(model, jax.tree.map(lambda x: x + rng.normal(0, 0.1, x.shape).astype(x.dtype), state))
    return model


def batches(vocab: int, steps: int):
    """Random packed sequences: 16 per step in 2 micro-batches of 8, 24 tokens, the last one half padding."""
    import numpy as np

    from train.data import Batches, PackedData

    rng = np.random.default_rng(0)
    n = 16 * steps
    tokens = rng.integers(1, vocab - 8, (n, 24)).astype(np.int32)  # the 8 padded vocabulary rows never occur
    mask = np.ones_like(tokens, bool)
    mask[-1, 12:] = False
    return Batches(PackedData(tokens, mask, int(mask.sum()), 0), batch_size=16, grad_accum=2, shuffle=True, seed=3)


def config(**kw):
    from train.config import TrainConfig

    return TrainConfig(**{"lr": 1e-4, "weight_decay": 0.1, "checkpoint_every": 2, "progress": False, **kw})


def flat(params):
    import jax
    import numpy as np

    from mia_jax.engine.sharding import path_str

    return {path_str(p): np.asarray(x, np.float64) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def rel(a: dict, b: dict) -> float:
    import numpy as np

    return max(float(np.max(np.abs(a[k] - b[k])) / max(np.max(np.abs(b[k])), 1e-12)) for k in a)


def metrics_rel(a: list[dict], b: list[dict]) -> float:
    """Largest relative difference of the per-step loss and gradient norm (steps and token counts must be equal)."""
    assert [(m["step"], m["tokens"]) for m in a] == [(m["step"], m["tokens"]) for m in b], (a, b)
    return max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a, b) for k in ("loss", "grad_norm"))


def shardings(model, mesh):
    """For the state after one step on ``mesh``: {path: [spec of the parameter, expected spec, its shard shape,
    full shape]} for parameters and AdamW moments (``mu/...``, ``nu/...``)."""
    import jax
    import numpy as np

    from mia_jax.engine import sharding
    from train import placement
    from train.trainer import make_train_step, optimizer

    cfg = config()
    opt = optimizer(cfg, 3)
    params_target, opt_target = placement.state_targets(model, opt, mesh)
    params = placement.place_params(model, placement.shardings_of(params_target))
    opt_state = jax.jit(opt.init, out_shardings=placement.shardings_of(opt_target))(params)
    b = batches(model.config.vocab_size, 1)
    ids, mask = b.batch(0)
    shape = ids.shape
    step = make_train_step(model, opt, mesh=mesh)
    params, opt_state, _ = step(params, opt_state, placement.global_batch(mesh, ids, shape),
                                placement.global_batch(mesh, mask, shape))
    arch = sharding.architecture_of(model)
    out = {}
    for p, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        path = sharding.path_str(p)
        out[path] = [str(x.sharding.spec), str(sharding.spec_for(arch, path, x.shape, mesh)),
                     list(x.addressable_shards[0].data.shape), list(x.shape), len(x.sharding.device_set)]
    for p, x in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        path = sharding.path_str(p)
        if "/mu/" in path or "/nu/" in path:
            key = "mu/" if "/mu/" in path else "nu/"
            param = path.split("/mu/" if key == "mu/" else "/nu/")[1]
            out[key + param] = [str(x.sharding.spec), str(sharding.spec_for(arch, param, x.shape, mesh)),
                                list(x.addressable_shards[0].data.shape), list(x.shape), len(x.sharding.device_set)]
    assert np.isfinite(float(jax.device_get(params["norm"]).sum()))
    return out


def meshes(out_dir):
    import jax
    import numpy as np

    from mia_jax.engine import sharding
    from mia_jax.errors import UserError
    from train.trainer import train

    out_dir = Path(out_dir)
    report = {"devices": len(jax.devices()), "rel": {}, "metrics_rel": {}, "shardings": {}, "refused": {}}
    for family, make in (("llama", tiny_llama), ("gemma3", tiny_gemma3)):
        model = make()
        b = batches(model.config.vocab_size, 3)
        with tempfile.TemporaryDirectory() as tmp:
            one = train(model, b, config(), Path(tmp) / "one", {"t": 1},
                        mesh=sharding.make_mesh("data=1", jax.devices()[:1]))
            single = flat(one.params)
            if family == "llama":
                np.savez(out_dir / "single_llama.npz", **single)
            for spec in MESHES:
                res = train(model, b, config(), Path(tmp) / spec, {"t": 1}, mesh=sharding.make_mesh(spec))
                report["rel"][f"{family} {spec}"] = rel(flat(res.params), single)
                report["metrics_rel"][f"{family} {spec}"] = metrics_rel(res.metrics, one.metrics)
                report["shardings"][f"{family} {spec}"] = shardings(model, sharding.make_mesh(spec))
    # refusals: before any step, nothing in the work folder changed
    model = tiny_llama()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        train(model, batches(328, 1), config(), work, {"t": 1}, mesh=sharding.make_mesh("data=8"))
        before = {str(p): p.read_bytes() for p in sorted(work.rglob("*")) if p.is_file()}
        cases = {"batch": (batches(328, 1), config(), "data=8"),  # micro-batch 8 ok, then 12 rows: below
                 "heads": (batches(328, 1), config(), "data=1,model=8"),
                 "memory": (batches(328, 1), config(seq_len=24), "data=8")}
        cases["batch"][0].batch_size, cases["batch"][0].grad_accum = 12, 1
        for name, (bb, cfg, spec) in cases.items():
            if name == "memory":
                os.environ["MIA_JAX_DEVICE_MEMORY_GIB"] = "0.001"
            try:
                train(model, bb, cfg, work, {"t": 1}, mesh=sharding.make_mesh(spec))
                report["refused"][name] = None
            except UserError as e:
                report["refused"][name] = str(e)
            os.environ.pop("MIA_JAX_DEVICE_MEMORY_GIB", None)
        after = {str(p): p.read_bytes() for p in sorted(work.rglob("*")) if p.is_file()}
        report["unchanged_after_refusals"] = before == after and len(before) > 0
    (out_dir / "meshes.json").write_text(json.dumps(report, indent=1))


def run(spec, workdir, out_json, kill_at=None):
    from mia_jax.engine import sharding
    from train.trainer import train

    ran = []

    def on_step(step):
        ran.append(step)
        if kill_at is not None and step == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)

    model = tiny_llama()
    res = train(model, batches(328, STEPS), config(), Path(workdir), {"t": 1}, on_step=on_step,
                mesh=sharding.make_mesh(spec))
    Path(out_json).write_text(json.dumps({"params": {k: v.tolist() for k, v in flat(res.params).items()},
                                          "metrics": res.metrics, "resumed_from": res.resumed_from,
                                          "steps_run": ran, "mesh": spec}))


def process(i, n, port, out_dir):
    os.environ.update({"MIA_JAX_DISTRIBUTED": "1", "MIA_JAX_COORDINATOR": f"127.0.0.1:{port}",
                       "MIA_JAX_NUM_PROCESSES": str(n), "MIA_JAX_PROCESS_ID": str(i)})
    from mia_jax.runs import processes

    assert processes.initialize_distributed()
    import jax
    import numpy as np

    from train.trainer import train

    assert jax.process_count() == int(n) and len(jax.devices()) == 2 * int(n)
    from mia_jax.engine import sharding

    mesh = sharding.make_mesh("fsdp=2,model=2")
    res = train(tiny_llama(), batches(328, 3), config(), Path(out_dir) / "multi_work", {"t": 1}, mesh=mesh)
    if jax.process_index() == 0:
        np.savez(Path(out_dir) / "multi.npz", **flat(res.params))


if __name__ == "__main__":
    {"meshes": meshes, "run": run, "process": process}[sys.argv[1]](*sys.argv[2:])
