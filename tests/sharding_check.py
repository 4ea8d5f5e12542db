"""Helper of test_sharding.py, run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=N set
before JAX starts (the flag cannot be changed once JAX is imported).

    python tests/sharding_check.py meshes OUT_DIR           # 8 devices: every mesh vs one device
    python tests/sharding_check.py process I N PORT OUT_DIR  # process I of N (multi-process on one host)

``meshes`` writes OUT_DIR/meshes.json and OUT_DIR/single/results.jsonl (score_dataset on one device);
``process`` writes OUT_DIR/multi/results.jsonl (the same job on N processes, mesh data=2,model=2).
"""
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
T0 = time.perf_counter()


def tiny_models(tmp):
    """The tiny Llama of tests/helpers.py (untied head, 320 rows, 2 KV heads) and a random GPT-NeoX with an odd
    vocabulary (330 rows: not divisible by the model axis) on the same tokenizer."""
    import jax
    from helpers import write_tiny_llama
    from flax import nnx

    from mia_jax import models
    from mia_jax.models import gpt_neox

    write_tiny_llama(tmp / "llama", tie=False)
    llama = models.load(str(tmp / "llama"))
    cfg = gpt_neox.GPTNeoXConfig(vocab_size=330, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=64)
    neox = gpt_neox.GPTNeoX(cfg, rngs=nnx.Rngs(1))
    for name in ("embed", "lm_head"):  # std 0.02 would give near-uniform predictions
        getattr(neox, name)[...] = getattr(neox, name)[...] * 40
    neox_loaded = dataclasses.replace(llama, model=neox, config=cfg, name="tiny-neox")
    assert len(jax.devices()) >= 1
    return {"llama": llama, "gpt_neox": neox_loaded}


def texts():
    from mia_jax.data import wikimia

    return wikimia(32).texts[:10] + ["x", wikimia(64).texts[0], wikimia(128).texts[0]]  # 13: uneven last batch


METHODS = ["loss", "zlib", "min_k@0.2", "max_k@0.2", "min_k_pp@0.2", "entropy", "rank"]
MESHES = ["data=8", "fsdp=8", "data=2,model=4", "data=2,fsdp=2,model=2", "model=8"]


DATASET_METHODS = METHODS + ["lowercase"]


