"""Long-text forward benchmark (issue 14): time and peak memory of one forward pass of the real SmolLM2 over a
long text, the old full attention against the chunked one, beside transformers + torch (SDPA).

    python scripts/bench/benchmark_long.py                                   # 8192 and 128 tokens, every approach
    python scripts/bench/benchmark_long.py --tokens 8192 2048 --approaches auto torch

Approaches, on the same token ids (Pile test-split Wikipedia documents joined until the length is reached):

- ``full``: the toolkit with the full attention forced (``MIA_JAX_ATTENTION=full``: [T, S] float32 scores per
  head, the code before issue 14);
- ``auto``: the toolkit as shipped (the chunked online-softmax attention from T * S >= CHUNKED_MIN_SCORES);
- ``torch``: transformers + torch with ``attn_implementation="sdpa"``, the model built from the same GGUF file
  by ``scripts/bench/benchmark.py``'s ``transformers_model``.

What is timed is the forward to the final-norm hidden states [1, T, D] (the toolkit's scorers compute the
per-token statistics from them in vocabulary chunks; the [T, V] logits would add the same 1.5 GiB to every
approach at 8192 tokens). Each (approach, length) runs in its own subprocess. Peak memory is the process's
peak RSS (VmHWM, reset through /proc/self/clear_refs): "first call" is the peak of the first call (JAX's
compilation included) above the RSS once the model is loaded; "steady" is the peak of the repeated calls after it
above the RSS before them (freed heap memory returned to the OS first, the compiled program resident): the memory
one forward pass needs beside the model. Time is the first
call (with compilation) and the best of ``--repeats`` further calls. The hidden states of every approach are
compared with torch's (max absolute difference over max |h|).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_tools beside this file
from bench_tools import bench_main, runnable, torch_env  # noqa: E402

from mia_jax.runs import entry  # noqa: E402

PROG = "python scripts/bench/benchmark_long.py"

PILE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "pile" / "wikipedia_en.jsonl"
APPROACHES = ["full", "auto", "torch"]


def _status(field: str) -> int:
    """A /proc/self/status memory field in bytes."""
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def reset_peak() -> int:
    """Resets the peak RSS (VmHWM) to the current RSS and returns that RSS."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def release_freed_memory():
    """Returns freed heap memory to the OS (glibc malloc_trim), so that memory the first call (e.g. the XLA
    compilation) freed but the allocator kept does not hide the next calls' own peak."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def token_ids(loaded, n: int, source: Path) -> np.ndarray:
    """[1, n] token ids: documents of `source` (JSONL with a `text` field) joined with blank lines, tokenized by
    the model's tokenizer, the first n kept."""
    texts, ids = [], []
    with open(source) as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if len(texts) % 8 == 0:
                ids = loaded.tokenizer.encode("\n\n".join(texts)).ids
                if len(ids) >= n:
                    break
    ids = loaded.tokenizer.encode("\n\n".join(texts)).ids
    if len(ids) < n:
        from mia_jax.errors import UserError

        raise UserError(f"{source} holds only {len(ids)} tokens, fewer than {n}")
    return np.asarray(ids[:n], np.int32)[None]


