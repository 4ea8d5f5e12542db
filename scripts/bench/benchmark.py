"""Side-by-side scoring benchmark: the toolkit's batched path vs the published per-example approach.

    python scripts/bench/benchmark.py --model smollm2 --length 32 --limit 128
    python scripts/bench/benchmark.py --model gemma3-270m --length 32 --limit 32 --approaches a b

Approaches, on the same model, texts and token ids:

(a) the toolkit: ``runner.score_texts`` (texts packed into rows of a token budget, one jitted step per shape:
    forward, vocabulary-chunked statistics from hidden states, scores on the device);
(b) the published approach re-created in JAX: one text per forward pass (each length its own shape,
    so its own compilation), full float32 logits, full ``log_softmax``, ``probs * log_probs`` for
    Min-K%++, scores in NumPy per text;
(c) the published approach in transformers + torch (when installed): the same per-example loop in
    eager PyTorch, weights loaded from the same GGUF with transformers' ``load_gguf_checkpoint`` (or, for a
    Hugging Face model folder, with ``from_pretrained`` from the same folder), on ``--torch-device``.

Each approach runs in its own subprocess (so peak memory and compilation counts are its own). It
scores the texts twice: the first pass includes compilation (JAX), the second is the steady state.
Compile time and the number of compilations come from JAX's monitoring events (backend compiles).
Peak memory is the process RSS sampled every 5 ms while scoring (above the RSS after loading).
The machine's float32 matmul rate is measured in the same run (XLA: a jitted 2048^3 matmul; NumPy
for comparison), and model FLOP utilisation (MFU) is model FLOPs over time against it: per token
2 x (every per-layer weight matrix) + 2 x V x D for the LM head, plus 4 x n x H x Dh per layer for
attention over a text of n tokens; real tokens only, and not each text's last, which predicts nothing (padding
is not counted as useful work).
With ``--peak-tflops`` (e.g. an accelerator's datasheet peak) MFU is also given against that rate.
``--matmul-precision`` sets the float32 matmul precision of JAX and torch alike (``bench_tools.set_matmul_precision``;
the default leaves each framework's own, which differ on a recent NVIDIA GPU: TF32 for JAX, float32 for torch).
"Batched forward" is the jitted forward pass alone (hidden states and full logits) on the most
common (rows, length) step shape of (a), counted with its padding (what the device executes); its weight
matmuls are also timed alone on the same number of tokens (per-layer matrices, LM head), the rest of
its time being attention, norms, RoPE, activations and residuals.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_tools beside this file
from bench_tools import (Compiles, PeakRSS, add_accelerator_args, bench_main, matmul_rate, runnable,  # noqa: E402
                         set_matmul_precision, timed, torch_env)
from benchmark_report import report  # noqa: E402

from mia_jax.runs import entry  # noqa: E402

PROG = "python scripts/bench/benchmark.py"
METHODS = ["loss", "min_k@0.2", "min_k_pp@0.2"]
K = 0.2


# ----------------------------------------------------------------------------- model facts


def layer_weights(loaded) -> list:
    """The stacked per-layer weight matrices (state paths ``layers/w*``, [L, ...]) of the forward's matmuls."""
    from train.speed import layer_weights as weights

    return weights(loaded.model)


def model_flops(loaded, n_tokens_per_text):
    """Model FLOPs of the forward pass over texts of the given lengths (see the module docstring):
    ``train.speed.forward_flops``, the project's one count."""
    from train.speed import forward_flops

    return forward_flops(loaded.model, n_tokens_per_text)