def meshes(out_dir):
    import jax
    import numpy as np

    import mia_jax.methods  # noqa: F401 (registers the multi-pass methods, e.g. lowercase)
    from mia_jax.engine import runner, sharding
    from mia_jax.stats import token_stats_from_hidden, token_stats_from_hidden_sharded

    report = {"devices": len(jax.devices()), "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        loaded = tiny_models(Path(tmp))
        refs = {}
        for family, lm in loaded.items():
            ref = refs[family] = runner.score_texts(lm, texts(), METHODS, batch_size=5, chunk_size=96, progress=False)
            for spec in MESHES:
                if (family == "gpt_neox") != (
                    spec in ("data=2,fsdp=2,model=2", "model=8")
                ) and spec != "data=2,fsdp=2,model=2":
                    continue  # Llama: every mesh but model=8; GPT-NeoX: model=8 and the 3-axis mesh
                t0 = time.perf_counter()
                mesh = sharding.make_mesh(spec)
                fresh = dataclasses.replace(lm, model=_copy(lm.model))  # shard a copy: the reference stays put
                got = runner.score_texts(fresh, texts(), METHODS, batch_size=5, chunk_size=96, progress=False,
                                         mesh=mesh)
                specs = sharding.state_specs(fresh.model, mesh)
                report["cases"][f"{family} {spec}"] = {
                    "max_rel": _max_rel(ref, got),
                    "same_fields": all({k: v for k, v in a.items() if k != "scores"} ==
                                       {k: v for k, v in b.items() if k != "scores"} for a, b in zip(ref, got)),
                    "null_same": all((a["scores"][m] is None) == (b["scores"][m] is None)
                                     for a, b in zip(ref, got) for m in METHODS),
                    "n": len(got),
                    "param_sharded": {k: str(v) for k, v in specs.items()},
                    "actual": {sharding.path_str(p): str(x.sharding.spec) for p, x in
                               jax.tree_util.tree_flatten_with_path(__import__("flax").nnx.state(fresh.model))[0]},
                    "layout": {sharding.path_str(p): layout(x) for p, x in
                               jax.tree_util.tree_flatten_with_path(__import__("flax").nnx.state(fresh.model))[0]},
                    "batch": batch_layout(fresh, lm, mesh) if f"{family} {spec}" in BATCH_CASES else None,
                    "seconds": time.perf_counter() - t0,
                }
        # the kernel alone: a vocabulary not divisible by the model axis, a bias, padded rows
        rng = np.random.default_rng(0)
        h = rng.standard_normal((8, 5, 16)).astype(np.float32)
        w = rng.standard_normal((1003, 16)).astype(np.float32)
        b = rng.standard_normal(1003).astype(np.float32)
        y = rng.integers(0, 1000, (8, 5))
        y[0] = 999
        want = token_stats_from_hidden(h, w, y, bias=b, vocab_size=1000, chunk_size=128)
        mesh = sharding.make_mesh("data=2,model=4")
        got = jax.jit(lambda h, w, y, b: token_stats_from_hidden_sharded(
            h, w, y, bias=b, mesh=mesh, vocab_size=1000, chunk_size=128))(h, w, y, b)
        report["kernel"] = {f: float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(g, np.float64))
                                            / np.maximum(np.abs(np.asarray(a, np.float64)), 1e-3)))
                            for f, a, g in zip(want._fields, want, got)}
        report["kernel_rank_equal"] = bool(np.array_equal(want.rank, got.rank))
        runner.score_dataset(loaded["llama"], texts(), DATASET_METHODS, out_dir=Path(out_dir) / "single",
                             batch_size=5, chunk_size=96, progress=False)
        report["streamed"] = streamed(Path(tmp) / "llama", loaded["llama"], refs["llama"])
    report["seconds"] = time.perf_counter() - T0
    Path(out_dir, "meshes.json").write_text(json.dumps(report, indent=1))


def layout(x):
    """Where a global array actually lives: its spec, the shapes of its addressable shards, on how many distinct
    devices, how many distinct blocks (index ranges) they hold, and whether each shard holds its block's values."""
    import numpy as np

    shards = x.addressable_shards
    host = np.asarray(x)
    return {
        "spec": str(x.sharding.spec), "shape": list(x.shape), "shards": len(shards),
        "shard_shapes": sorted({tuple(s.data.shape) for s in shards}),
        "devices": len({s.device for s in shards}),
        "blocks": len({tuple((i.start, i.stop) for i in s.index) for s in shards}),
        "shards_hold_their_blocks": all(np.array_equal(np.asarray(s.data), host[s.index]) for s in shards),
    }


_UNSHARDED = {}
BATCH_CASES = ("llama data=8", "llama fsdp=8", "llama data=2,fsdp=2,model=2")  # where the batch's layout is checked
BATCH_ROWS, BATCH_T = 24, 13  # 24 rows: 3 per shard on data=8 / fsdp=8, 6 on data=2,fsdp=2; no weight dim is 24


