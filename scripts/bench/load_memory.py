"""Host memory of loading a model: eager (``models.load``) vs streamed onto a mesh (``sharding.load_sharded``).

    python scripts/bench/load_memory.py --model gemma3-270m --devices 8 --mesh model=8
    python scripts/bench/load_memory.py --synthetic 1024,16,32000 --mesh model=8   # random Llama, safetensors bf16

Each load runs in its own subprocess (with XLA_FLAGS=--xla_force_host_platform_device_count=DEVICES), which
reports its peak RSS (``ru_maxrss``) above the RSS right before loading, the bytes of the loaded
parameters, and the peak of the host memory that Python and NumPy allocated while loading (``tracemalloc``:
checkpoint tensors, converted copies and blocks, GGUF metadata; not the device buffers, not the tokenizer).
On the CPU backend the "devices" live in host memory, so the loaded parameters are part of the RSS; what
loading costs beyond them (the transient: checkpoint copies, converted copies) is the figure of merit:
eager loading used to hold the whole checkpoint and a converted copy at once; streaming holds one block
at a time. For a GGUF model the transient also includes the tokenizer and the GGUF metadata (for
Gemma 3's 262k-token vocabulary, some 450 MiB at their peak); ``--synthetic D,L,V`` writes a random
Llama-shaped safetensors (bfloat16) folder with a two-token tokenizer instead, so the figure is the weights'.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the toolkit of this checkout, installed or not
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_tools beside this file

from bench_tools import bench_main, three_ints  # noqa: E402

from mia_jax.runs import entry  # noqa: E402

PROG = "python scripts/bench/load_memory.py"


synthetic_shape = three_ints("D,L,V", "hidden size, layers, vocabulary", "1024,16,32000", "synthetic_shape")


def child(model: str, mesh: str | None) -> dict:
    import resource
    import tracemalloc

    import jax
    from flax import nnx

    from mia_jax import models
    from mia_jax.engine import sharding

    def rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    before = rss_mib()
    tracemalloc.start()
    if mesh:
        lm = sharding.load_sharded(model, sharding.make_mesh(mesh))
    else:
        lm = models.load(model)
    leaves = jax.tree_util.tree_leaves(nnx.state(lm.model))
    jax.block_until_ready(leaves)
    params = sum(x.nbytes for x in leaves) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    traced = tracemalloc.get_traced_memory()[1] / 2**20
    return {"mesh": mesh or "eager (one device)", "params_mib": params, "rss_before_mib": before,
            "peak_above_before_mib": peak - before, "transient_mib": peak - before - params, "traced_mib": traced}


def write_synthetic(folder, hidden: int, layers: int, vocab: int) -> str:
    """A random Llama (untied head, MLP 4x hidden, 16 heads) in bfloat16 safetensors + a 2-token tokenizer."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer
    from tokenizers import models as tok_models

    rng = np.random.default_rng(0)
    w = lambda *shape: (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)  # noqa: E731
    d, f = hidden, 4 * hidden
    tensors = {"model.embed_tokens.weight": w(vocab, d), "lm_head.weight": w(vocab, d), "model.norm.weight": w(d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update(
            {
                p + n: w(*s)
                for n, s in [
                    ("self_attn.q_proj.weight", (d, d)),
                    ("self_attn.k_proj.weight", (d, d)),
                    ("self_attn.v_proj.weight", (d, d)),
                    ("self_attn.o_proj.weight", (d, d)),
                    ("mlp.gate_proj.weight", (f, d)),
                    ("mlp.up_proj.weight", (f, d)),
                    ("mlp.down_proj.weight", (d, f)),
                    ("input_layernorm.weight", (d,)),
                    ("post_attention_layernorm.weight", (d,)),
                ]
            }
        )
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    Tokenizer(tok_models.WordLevel({"a": 0, "b": 1}, unk_token="a")).save(os.path.join(folder, "tokenizer.json"))
    config = dict(model_type="llama", hidden_size=d, intermediate_size=f, num_hidden_layers=layers,
                  num_attention_heads=16, num_key_value_heads=16, vocab_size=vocab, max_position_embeddings=2048,
                  rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu")
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh)
    return folder


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--devices", type=entry.positive_int, default=8)
    ap.add_argument("--mesh", default="model=8", help="mesh for the streamed load")
    ap.add_argument("--synthetic", metavar="D,L,V", type=synthetic_shape,
                    help="load a random Llama of hidden size D, L layers, V tokens")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    return bench_main(PROG, build_parser, run_child, measure, argv, flag="child")


def run_child(args) -> int:
    """The hidden ``--child MODEL MESH``: one load in this process, its figures printed as JSON."""
    print(json.dumps(child(args.child[0], args.child[1] or None)))
    return 0


def measure(args) -> int:
    """Each load measured in a child process, then the report."""
    if args.synthetic:
        import tempfile

        tmp = tempfile.TemporaryDirectory()
        args.model = write_synthetic(tmp.name, *args.synthetic)
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices}", JAX_PLATFORMS="cpu")
    name = f"synthetic Llama D,L,V={','.join(map(str, args.synthetic))}" if args.synthetic else args.model
    print(f"model {name}, {args.devices} CPU devices")
    print(f"{'load':<22} {'params MiB':>11} {'peak-before MiB':>16} {'transient MiB':>14} {'host peak MiB':>14}")
    for mesh in ("", args.mesh):
        out = subprocess.run([sys.executable, __file__, "--child", args.model, mesh], env=env, check=True,
                             capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"{r['mesh']:<22} {r['params_mib']:>11.0f} {r['peak_above_before_mib']:>16.0f} {r['transient_mib']:>14.0f} "
            f"{r['traced_mib']:>14.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