def reference_scores(lp, mu, var, text_len):
    """Scores (higher = member) from per-token arrays, the way the published code computes them
    (sorted lists), with the toolkit's count max(1, floor(k n)) so that the three approaches are comparable."""
    n = len(lp)
    count = max(1, int(round(K * 10**6)) * n // 10**6)
    z = (lp - mu) / np.sqrt(var)
    return {"loss": float(lp.mean()), "min_k@0.2": float(np.mean(np.sort(lp)[:count])),
            "min_k_pp@0.2": float(np.mean(np.sort(z)[:count]))}


def per_text(encoded, arrays):
    """The published approach's loop: one text at a time, ``arrays(ids)`` -> its per-token (log p, mu, var) in
    float64, scored in NumPy (None for a text of fewer than 2 tokens)."""
    return [None if len(e.ids) < 2 else reference_scores(*arrays(e.ids), len(e.ids)) for e in encoded]


def load_texts(args):
    from mia_jax.data import wikimia

    return wikimia(args.length).texts[: args.limit]


# ----------------------------------------------------------------------------- the approaches (workers)


def worker_a(args, loaded, encoded, texts, result):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from mia_jax import batching
    from mia_jax.engine import runner, score_step

    report: dict = {}
    passes, recs, mem = two_passes(lambda: runner.score_texts(
        loaded, texts, METHODS, tokens_per_batch=args.tokens_per_batch, chunk_size=args.chunk_size, progress=False,
        report=report))
    fn = score_step.make_stats_fn(loaded, args.chunk_size)
    result.update(_passes(passes), peak_rss=mem.peak, rss_after_load=mem.base, programs=report["scoring_programs"],
                  scores=[r["scores"] for r in recs])
    # the forward alone on the most common (rows, length) shape of the packed plan
    shapes = [(s.rows, s.length) for s in batching.pack(batching.scoring_lengths(encoded), args.tokens_per_batch or
                                                        runner.default_tokens_per_batch(), loaded.max_length)]
    rows, t = max(set(shapes), key=shapes.count)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 1000, (rows, t)), jnp.int32)
    graphdef, state = nnx.split(loaded.model)
    forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    for name, f in (("forward", forward), ("fused_stats_step", fn)):
        result[name] = {"shape": [rows, t], "seconds": _best(f, (state, ids), args.repeats),
                        "flops": model_flops(loaded, [t] * rows)}
    result["matmuls_alone"] = matmuls_alone(loaded, rows * t, args.repeats)


def matmuls_alone(loaded, m, repeats):
    """The forward's weight matmuls alone on ``m`` token rows, with the model's own weights: every per-layer weight
    matrix (a ``lax.scan`` over the layers, as in the forward) and the LM head. What the forward would take with
    attention, norms, RoPE, activations and residuals free: {part: {"seconds", "flops"}}."""
    import jax
    import jax.numpy as jnp

    emb = loaded.model.unembedding()
    d = emb.shape[1]
    weights = layer_weights(loaded)
    # [L, D, ...] projects from the hidden size; otherwise the last axis is the output (e.g. [L, H, Dh, D])
    mats = [w.reshape(w.shape[0], d, -1) if w.shape[1] == d else w.reshape(w.shape[0], -1, w.shape[-1])
            for w in weights]
    xs = {k: jnp.ones((m, k), jnp.float32) for k in {w.shape[1] for w in mats}}

    @jax.jit
    def layers(xs, mats):
        def body(acc, ws):
            return acc + sum(jnp.sum(xs[w.shape[0]] @ w) for w in ws), None
        return jax.lax.scan(body, jnp.float32(0), mats)[0]

    head = jax.jit(lambda x, e: x @ e.T)
    return {"layers": {"seconds": _best(layers, (xs, mats), repeats), "flops": 2 * m * sum(w.size for w in mats)},
            "lm_head": {"seconds": _best(head, (xs.get(d, jnp.ones((m, d))), emb), repeats), "flops": 2 * m * emb.size}}


def _best(f, args, repeats):
    """Best of ``repeats`` timed calls of ``f(*args)`` (to completion) after two warm-up calls."""
    import jax

    for _ in range(2):
        jax.block_until_ready(f(*args))
    return min(timed(lambda: jax.block_until_ready(f(*args))) for _ in range(repeats))