def batch_layout(lm, ref, mesh):
    """One [24, 13] batch through ``score_step.make_stats_fn(lm, mesh=mesh)``: the layout of the ids
    (``sharding.global_batch``) and of every TokenStats field, which rows each device holds (device at mesh
    position (d, f, m) must hold row block d * fsdp + f), the outputs against the unsharded model's, and the
    per-device compiled program: the shape of its ids and the ops that hold a whole-batch tensor."""
    import re

    import numpy as np
    from flax import nnx

    from mia_jax import batching
    from mia_jax.engine import score_step, sharding

    t0 = time.perf_counter()
    ids = np.random.default_rng(1).integers(0, batching.real_vocab_size(lm), (BATCH_ROWS, BATCH_T)).astype(np.int32)
    g = sharding.global_batch(mesh, ids)
    state = nnx.split(lm.model)[1]
    compiled = score_step.make_stats_fn(lm, chunk_size=96, mesh=mesh).lower(state, g).compile()
    out = compiled(state, g)
    if id(ref) not in _UNSHARDED:  # the unsharded reference: one compilation per model
        _UNSHARDED[id(ref)] = score_step.make_stats_fn(ref, chunk_size=96)(nnx.split(ref.model)[1], ids)
    want = _UNSHARDED[id(ref)]
    n_blocks = sharding.batch_shards(mesh)
    per = BATCH_ROWS // n_blocks
    position = {d: idx for idx, d in np.ndenumerate(mesh.devices)}  # device -> (data, fsdp, model)

    def rows_follow_mesh(x):
        for s in x.addressable_shards:
            d, f, _ = (position[s.device][mesh.axis_names.index(a)] for a in ("data", "fsdp", "model"))
            b = d * mesh.shape["fsdp"] + f
            if (s.index[0].start or 0, s.index[0].stop or x.shape[0]) != (b * per, (b + 1) * per):
                return False
        return True

    report = {
        "batch_shards": n_blocks,
        "ids": layout(g), "ids_rows_follow_mesh": rows_follow_mesh(g),
        "out": {f: layout(x) for f, x in zip(out._fields, out)},
        "out_rows_follow_mesh": all(rows_follow_mesh(x) for x in out),
        "out_max_rel": {f: float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
                                        / np.maximum(np.abs(np.asarray(a, np.float64)), 1e-3)))
                        for f, a, b in zip(out._fields, want, out)},
    }
    if n_blocks > 1:  # the per-device program: local ids, and which ops (if any) still see the whole batch
        hlo = compiled.as_text()
        whole = "|".join([f"{BATCH_ROWS},{BATCH_T}", f"{BATCH_ROWS},{BATCH_T - 1}", str(BATCH_ROWS * BATCH_T),
                          str(BATCH_ROWS * (BATCH_T - 1))])  # [B, T, ...], [B, T-1, ...] or flattened [B*T, ...]
        full = re.compile(rf"\b(\w+)\[((?:{whole})(?:,\d+)*)\]")
        lines = [line for line in hlo.splitlines() if full.search(line)]
        shapes = {(m.group(1), tuple(int(v) for v in m.group(2).split(","))) for line in lines
                  for m in full.finditer(line)}
        local_hidden = per * BATCH_T * lm.config.hidden_size  # one device's [rows / (data*fsdp), T, D] activations
        report["hlo_local_ids"] = f"s32[{per},{BATCH_T}]" in hlo
        report["hlo_full_batch_shapes"] = sorted(f"{t}{list(d)}" for t, d in shapes)
        report["hlo_full_batch_ops"] = sorted({m.group(1) for line in lines
                                               if (m := re.search(r'op_name="([^"]+)"', line))})
        report["hlo_full_batch_largest_float_vs_local_hidden"] = max(
            [int(np.prod(d)) / local_hidden for t, d in shapes if t.startswith(("f", "bf"))], default=0.0)
    report["score_step"] = score_step_layout(lm, ref, mesh, rows_follow_mesh)
    report["seconds"] = time.perf_counter() - t0
    return report


