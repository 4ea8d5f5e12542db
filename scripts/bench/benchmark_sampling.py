"""Nucleus sampling (the n-gram coverage attack's and SaMIA's pass): ``--prompts`` WikiMIA-32 prefixes (each text's
first half of words), ``--samples`` continuations each of exactly ``--new-tokens`` tokens (no stop at EOS), at
temperature 1 and top-p 0.95, in one batch, three ways in one process, each timed on the same job:

  (a)  mia_jax (``generate.generate_ids``: prefill + a jit-compiled while_loop of KV-cached decode steps, the top-p
       threshold found without sorting the vocabulary and first among each row's largest logits,
       ``nucleus.sample_logits``);
  (a') the same loop with the sampler this project used before it: the threshold searched over each whole row
       and the token drawn over the whole row (not first among the row's ``nucleus.CANDIDATES`` largest logits);
  (c)  the anchor: transformers + torch ``model.generate(do_sample=True, top_p=0.95, top_k=0)`` on the same model
       (float32, built from the same GGUF), the same prompts left-padded, the same number of new tokens.

Each is run ``--repeats`` times after one untimed call (its compilation, for JAX); the median and the range are
printed, with the new tokens per second, the CPU model and the JAX / torch versions. Samples are not compared (each
way draws with other random numbers; that (a) draws from the same law as (a') is tested in
``tests/test_generate.py``).

    python scripts/bench/benchmark_sampling.py [--model smollm2] [--prompts 8] [--samples 20] [--new-tokens 32]
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tools import cpu_model  # noqa: E402

from mia_jax.runs import entry  # noqa: E402

PROG = "python scripts/bench/benchmark_sampling.py"


def whole_row_sample_logits(logits, keys, *, temperature=1.0, top_k=None, top_p=None):
    """``nucleus.sample_logits`` as it was before it looked at the candidates first (for (a') only): the filters'
    threshold searched over each whole row and the token drawn over the whole row (``nucleus.draw_whole_rows``)."""
    import jax.numpy as jnp

    from mia_jax.engine import nucleus

    return nucleus.draw_whole_rows(logits.astype(jnp.float32) / temperature, keys, top_k, top_p)


def _timed(call, repeats: int) -> tuple[float, list[float], object]:
    t = time.perf_counter()
    out = call()
    first = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t)
    return first, times, out


def run(args) -> int:
    import jax

    from mia_jax import models
    from mia_jax.data import wikimia
    from mia_jax.engine import generate as G
    from mia_jax.methods.samia import split_prefix

    loaded = models.load(args.model)
    prompts = [split_prefix(t, 0.5)[0] for t in wikimia(32).texts[: args.prompts]]
    ids = [p for p in G.encode_prompts(loaded, prompts) for _ in range(args.samples)]
    keys = G.row_keys(0, range(len(ids)))
    kw = dict(max_new_tokens=args.new_tokens, temperature=1.0, top_p=0.95, keys=keys, stop_at_eos=False)
    n_new = len(ids) * args.new_tokens
    rows = []

    def jax_way(label):
        first, times, _ = _timed(lambda: G.generate_ids(loaded, ids, **kw), args.repeats)
        rows.append((label, first, times))

    original = G.sample_logits
    G.sample_logits = whole_row_sample_logits
    try:
        jax_way("(a') mia_jax, whole-row filter and draw")
    finally:
        G.sample_logits = original
    jax.clear_caches()
    jax_way("(a) mia_jax")

    import torch

    from benchmark import transformers_model

    torch.manual_seed(0)
    model = transformers_model(loaded)
    width = max(len(p) for p in ids)
    pad = loaded.pad_token_id if loaded.pad_token_id is not None else (loaded.eos_token_id or 0)
    input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    hf = dict(do_sample=True, top_p=0.95, top_k=0, temperature=1.0, max_new_tokens=args.new_tokens,
              min_new_tokens=args.new_tokens, pad_token_id=pad)
    with torch.inference_mode():
        first, times, _ = _timed(lambda: model.generate(input_ids=input_ids, attention_mask=mask, **hf), args.repeats)
    rows.append(("(c) transformers + torch", first, times))

    print(f"CPU: {cpu_model()}; JAX {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)")
    print(f"{args.model}: {args.prompts} prompts x {args.samples} samples = {len(ids)} rows, {args.new_tokens} new "
          f"tokens each, top-p 0.95\n")
    print("| Approach | first call (s) | median of the next (s) [range] | new tokens/s |")
    print("|---|---:|---:|---:|")
    for label, first, times in rows:
        med = statistics.median(times)
        print(f"| {label} | {first:.2f} | {med:.2f} [{min(times):.2f}-{max(times):.2f}] | {n_new / med:.0f} |")
    return 0


def build_parser() -> entry.ArgumentParser:
    p = entry.ArgumentParser(prog=PROG, description="Nucleus sampling: mia_jax with and without its candidates, "
                             "and transformers + torch generate, on the same prompts.")
    p.add_argument("--model", default="smollm2", help="a packaged model name, a .gguf file or a model folder")
    p.add_argument("--prompts", type=entry.positive_int, default=8, help="WikiMIA-32 prefixes (default 8)")
    p.add_argument("--samples", type=entry.positive_int, default=20, help="continuations per prompt (default 20)")
    p.add_argument("--new-tokens", type=entry.positive_int, default=32, help="tokens per continuation (default 32)")
    p.add_argument("--repeats", type=entry.positive_int, default=3, help="timed calls after the first (default 3)")
    return p


def main(argv=None) -> int:
    return entry.run(PROG, lambda a: run(build_parser().parse_args(a)), argv)


if __name__ == "__main__":
    sys.exit(main())
