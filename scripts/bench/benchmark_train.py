"""Training-step benchmark: the project's train step (JAX) vs a plain PyTorch AdamW loop, same model and batches.

    python scripts/bench/benchmark_train.py --model smollm2 --steps 4
    python scripts/bench/benchmark_train.py --model smollm2 --steps 2 --approaches jax

Both approaches train the float32 model loaded from the same GGUF file on the same batches of real Pile text
(``mia_jax/data/files/pile_sample.jsonl`` packed into ``--seq-len``-token sequences by ``train.data.pack``; step s takes
``train.data.Batches(..., shuffle=False).batch(s)``): ``--batch-size`` sequences per step in ``--grad-accum``
micro-batches, the mean next-token loss over the step's real tokens, gradient clipping at global norm 1.0, AdamW
(lr 1e-4, betas 0.9 / 0.999, eps 1e-8, weight decay 0.01 on every parameter: torch's defaults).

- jax: ``train.trainer.make_train_step`` (the trainer's jitted step: chunked loss, chunked attention, gradient
  accumulation by ``lax.scan``, parameters and optimizer state donated), with ``--remat`` (default ``layer``: each
  decoder layer recomputed in the backward pass, which on this CPU was faster than keeping the activations, and
  smaller) and ``--loss-chunk``.
- torch: ``transformers.LlamaForCausalLM`` (or Gemma3ForCausalLM) built from the GGUF as in
  ``scripts/bench/benchmark.py``, eager, ``torch.optim.AdamW``, ``clip_grad_norm_``; the loss from full logits
  (``F.cross_entropy``), as a plain training loop computes it.

Each approach (and the matmul-rate measurement) runs in its own subprocess, so peak memory is its own: the
process's peak RSS sampled every 5 ms from before the model is loaded to the end of the timed steps. One warm-up
step (compilation for JAX) is followed by ``--steps`` timed steps (each to completion). Tokens/s counts every
token of the step's sequences (batch x seq_len). Training FLOPs per step = 3 x the forward's model FLOPs
(``train.speed.train_flops``: 2 x every weight matrix incl. the LM head per token, plus 4 n^2 x layers x attention
width per sequence of n tokens), i.e. 6 x parameters x tokens plus attention; MFU is those FLOPs per second over
the float32 XLA matmul rate measured in the same run (a jitted 2048^3 matmul), and with ``--peak-tflops`` also
against that rate (e.g. an accelerator's datasheet peak).

On an accelerator: ``--torch-device cuda`` puts the torch loop there (JAX uses its default device);
``--matmul-precision`` sets both frameworks' float32 matmul precision (``bench_tools.set_matmul_precision``; by
default each keeps its own, which differ on a recent NVIDIA GPU); ``--compute-dtype bfloat16`` trains with
bfloat16 compute and float32 master weights in both (JAX: the trainer's ``compute_dtype``; torch: ``torch.autocast``).
"Device peak" is the framework allocator's peak on the device (JAX ``memory_stats()["peak_bytes_in_use"]``, torch
``max_memory_allocated``), from loading to the end of the timed steps.

The JAX profile: separately jitted pieces of the step on one micro-batch (forward only; forward + backward;
the layers' forward alone; the loss's forward + backward alone from fixed hidden states), the optimizer update
(clipping + AdamW + apply) alone, and the host input (building a step's batch in NumPy and putting it on the
device). The last printed line is one JSON object ``{"jax": {"tokens_per_s", "peak_rss_mib", ...}, "torch":
{...}}`` holding the approaches that ran.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_tools beside this file
from bench_tools import (PeakRSS, add_accelerator_args, bench_main, matmul_rate, runnable,  # noqa: E402
                         set_matmul_precision, timed, torch_env, torch_sync)

from mia_jax.runs import entry  # noqa: E402

PROG = "python scripts/bench/benchmark_train.py"

LR, CLIP, WEIGHT_DECAY = 1e-4, 1.0, 0.01


def worker_data(args, result):
    """The steps' batches (train.data.Batches over the packed Pile sample, unshuffled) -> --data (.npz), the model's
    facts -> result; the approaches read the batches from there (the torch process never loads the JAX model)."""
    from mia_jax import models
    from train.sources import read_background
    from train.data import Batches, pack, separator_id

    loaded = models.load(args.model)
    docs, _ = read_background(["bundled:pile_sample.jsonl"], None)
    data = pack(docs, loaded.tokenizer, args.seq_len, separator_id(loaded.tokenizer, loaded.eos_token_id))
    b = Batches(data, args.batch_size, args.grad_accum, shuffle=False)
    if b.steps_per_epoch < args.steps + 1:
        from mia_jax.errors import UserError

        raise UserError(f"the Pile sample packs into {data.n_sequences} sequences: too few for {args.steps + 1} "
                        f"steps of {args.batch_size}")
    steps = [b.batch(s) for s in range(args.steps + 1)]
    np.savez(args.data, ids=np.stack([x[0] for x in steps]), mask=np.stack([x[1] for x in steps]))
    result.update(source=loaded.source, arch=type(loaded.model).__name__, flops=step_flops(loaded, args),
                  host_batch_s=min(timed(lambda: b.batch(1)) for _ in range(5)))


def load_batches(args):
    with np.load(args.data) as f:
        return f["ids"], f["mask"]


def step_flops(loaded, args) -> float:
    from train.speed import train_flops

    return float(train_flops(loaded.model, [args.seq_len] * args.batch_size))


def _best(f, repeats):
    import jax

    jax.block_until_ready(f())
    return min(timed(lambda: jax.block_until_ready(f())) for _ in range(repeats))


def worker_jax(args, result):
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from mia_jax import models
    from train.trainer import make_train_step

    try:
        from train.step import training_attention
    except ImportError:  # a checkout from before the chunked loss (the 'before' figures in BENCHMARKS.md)
        training_attention = lambda: None  # noqa: E731

    with PeakRSS() as mem:
        loaded = models.load(args.model)
        all_ids, all_mask = load_batches(args)
        model = loaded.model
        opt = optax.chain(optax.clip_by_global_norm(CLIP), optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8,
                                                                         weight_decay=WEIGHT_DECAY))
        params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), nnx.to_pure_dict(nnx.state(model)))
        opt_state = opt.init(params)
        result["rss_loaded"] = mem.rss()
        step = make_train_step(model, opt, args.compute_dtype, remat=args.remat, loss_chunk=args.loss_chunk)
        t0 = time.perf_counter()
        ids, mask = all_ids[0], all_mask[0]
        params, opt_state, metrics = step(params, opt_state, ids, mask)
        jax.block_until_ready(params)
        result["warmup_s"] = time.perf_counter() - t0
        times, losses = [], [float(metrics["loss"])]
        for s in range(1, args.steps + 1):
            t0 = time.perf_counter()
            ids, mask = all_ids[s], all_mask[s]
            params, opt_state, metrics = step(params, opt_state, ids, mask)
            jax.block_until_ready(params)
            times.append(time.perf_counter() - t0)
            losses.append(float(metrics["loss"]))
    result.update(step_s=times, losses=losses, peak_rss=mem.peak,
                  attention=training_attention() or os.environ.get("MIA_JAX_ATTENTION", "auto"),
                  device_peak=(jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use"))
    if args.no_profile:
        return
    from train.loss import chunked_cross_entropy
    from train.step import make_loss

    # ---- the profile: pieces of the step, each jitted alone, on one micro-batch
    nll_sum = make_loss(model, args.compute_dtype, remat=args.remat, loss_chunk=args.loss_chunk)
    mids, mmask = jnp.asarray(ids[0]), jnp.asarray(mask[0])
    graphdef, abstract = nnx.split(model)
    fwd = jax.jit(nll_sum)
    fwd_bwd = jax.jit(jax.value_and_grad(nll_sum, has_aux=True))

    def module(p):
        state = jax.tree.map(lambda a: a, abstract)
        nnx.replace_by_pure_dict(state, p)
        return nnx.merge(graphdef, state)

    layers = jax.jit(lambda p, x: module(p).hidden_states(x[:, :-1], attention=training_attention()))
    hidden = layers(params, mids)
    emb = jax.jit(lambda p: module(p).unembedding())(params)  # the model's own arrays were donated to the step
    loss_fb = jax.jit(jax.value_and_grad(lambda h, w: chunked_cross_entropy(
        h, w, mids[:, 1:], mmask[:, 1:], chunk_size=args.loss_chunk), argnums=(0, 1), has_aux=True))
    update = jax.jit(lambda g, o, p: optax.apply_updates(p, opt.update(g, o, p)[0]))
    r = args.repeats
    prof = {
        "forward": _best(lambda: fwd(params, mids, mmask), r),
        "forward_backward": _best(lambda: fwd_bwd(params, mids, mmask), r),
        "layers_forward": _best(lambda: layers(params, mids), r),
        "loss_forward_backward": _best(lambda: loss_fb(hidden, emb), r),
        "optimizer_update": _best(lambda: update(params, opt_state, params), r),
        "device_put": min(timed(lambda: jax.block_until_ready(jax.device_put((all_ids[1], all_mask[1]))))
                          for _ in range(r)),
    }
    result["profile"] = prof
    result["micro_batches"] = args.grad_accum


def worker_torch(args, result):
    import torch
    from benchmark import transformers_model

    F = torch.nn.functional
    device = torch.device(args.torch_device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.compute_dtype == "bfloat16")
    with PeakRSS() as mem:
        facts = json.loads(Path(args.facts).read_text())
        all_ids, all_mask = load_batches(args)
        model = transformers_model(SimpleNamespace(source=facts["source"], model=type(facts["arch"], (), {})()))
        model = model.float().train().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WEIGHT_DECAY)
        result["rss_loaded"] = mem.rss()

        def one_step(s):
            ids = torch.from_numpy(all_ids[s].astype(np.int64)).to(device)
            mask = torch.from_numpy(all_mask[s]).to(device)
            n = int(mask[:, :, 1:].sum())
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for a in range(ids.shape[0]):
                targets = torch.where(mask[a, :, 1:], ids[a, :, 1:], -100)
                with autocast:  # a no-op in float32; in bfloat16 autocast computes the cross-entropy in float32
                    logits = model(input_ids=ids[a]).logits[:, :-1]
                    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                           ignore_index=-100, reduction="sum") / n
                loss.backward()
                total += float(loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            torch_sync(device)
            return total

        t0 = time.perf_counter()
        losses = [one_step(0)]
        result["warmup_s"] = time.perf_counter() - t0
        times = []
        for s in range(1, args.steps + 1):
            t0 = time.perf_counter()
            losses.append(one_step(s))
            times.append(time.perf_counter() - t0)
    result.update(step_s=times, losses=losses, peak_rss=mem.peak, torch_threads=torch.get_num_threads(),
                  attention=model.config._attn_implementation,
                  device_peak=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None)


def run_worker(args):
    import jax

    set_matmul_precision(args.matmul_precision, torch=args.worker == "torch")
    result = {"approach": args.worker, "device": str(jax.devices()[0])}
    if args.worker == "matmul":
        result["matmul_gflops"] = matmul_rate()
    else:
        {"data": worker_data, "jax": worker_jax, "torch": worker_torch}[args.worker](args, result)
    Path(args.json).write_text(json.dumps(result))


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--steps", type=entry.positive_int, default=4, help="timed steps after one warm-up step")
    ap.add_argument("--approaches", nargs="+", default=["jax", "torch"], choices=["jax", "torch"])
    ap.add_argument("--batch-size", type=entry.positive_int, default=8)
    ap.add_argument("--grad-accum", type=entry.positive_int, default=2)
    ap.add_argument("--seq-len", type=entry.positive_int, default=512)
    ap.add_argument("--remat", default="layer", choices=["none", "layer"],
                    help="train.remat of the JAX step (default layer: on CPU both faster and smaller than none)")
    ap.add_argument("--loss-chunk", type=entry.positive_int, default=8192)
    ap.add_argument("--repeats", type=entry.positive_int, default=2, help="repeats of each profiled piece (best taken)")
    ap.add_argument("--no-profile", action="store_true", help="skip the JAX per-phase profile")
    ap.add_argument("--omp-wait-policy", default="PASSIVE",
                    help="OMP_WAIT_POLICY for torch (as scripts/bench/benchmark.py; 'default' keeps torch's own)")
    add_accelerator_args(ap, "the torch loop")
    ap.add_argument("--compute-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="compute dtype of both approaches (master weights and optimizer state stay float32)")
    ap.add_argument("--json", type=entry.out_file, help="also write every figure here")
    ap.add_argument("--worker", choices=["data", "jax", "torch", "matmul"], help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--facts", help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    return bench_main(PROG, build_parser, run_worker, compare, argv)


def compare(args) -> int:
    """Each approach measured in its own worker process, then the report."""
    approaches = runnable(args.approaches, "torch")
    results = {}
    passed = ["--model", args.model, "--steps", str(args.steps), "--batch-size", str(args.batch_size),
              "--grad-accum", str(args.grad_accum), "--seq-len", str(args.seq_len), "--remat", args.remat,
              "--loss-chunk", str(args.loss_chunk), "--repeats", str(args.repeats), "--torch-device", args.torch_device,
              "--matmul-precision", args.matmul_precision, "--compute-dtype", args.compute_dtype]
    passed += ["--no-profile"] if args.no_profile else []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["data", "matmul", *approaches]:
            out = Path(tmp, f"{name}.json")
            print(f"running {name} ...", file=sys.stderr, flush=True)
            env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
            if name == "torch":
                env = torch_env(env, args.omp_wait_policy, args.torch_device)
            subprocess.run([sys.executable, __file__, "--worker", name, "--json", str(out), "--data",
                            str(Path(tmp, "batches.npz")), "--facts", str(Path(tmp, "data.json")), *passed],
                           check=True, env=env)
            results[name] = json.loads(out.read_text())
    summary = report(args, results)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1, default=str))
    print(json.dumps(summary))
    return 0


def report(args, results) -> dict:
    rate = results["matmul"]["matmul_gflops"]["xla"]
    tokens = args.batch_size * args.seq_len
    print(f"\nmodel {args.model}: {args.batch_size} x {args.seq_len} tokens per step in {args.grad_accum} "
          f"micro-batches of Pile text, compute {args.compute_dtype} (float32 master weights), matmul precision "
          f"{args.matmul_precision}, AdamW lr {LR}, clipping {CLIP}; "
          f"{args.steps} timed steps after one warm-up; "
          f"device {results['matmul']['device']}")
    print(f"float32 matmul 2048^3 measured in this run: XLA {rate:.0f} GFLOP/s, "
          f"NumPy {results['matmul']['matmul_gflops']['numpy']:.0f} GFLOP/s; load average {os.getloadavg()[0]:.2f}")
    if "torch" in results:
        print(f"torch: on {args.torch_device}, {results['torch']['torch_threads']} threads, "
              f"OMP_WAIT_POLICY={args.omp_wait_policy}, "
              f"attention {results['torch']['attention']}")
    if "jax" in results:
        print(f"jax: remat {args.remat}, loss chunk {args.loss_chunk}, attention {results['jax']['attention']}")
    peak = f" MFU (vs {args.peak_tflops:g} TFLOP/s) |" if args.peak_tflops else ""
    print(f"\n| approach | warm-up step | step (mean of timed) | tokens/s | x torch | MFU (vs XLA matmul) |{peak} "
          "peak RSS (after load) | device peak | loss (first -> last) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if peak else ""))
    summary = {}
    for k in ("jax", "torch"):
        if k not in results:
            continue
        r = results[k]
        step = float(np.mean(r["step_s"]))
        summary[k] = {"tokens_per_s": tokens / step, "peak_rss_mib": r["peak_rss"] / 2**20, "step_s": step,
                      "mfu": results["data"]["flops"] / step / (rate * 1e9)}
        if args.peak_tflops:
            summary[k]["mfu_peak"] = results["data"]["flops"] / step / (args.peak_tflops * 1e12)
    for k, s in summary.items():
        r = results[k]
        ratio = f"{s['tokens_per_s'] / summary['torch']['tokens_per_s']:.2f}" if "torch" in summary else "-"
        vs_peak = f" {100 * s['mfu_peak']:.1f}% |" if peak else ""
        dev = f"{r['device_peak'] / 2**20:.0f} MiB" if r.get("device_peak") else "-"
        print(f"| {k} | {r['warmup_s']:.1f} s | {s['step_s']:.2f} s | {s['tokens_per_s']:.0f} | {ratio} | "
              f"{100 * s['mfu']:.0f}% |{vs_peak} {s['peak_rss_mib']:.0f} MiB "
              f"({r['rss_loaded'] / 2**20:.0f}) | {dev} | {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f} |")
    if "jax" in results and "profile" in results["jax"]:
        p, a = results["jax"]["profile"], results["jax"]["micro_batches"]
        step = summary["jax"]["step_s"]
        parts = {"forward (x micro-batches)": a * p["forward"],
                 "backward (x micro-batches)": a * (p["forward_backward"] - p["forward"]),
                 "optimizer update": p["optimizer_update"], "host input (batch + device_put)":
                 results["data"]["host_batch_s"] + p["device_put"]}
        parts["rest (accumulation, scan, overlap)"] = step - sum(parts.values())
        print("\nJAX step profile (separately jitted pieces, best of repeats, scaled to the step):")
        print("| phase | seconds | share of the step |")
        print("|---|---:|---:|")
        for name, sec in parts.items():
            print(f"| {name} | {sec:.2f} | {100 * sec / step:.0f}% |")
        print(f"of one micro-batch's forward {p['forward']:.2f} s: decoder layers {p['layers_forward']:.2f} s; "
              f"the chunked loss's forward + backward alone: {p['loss_forward_backward']:.2f} s")
    return summary


if __name__ == "__main__":
    sys.exit(main())
