"""``mia-jax generate``: text from prompts with a KV cache (greedy by default); the generation itself:
:mod:`mia_jax.engine.generate`."""
from __future__ import annotations

import argparse
import sys

from mia_jax.runs import entry
from mia_jax.engine import generate
from mia_jax import models
from mia_jax.commands import options

NAME = "generate"
HELP = "generate text from prompts with a KV cache (greedy by default)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``mia-jax generate`` on ``p``."""
    options.model(p, dtype="float32")
    p.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    p.add_argument("--n", type=entry.positive_int, default=20, help="new tokens per prompt (default: 20)")
    p.add_argument("--temperature", type=entry.nonneg_float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=entry.positive_int, help="sample from the k most likely tokens")
    p.add_argument("--top-p", type=entry.fraction, help="sample from the smallest set of tokens with probability >= p")
    p.add_argument("--seed", type=entry.nonneg_int, default=0, help="sampling seed (default: 0)")
    p.add_argument("--no-stop", action="store_true", help="do not stop a prompt at the model's EOS token")


def run(args) -> None:
    """``mia-jax generate`` with the parsed ``args``: print each prompt followed by its completion."""
    loaded = models.load(args.model, dtype=args.dtype, allow_download=args.allow_download)
    gen = generate.generate_ids(loaded, generate.encode_prompts(loaded, args.prompt), max_new_tokens=args.n,
                                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                stop_at_eos=not args.no_stop)
    for i, prompt in enumerate(args.prompt):
        if gen.truncated[i]:
            print(f"mia-jax: prompt {i + 1} was cut to its last {len(gen.prompt_ids[i])} tokens to fit the "
                  f"context of {loaded.max_length}", file=sys.stderr)
        if i:
            print("---")
        print(prompt + loaded.tokenizer.decode(gen.completion_ids(i), skip_special_tokens=True))