def run_worker(args):
    from mia_jax import models

    loaded = models.load(args.model)
    ids = token_ids(loaded, args.worker_tokens, Path(args.source))
    result = {"approach": args.worker, "tokens": int(ids.shape[1]),
              "ids_sha256": hashlib.sha256(ids.tobytes()).hexdigest()}
    if args.worker == "torch":
        import torch

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from benchmark import transformers_model

        model = transformers_model(loaded, attn_implementation="sdpa")
        result["attn_implementation"] = model.config._attn_implementation
        result["torch_threads"] = torch.get_num_threads()
        x = torch.as_tensor(ids, dtype=torch.long)

        def forward():
            with torch.no_grad():
                return model.model(input_ids=x).last_hidden_state[0].float().numpy()
    else:
        import jax
        from flax import nnx

        try:
            from mia_jax.models import attention

            result["implementation"] = attention.implementation_for(ids.shape[1], ids.shape[1])
        except ImportError:  # a checkout from before issue 14 (PYTHONPATH=<old tree>): its only attention
            result["implementation"] = "pre-issue-14"
        result["device"] = str(jax.devices()[0])
        graphdef, state = nnx.split(loaded.model)  # as the runner calls the model
        hidden = jax.jit(lambda state, x: nnx.merge(graphdef, state).hidden_states(x))
        x = jax.numpy.asarray(ids)

        def forward():
            return np.asarray(hidden(state, x)[0], np.float32)

    base = reset_peak()
    t0 = time.perf_counter()
    h = forward()
    result["first_seconds"] = time.perf_counter() - t0
    result["first_peak_bytes"] = _status("VmHWM") - base
    del h
    release_freed_memory()
    result["rss_loaded_bytes"], result["rss_after_first_bytes"] = base, reset_peak()
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        h = forward()
        times.append(time.perf_counter() - t0)
        del h
    result["steady_seconds"], result["steady_all"] = min(times), times
    result["steady_peak_bytes"] = _status("VmHWM") - result["rss_after_first_bytes"]
    h = forward()
    np.save(args.json + ".npy", h)
    Path(args.json).write_text(json.dumps(result))


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=entry.positive_int, nargs="+", default=[8192, 128])
    ap.add_argument("--approaches", nargs="+", default=APPROACHES, choices=APPROACHES)
    ap.add_argument("--repeats", type=entry.positive_int,
                    help="steady-state calls (default: 2 from 4096 tokens, else 10)")
    ap.add_argument("--source", type=entry.input_file, default=str(PILE),
                    help="JSONL of documents with a `text` field")
    ap.add_argument("--json", type=entry.out_file, help="write every figure here")
    ap.add_argument("--omp-wait-policy", default="PASSIVE",
                    help="OMP_WAIT_POLICY for torch (as scripts/bench/benchmark.py)")
    ap.add_argument("--worker", choices=APPROACHES, help=argparse.SUPPRESS)
    ap.add_argument("--worker-tokens", type=entry.positive_int, help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    return bench_main(PROG, build_parser, run_worker, compare, argv)


def compare(args) -> int:
    """Each approach measured in its own worker process, then the report."""
    approaches = runnable(args.approaches, "torch")
    print(f"load average before: {load_average()}", file=sys.stderr)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.tokens:
            hidden = {}
            for name in approaches:
                out = str(Path(tmp, f"{name}-{n}.json"))
                repeats = args.repeats or (2 if n >= 4096 else 10)
                cmd = [sys.executable, __file__, "--worker", name, "--worker-tokens", str(n), "--json", out,
                       "--model", args.model, "--repeats", str(repeats), "--source", str(args.source)]
                env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
                env.pop("MIA_JAX_ATTENTION", None)
                if name == "full":
                    env["MIA_JAX_ATTENTION"] = "full"
                if name == "torch":
                    env = torch_env(env, args.omp_wait_policy)
                print(f"running {name} on {n} tokens ...", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, env=env)
                if proc.returncode:
                    results.append({"approach": name, "tokens": n, "failed": f"exit {proc.returncode}",
                                    "wall_seconds": time.perf_counter() - t0})
                    continue
                r = json.loads(Path(out).read_text())
                hidden[name] = np.load(out + ".npy")
                results.append(r)
            ref = hidden.get("torch")
            for r in results:
                if r["tokens"] == n and r["approach"] in hidden and ref is not None:
                    h = hidden[r["approach"]]
                    r["max_abs_diff_vs_torch"] = float(np.abs(h - ref).max())
                    r["max_abs_hidden"] = float(np.abs(ref).max())
            if len({r.get("ids_sha256") for r in results if r["tokens"] == n and "ids_sha256" in r}) > 1:
                raise RuntimeError("the approaches did not see the same token ids")
    print(f"load average after: {load_average()}", file=sys.stderr)
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1, default=str))
    return 0


def report(results):
    mib = lambda b: f"{b / 2**20:,.0f} MiB"  # noqa: E731
    print("| tokens | approach | attention | first call (with compile) | steady | peak above loaded, first call "
          "| peak of a forward (steady) | x torch (steady peak) | max abs diff vs torch (max abs h) |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    torch_peak = {r["tokens"]: r["steady_peak_bytes"] for r in results if r["approach"] == "torch" and
                  "failed" not in r}
    for r in results:
        if "failed" in r:
            print(f"| {r['tokens']} | {r['approach']} | - | failed ({r['failed']}, after {r['wall_seconds']:.0f} s) "
                  "| | | | | |")
            continue
        attn = r.get("implementation") or f"sdpa ({r.get('attn_implementation')})"
        ratio = (f"{r['steady_peak_bytes'] / torch_peak[r['tokens']]:.2f}"
                 if torch_peak.get(r["tokens"]) else "-")
        diff = (f"{r['max_abs_diff_vs_torch']:.1e} ({r['max_abs_hidden']:.0f})" if "max_abs_diff_vs_torch" in r
                else "-")
        print(f"| {r['tokens']} | {r['approach']} | {attn} | {r['first_seconds']:.2f} s | {r['steady_seconds']:.3f} s "
              f"| {mib(r['first_peak_bytes'])} | {mib(r['steady_peak_bytes'])} | {ratio} | {diff} |")


if __name__ == "__main__":
    sys.exit(main())