def worker_b(args, loaded, encoded, texts, result):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from mia_jax.batching import real_vocab_size

    graphdef, state = nnx.split(loaded.model)
    vocab = real_vocab_size(loaded)

    @jax.jit
    def published(state, ids):  # [1, n]: full logits, full log_softmax, probs * log_probs
        logits = nnx.merge(graphdef, state)(ids)[0, :-1, :vocab].astype(jnp.float32)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        probs = jax.nn.softmax(logits, axis=-1)
        lp = jnp.take_along_axis(log_probs, ids[0, 1:, None], axis=-1)[:, 0]
        mu = (probs * log_probs).sum(-1)
        var = (probs * jnp.square(log_probs)).sum(-1) - jnp.square(mu)
        return lp, mu, var

    def arrays(ids):
        return [np.asarray(x, np.float64) for x in published(state, jnp.asarray([ids], jnp.int32))]

    passes, scores, mem = two_passes(lambda: per_text(encoded, arrays))
    result.update(_passes(passes), peak_rss=mem.peak, rss_after_load=mem.base, programs=published._cache_size(),
                  scores=scores)


def transformers_model(loaded, **config_overrides):
    """The transformers + torch model (eval mode, float32, on the CPU) built from the same checkpoint as `loaded`
    (a LoadedModel): a GGUF file with transformers' ``load_gguf_checkpoint``, a Hugging Face folder with
    ``from_pretrained``; ``config_overrides`` go to the config (e.g. ``attn_implementation``)."""
    import torch
    import transformers

    path = loaded.source
    arch = type(loaded.model).__name__
    cls = {"Llama": transformers.LlamaForCausalLM, "Gemma3": transformers.Gemma3ForCausalLM}.get(arch)
    if cls is None:
        raise SystemExit(f"(c): no transformers class mapped for {arch}")
    import transformers.utils.logging as hf_logging

    hf_logging.disable_progress_bar()
    if Path(path).is_dir():
        return cls.from_pretrained(path, dtype=torch.float32, **config_overrides).eval()
    if not path.endswith(".gguf"):
        raise SystemExit("(c) needs a GGUF file or a Hugging Face folder (the transformers model is built from it)")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, fname = path.rsplit("/", 1)
    config = transformers.AutoConfig.from_pretrained(folder, gguf_file=fname, **config_overrides)
    model = cls(config).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    return model


def torch_arrays(model, loaded, device):
    """The published loop's per-text step in torch: ``arrays(ids)`` -> one forward of the text alone, full float32
    log-softmax over the real vocabulary, its (log p, mu, var) per predicted token as float64 NumPy."""
    import torch

    from mia_jax.batching import real_vocab_size

    vocab = real_vocab_size(loaded)
    F = torch.nn.functional

    @torch.no_grad()
    def arrays(ids):
        ids = torch.tensor([ids], device=device)
        logits = model(ids).logits[0, :-1, :vocab].float()
        log_probs = F.log_softmax(logits, dim=-1)
        probs = F.softmax(logits, dim=-1)
        lp = log_probs.gather(-1, ids[0, 1:, None])[:, 0]
        mu = (probs * log_probs).sum(-1)
        var = (probs * torch.square(log_probs)).sum(-1) - torch.square(mu)
        return lp.double().cpu().numpy(), mu.double().cpu().numpy(), var.double().cpu().numpy()

    return arrays


def worker_c(args, loaded, encoded, texts, result):
    import torch

    device = torch.device(args.torch_device)
    t0 = time.perf_counter()
    model = transformers_model(loaded).to(device)
    result["torch_load_seconds"] = time.perf_counter() - t0
    result["torch_threads"] = torch.get_num_threads()
    arrays = torch_arrays(model, loaded, device)
    passes, scores, mem = two_passes(lambda: per_text(encoded, arrays), count_compiles=False)
    result.update(_passes(passes), peak_rss=mem.peak, rss_after_load=mem.base, programs=0, scores=scores)