def score_step_layout(lm, ref, mesh, rows_follow_mesh):
    """A packed step (24 rows of 13 slots, two texts each) through ``score_step.make_score_step(lm, mesh=mesh)``:
    the layout of its per-text scores [24, 2] and their difference from the unsharded model's."""
    import numpy as np
    from flax import nnx

    from mia_jax import batching
    from mia_jax.engine import sharding
    from mia_jax.engine.score_step import make_score_step

    rng = np.random.default_rng(2)
    step = batching.Step(BATCH_ROWS, BATCH_T, 2, [[(2 * r, 0, 6), (2 * r + 1, 6, 7)] for r in range(BATCH_ROWS)])
    ids = {i: rng.integers(0, batching.real_vocab_size(lm), 8 if i % 2 else 7).tolist() for i in range(2 * BATCH_ROWS)}
    batch = dict(batching.packed_arrays(step, ids, 0, targets=True), zlib_bytes=np.ones((BATCH_ROWS, 2), np.float32))
    methods = ("loss", "min_k@0.2", "min_k_pp@0.2")
    sharded = {k: sharding.global_batch(mesh, v) for k, v in batch.items()}
    out = make_score_step(lm, methods, chunk_size=96, mesh=mesh)(nnx.split(lm.model)[1], sharded)["scores"]
    want = make_score_step(ref, methods, chunk_size=96)(nnx.split(ref.model)[1], batch)["scores"]
    return {"scores": {m: layout(x) for m, x in out.items()},
            "rows_follow_mesh": all(rows_follow_mesh(x) for x in out.values()),
            "max_abs": max(float(np.max(np.abs(np.asarray(out[m]) - np.asarray(want[m])))) for m in methods)}


def streamed(folder, eager, ref):
    """Load the safetensors folder straight onto a 3-axis mesh (``placer``), recording every host block read:
    parameters equal the eager load's, each block is one device's shard, and scores equal the unsharded ones."""
    import jax
    import numpy as np
    from flax import nnx

    from mia_jax import models
    from mia_jax.engine import runner, sharding

    mesh = sharding.make_mesh("data=2,fsdp=2,model=2")
    blocks = []
    lm = models.load(str(folder), place=sharding.placer(mesh, lambda path, b: blocks.append((path, b.shape))))
    want = {sharding.path_str(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(
        nnx.state(eager.model))[0]}
    got = {sharding.path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(nnx.state(lm.model))[0]}
    specs = sharding.state_specs(lm.model, mesh)
    shard_shapes = {k: x.sharding.shard_shape(x.shape) for k, x in got.items()}
    out = runner.score_texts(lm, texts(), METHODS, batch_size=5, chunk_size=96, progress=False, mesh=mesh)
    return {
        "params_equal": all(np.array_equal(want[k], np.asarray(x)) for k, x in got.items())
        and want.keys() == got.keys(),
        "placed_by_rules": all(x.sharding.spec == specs[k] for k, x in got.items()),
        "blocks_are_shards": all(shape == shard_shapes[path] for path, shape in blocks),
        "paths_read": sorted({path for path, _ in blocks}) == sorted(got),
        "largest_block_fraction": {k: max(int(np.prod(s)) for p, s in blocks if p == k) / got[k].size for k in got},
        "max_rel": _max_rel(ref, out),
    }


def process(index, count, port, out_dir):
    import jax

    jax.distributed.initialize(f"127.0.0.1:{port}", int(count), int(index))
    import mia_jax.methods  # noqa: F401 (registers the multi-pass methods, e.g. lowercase)
    from mia_jax.engine import runner, sharding
    from mia_jax.runs import processes

    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        from helpers import write_tiny_llama

        write_tiny_llama(Path(tmp) / "llama", tie=False)  # the Llama of tiny_models, not loaded whole here
        mesh = sharding.make_mesh("data=2,model=2")
        lm = sharding.load_sharded(str(Path(tmp) / "llama"), mesh)  # each process reads only its own blocks
        runner.score_dataset(lm, texts(), DATASET_METHODS, out_dir=out_dir / "multi", batch_size=3, chunk_size=96,
                             progress=False, mesh=mesh)
        if jax.process_index() == 0:
            Path(out_dir, "process.json").write_text(json.dumps({"seconds": time.perf_counter() - T0}))
        processes.sync("done")


def _copy(model):
    from flax import nnx

    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, state)


def _max_rel(ref, got):
    worst = 0.0
    for a, b in zip(ref, got):
        for m, x in a["scores"].items():
            y = b["scores"][m]
            if x is None or y is None:
                worst = max(worst, 0.0 if x is y else float("inf"))
            else:
                worst = max(worst, abs(x - y) / max(abs(x), 1e-6))
    return worst


if __name__ == "__main__":
    {"meshes": meshes, "process": process}[sys.argv[1]](*sys.argv[2:])
