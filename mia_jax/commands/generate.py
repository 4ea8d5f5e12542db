"""``mia-jax generate``: text from prompts with a KV cache (greedy by default); the generation itself:
:mod:`mia_jax.engine.generate`."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import ClassVar

from mia_jax.runs import entry
from mia_jax.engine import generate
from mia_jax import models
from mia_jax.commands import options
from mia_jax.commands.request import CommandRequest, DType

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


@dataclass(frozen=True)
class GenerateRequest(CommandRequest):
    """``mia-jax generate`` as asked: ``n`` new tokens after each of the ``prompt`` s by ``model`` (greedy at
    ``temperature`` 0, else sampled from ``top_k`` / ``top_p`` with ``seed``), stopped at EOS unless ``no_stop``."""
    COMMAND: ClassVar[str] = NAME
    model: str
    dtype: DType
    allow_download: bool
    prompt: tuple[str, ...]
    n: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    no_stop: bool


def run(args: argparse.Namespace) -> None:
    """``mia-jax generate`` with the parsed ``args`` made into its request (:meth:`GenerateRequest.from_args`, the
    only reader of ``args``), then :func:`run_request`."""
    run_request(GenerateRequest.from_args(args))


def run_request(request: GenerateRequest) -> None:
    """``mia-jax generate`` as ``request`` asks: print each prompt followed by its completion."""
    r = request
    loaded = models.load(r.model, dtype=r.dtype, allow_download=r.allow_download)
    gen = generate.generate_ids(loaded, generate.encode_prompts(loaded, r.prompt), max_new_tokens=r.n,
                                temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, seed=r.seed,
                                stop_at_eos=not r.no_stop)
    for i, prompt in enumerate(r.prompt):
        if gen.truncated[i]:
            print(f"mia-jax: prompt {i + 1} was cut to its last {len(gen.prompt_ids[i])} tokens to fit the "
                  f"context of {loaded.max_length}", file=sys.stderr)
        if i:
            print("---")
        print(prompt + loaded.tokenizer.decode(gen.completion_ids(i), skip_special_tokens=True))
