"""The Infilling Score's passes (``mia_jax.methods.infilling``) on ``--texts`` MIMIR texts (Wikipedia (en) members,
``--split``, each cut to ``--max-tokens``), three ways in one process, each timed on the same job (k = 0.2, every
future token, the paper's Eq. 6):

  (a)  mia_jax: one forward of each text (its statistics, its top-1 ids and its KV cache), then each changed text
       (one token replaced by the top-1) run from its first changed slot against the cached prefix, in chunks;
  (a') the same with each changed text run whole (a full forward from slot 0), as this project did before;
  (c)  the anchor: transformers + torch (float32, the same checkpoint) running the authors' computation, the
       changed texts batched in chunks of the same token budget (their own loop runs them one at a time).

(a) and (a') run once untimed first (compilation) and then ``--repeats`` times; (c) ``--repeats`` times. The
median and range are printed with the changed texts per second, the CPU model and the JAX / torch versions, the
largest difference between (a)'s scores and (a')'s and (c)'s, and each median over (a)'s.

    python scripts/bench/benchmark_infilling.py [--model smollm2] [--texts 4] [--max-tokens 320] [--repeats 2]
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tools import cpu_model  # noqa: E402

from mia_jax.runs import entry  # noqa: E402

PROG = "python scripts/bench/benchmark_infilling.py"


def _timed(call, repeats: int, warm: bool) -> tuple[list[float], object]:
    out = call() if warm else None
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t)
    return times, out


def whole_program(loaded):
    """The program this project ran for each changed text before: a whole forward (``hidden_states`` from slot 0)
    and the log-probabilities from the vocabulary-chunked kernel, nothing else."""
    import jax
    from flax import nnx

    from mia_jax.batching import real_vocab_size
    from mia_jax.stats import default_chunk, token_stats_from_hidden

    graphdef, vocab, chunk = nnx.split(loaded.model)[0], real_vocab_size(loaded), default_chunk()

    def logprob(state, ids):
        model = nnx.merge(graphdef, state)
        return token_stats_from_hidden(model.hidden_states(ids)[:, :-1], model.unembedding(), ids[:, 1:],
                                       vocab_size=vocab, chunk_size=chunk).logprob

    return jax.jit(logprob)


def full_changed_logprobs(program):
    """(a'): ``infilling._changed_logprobs`` with each changed text run whole by ``program`` (no cached prefix), in
    chunks of about ``TOKENS_PER_BATCH`` tokens, as before."""
    import jax.numpy as jnp
    import numpy as np

    from mia_jax.methods import infilling as inf

    def changed_logprobs(fns, state, ids, top, cache, ends):
        todo, length = list(ends), ids.shape[1]
        size = min(len(todo), max(1, inf.TOKENS_PER_BATCH["cpu"] // length))
        out = {}
        for first in range(0, len(todo), size):
            part = todo[first: first + size]
            batch = np.repeat(ids[[part[0][0]]], size, axis=0)
            for i, (r, t) in enumerate(part):
                batch[i] = ids[r]
                batch[i, t + 1] = top[r, t]
            lp = np.asarray(program(state, jnp.asarray(batch, jnp.int32)), np.float64)
            out.update({key: lp[i] for i, key in enumerate(part)})
        return out

    return changed_logprobs


def torch_scores(model, rows, vocab: int, budget: int, k: float):
    """(c): each text's Infilling Score from transformers + torch float32 log-probabilities (the authors' formula,
    every future token, position t's sigma), the changed texts in chunks of about ``budget`` tokens."""
    import numpy as np
    import torch

    from mia_jax.scorers.min_k import k_count

    def logprobs(batch):
        with torch.inference_mode():
            return torch.log_softmax(model(torch.tensor(batch)).logits[..., :vocab].float(), -1).double().numpy()

    scores, forwards = [], 0
    for ids in rows:
        ids, n = np.asarray(ids), len(ids)
        logp = logprobs([ids.tolist()])[0]
        p = np.exp(logp)
        sigma = np.sqrt((p * logp**2).sum(-1) - (p * logp).sum(-1) ** 2)
        top = logp.argmax(-1)
        todo = [t for t in range(n - 3) if ids[t + 1] != top[t]]  # those with a future token to read
        changed = {}
        size = max(1, budget // n)
        for first in range(0, len(todo), size):
            part = todo[first: first + size]
            batch = [ids.tolist() for _ in part]
            for b, t in zip(batch, part):
                b[t + 1] = int(top[t])
            lp = logprobs(batch)  # [rows, n, V]: kept only at each changed text's own next tokens
            changed.update({t: lp[i, np.arange(n - 1), batch[i][1:]] for i, t in enumerate(part)})
            forwards += len(part)
        ratios = []
        for t in range(n - 1):
            r = logp[t, ids[t + 1]] - logp[t, top[t]]  # 0 where the token is the top-1
            if t in changed:  # changed[t][j]: log p of the changed text's token j + 1 (the top-1 at j = t)
                at = np.arange(t + 1, n - 2)  # the future predictions the authors read: never the text's last token
                r += (logp[at, ids[at + 1]] - changed[t][at]).sum()
            ratios.append(r / sigma[t])
        scores.append(float(np.sort(ratios)[: int(k_count(k, len(ratios)))].mean()))
    return np.array(scores), forwards


def run(args) -> int:
    import jax
    import numpy as np

    from mia_jax import models
    from mia_jax.batching import real_vocab_size
    from mia_jax.data import known
    from mia_jax.methods import infilling as inf

    loaded = models.load(args.model)
    texts = known.mimir("wikipedia_en", args.split).texts[: args.texts]
    rows = [loaded.tokenizer.encode(t).ids[: args.max_tokens] for t in texts]
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width - 1), bool)
    for r, row in enumerate(rows):
        ids[r, : len(row)], mask[r, : len(row) - 1] = row, True
    budget = inf.TOKENS_PER_BATCH["cpu"]
    results = []

    def jax_way(label):
        times, got = _timed(lambda: inf.infilling_scores(loaded, ids, mask, k=0.2), args.repeats, True)
        results.append((label, times, got["infilling"], got["extra_forwards"].sum()))

    original = inf._changed_logprobs
    inf._changed_logprobs = full_changed_logprobs(whole_program(loaded))
    try:
        jax_way("(a') mia_jax, each changed text whole")
    finally:
        inf._changed_logprobs = original
    jax_way("(a) mia_jax, changed texts after the cached prefix")

    import torch

    from benchmark import transformers_model

    model = transformers_model(loaded)
    times, (scores, forwards) = _timed(lambda: torch_scores(model, rows, real_vocab_size(loaded), budget, 0.2),
                                       args.repeats, False)
    results.append(("(c) transformers + torch, changed texts whole", times, scores, forwards))

    new, med = results[1][2], [statistics.median(times) for _, times, _, _ in results]
    print(f"CPU: {cpu_model()}; JAX {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)")
    print(f"{args.model}: {len(rows)} MIMIR wikipedia_en texts ({args.split}), {sum(map(len, rows))} tokens "
          f"(at most {args.max_tokens} each), k = 0.2, every future token\n")
    print("| Approach | median (s) [range] | changed texts | changed texts/s | max abs score difference from (a) |")
    print("|---|---:|---:|---:|---:|")
    for (label, times, scores, forwards), m in zip(results, med):
        diff = float(np.abs(np.asarray(scores) - new).max())
        print(f"| {label} | {m:.2f} [{min(times):.2f}-{max(times):.2f}] | {int(forwards)} | {forwards / m:.1f} "
              f"| {diff:.2e} |")
    print(f"\nmedian time over (a)'s: (a') {med[0] / med[1]:.2f}x, (c) {med[2] / med[1]:.2f}x")
    return 0


def build_parser() -> entry.ArgumentParser:
    p = entry.ArgumentParser(prog=PROG, description="Infilling Score: changed texts after a cached prefix, whole, "
                             "and transformers + torch, on the same MIMIR texts.")
    p.add_argument("--model", default="smollm2", help="a packaged model name, a .gguf file or a model folder")
    p.add_argument("--texts", type=entry.positive_int, default=4, help="MIMIR wikipedia_en member texts (default 4)")
    p.add_argument("--split", default="ngram_7_0.2", help="MIMIR split (default ngram_7_0.2)")
    p.add_argument("--max-tokens", type=entry.positive_int, default=320, help="tokens kept per text (default 320)")
    p.add_argument("--repeats", type=entry.positive_int, default=2, help="timed calls (default 2)")
    return p


def main(argv=None) -> int:
    return entry.run(PROG, lambda a: run(build_parser().parse_args(a)), argv)


if __name__ == "__main__":
    sys.exit(main())