def two_passes(score_all, count_compiles=True):
    """Run ``score_all()`` twice under the peak-memory sampler: ([(seconds, compilations, compile seconds)] per
    pass, the last pass's result, the PeakRSS)."""
    compiles = Compiles() if count_compiles else contextlib.nullcontext()
    passes, out = [], None
    with PeakRSS() as mem:
        for _ in range(2):
            with compiles:
                t0 = time.perf_counter()
                out = score_all()
                seconds = time.perf_counter() - t0
            passes.append((seconds, compiles.count, compiles.seconds) if count_compiles else (seconds, 0, 0.0))
    return passes, out, mem


def _passes(passes):
    (first, n1, c1), (steady, n2, c2) = passes
    return {"first_pass": first, "steady": steady, "compiles_first": n1, "compile_seconds_first": c1,
            "compiles_steady": n2}


def run_worker(args):
    import jax

    from mia_jax import batching, models

    set_matmul_precision(args.matmul_precision, torch=args.worker == "c")
    t0 = time.perf_counter()
    loaded = models.load(args.model)
    load_seconds = time.perf_counter() - t0
    texts = load_texts(args)
    encoded = batching.encode(loaded, texts)
    result = {"approach": args.worker, "load_seconds": load_seconds, "device": str(jax.devices()[0]),
              "n_texts": len(texts), "n_tokens": sum(len(e.ids) for e in encoded)}
    if args.worker == "matmul":
        result["matmul_gflops"] = matmul_rate()
    else:
        {"a": worker_a, "b": worker_b, "c": worker_c}[args.worker](args, loaded, encoded, texts, result)
        result["model_flops"] = model_flops(loaded, batching.scoring_lengths(encoded))
    Path(args.json).write_text(json.dumps(result))


# ----------------------------------------------------------------------------- the driver


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--length", type=entry.positive_int, default=32, help="WikiMIA length: 32, 64, 128 or 256")
    ap.add_argument("--limit", type=entry.positive_int, help="first N texts only")
    ap.add_argument("--tokens-per-batch", type=entry.positive_int,
                    help="(a)'s token budget per step (default: the backend's)")
    ap.add_argument("--chunk-size", type=entry.positive_int, default=8192)
    ap.add_argument("--repeats", type=entry.positive_int, default=3)
    ap.add_argument("--approaches", nargs="+", default=["a", "b", "c"], choices=["a", "b", "c"])
    ap.add_argument("--json", type=entry.out_file, help="write every figure here (default: print only)")
    ap.add_argument("--omp-wait-policy", default="PASSIVE",
                    help="OMP_WAIT_POLICY for (c)'s torch (default PASSIVE: on a machine shared with other jobs, "
                         "OpenMP's spinning threads make small torch matmuls over 10x slower; 'default' keeps "
                         "torch's own setting)")
    add_accelerator_args(ap, "(c)")
    ap.add_argument("--worker", choices=["a", "b", "c", "matmul"], help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    return bench_main(PROG, build_parser, run_worker, compare, argv)


def compare(args) -> int:
    """Each approach measured in its own worker process, then the report."""
    approaches = runnable(args.approaches, "c")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["matmul", *approaches]:
            out = Path(tmp, f"{name}.json")
            cmd = [sys.executable, __file__, "--worker", name, "--json", str(out), "--model", args.model,
                   "--length", str(args.length), "--chunk-size", str(args.chunk_size), "--repeats", str(args.repeats),
                   "--torch-device", args.torch_device, "--matmul-precision", args.matmul_precision]
            if args.limit:
                cmd += ["--limit", str(args.limit)]
            if args.tokens_per_batch:
                cmd += ["--tokens-per-batch", str(args.tokens_per_batch)]
            print(f"running {name} ...", file=sys.stderr, flush=True)
            env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
            if name == "c":
                env = torch_env(env, args.omp_wait_policy, args.torch_device)
            subprocess.run(cmd, check=True, env=env)
            results[name] = json.loads(out.read_text())
    report(args, results, METHODS)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
