"""Text generation with a KV cache, for every architecture in `mia_jax.models`.

Prompts are tokenized with the model's own tokenizer (its default special tokens, as the runner does),
left-padded to one length, prefilled with one `model.decode_last` call (the logits of the last slot only: the
prompt's [B, P, V] logits are never formed), then extended one token at a time by a `jax.lax.while_loop` of
single-token `decode` steps. The whole loop is one jit-compiled function with fixed
shapes: the cache holds prompt + max_new_tokens slots, each row's positions count from its first real token
(arange - n_pad) and its pad slots are masked. Sampling is greedy (temperature 0) or from
softmax(logits / temperature), optionally restricted to the top-k tokens and/or the top-p nucleus. Each row has
its own `jax.random` key (by default ``fold_in(key(seed), row)``, see `row_keys`), folded with the step index at
each step, so a row's tokens depend on its key, prompt and budget, never on the other rows of its batch. A row
stops at EOS or after its token budget (by default max_new_tokens; 0 = a filler row that emits nothing) and then
emits pad; the loop ends when every row has stopped or max_new_tokens were generated.

The example is not run by the doctests (``# doctest: +SKIP``): it loads SmolLM2 from its offline package and
compiles the generation loop, which takes far longer than a doctest should (greedy decoding gives this text).

    >>> from mia_jax import models
    >>> from mia_jax.engine import generate
    >>> loaded = models.load("smollm2")  # doctest: +SKIP
    >>> generate.generate(loaded, ["The capital of France is"], max_new_tokens=20)  # doctest: +SKIP
    [' Paris.\\n\\nThe answer is: 2018-01-22 ']
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from mia_jax.batching import pad_ids
from mia_jax.engine.nucleus import sample_logits
from mia_jax.errors import UserError

PROMPT_MULTIPLE = 8  # padded prompt lengths are rounded up to this (fewer compiled shapes across calls)
NEW_TOKENS_MULTIPLE = 16  # sample_completions' loop length is rounded up to this (fewer compiled shapes)


@dataclasses.dataclass
class Generation:
    """The result of `generate_ids`.

    tokens: int32 [B, max_new_tokens] as emitted (a stopped row's EOS, then pad; pad after a row's budget);
    n_generated [B]: tokens emitted per row (its EOS included; at most its budget); finished [B]: the row stopped
    at EOS; prompt_ids: the prompt tokens the model saw (after truncation); truncated: whether a prompt lost tokens
    to fit the context; logits: float32 [B, max_new_tokens, V], the logits each token was drawn from (only with
    return_logits).
    """

    tokens: np.ndarray
    n_generated: np.ndarray
    finished: np.ndarray
    prompt_ids: list[list[int]]
    truncated: list[bool]
    logits: np.ndarray | None = None

    def completion_ids(self, row: int) -> list[int]:
        """The generated tokens of a row, without its EOS."""
        n = int(self.n_generated[row]) - int(self.finished[row])
        return [int(t) for t in self.tokens[row, :n]]


def row_keys(seed: int, *columns) -> jax.Array:
    """Typed PRNG keys [B], one per row: ``key(seed)`` folded with each column's entry of the row in turn (each
    column: B integers in [0, 2**32)). ``row_keys(seed, range(B))`` is `generate_tokens`' default; a caller that
    wants a row's samples to depend on something else than its position folds that in instead (SaMIA: the text's
    hash, then the sample index)."""
    if not columns:
        raise ValueError("row_keys needs at least one column")
    cols = [jnp.asarray(np.asarray(c, np.int64).astype(np.uint32)) for c in columns]
    if len({c.shape for c in cols}) != 1 or cols[0].ndim != 1:
        raise ValueError(f"row_keys columns must be 1-D and of one length, got shapes {[c.shape for c in cols]}")

    def one(*values):
        key = jax.random.key(seed)
        for v in values:
            key = jax.random.fold_in(key, v)
        return key

    return jax.vmap(one)(*cols)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "greedy", "filters", "return_logits"))
def _generate_loop(graphdef, state, ids, n_pad, keys, limit, temperature, top_k, top_p, eos_token_id, pad_token_id,
                   vocab_limit, prompts=None, *, max_new_tokens: int, greedy: bool, filters: tuple,
                   return_logits: bool):
    """Prefill + while_loop of single-token decode steps. keys [B]: one PRNG key per row (step i draws with
    ``fold_in(keys[row], i)``); limit int32 [B]: a row stops after this many tokens (0: it emits only pad);
    prompts: None, or (first [U], which [B]) when rows repeat a prompt: the prefill runs rows ``first`` only (U
    distinct prompts) and row r starts from the cache and logits of prompt ``which[r]``.
    Traced (no recompilation when they change): the keys, the budgets, the sampling parameters, EOS (-1: none),
    pad and the vocabulary limit; static: the model structure, the number of new tokens (the loop's length),
    greedy vs sampling, which filters (``filters``: top_k given, top_p given), and whether to return the logits.
    -> (tokens int32 [B, N], stopped-at-EOS bool [B], logits float32 [B, N, V] or None)."""
    model = nnx.merge(graphdef, state)
    B, P = ids.shape
    N = max_new_tokens
    key_mask = jnp.arange(P + N)[None, :] >= n_pad[:, None]
    positions = jnp.arange(P)[None, :] - n_pad[:, None]
    if prompts is None:
        last, cache = model.decode_last(ids, model.init_cache(B, P + N), positions, key_mask)
    else:  # one prefill per distinct prompt; every row from its prompt's cache (rows: axis 1) and logits
        first, which = prompts
        last, cache = model.decode_last(ids[first], model.init_cache(first.shape[0], P + N), positions[first],
                                        key_mask[first])
        cache = {"k": cache["k"][:, which], "v": cache["v"][:, which], "index": cache["index"]}
        last = last[which]
    valid = jnp.arange(last.shape[-1]) < vocab_limit  # padded vocabulary rows are never drawn

    def body(carry):
        i, tokens, cache, last, done, finished, seen = carry
        masked = jnp.where(valid, last, -jnp.inf)
        if greedy:
            tok = jnp.argmax(masked, axis=-1).astype(jnp.int32)
        else:
            tok = sample_logits(masked, jax.vmap(jax.random.fold_in, (0, None))(keys, i), temperature=temperature,
                                top_k=top_k if filters[0] else None, top_p=top_p if filters[1] else None)
        tok = jnp.where(done, pad_token_id, tok)
        tokens = tokens.at[:, i].set(tok)
        if return_logits:
            seen = seen.at[:, i].set(last)
        at_eos = ~done & (tok == eos_token_id)
        finished, done = finished | at_eos, done | at_eos | (i + 1 >= limit)
        step_logits, cache = model.decode(tok[:, None], cache, (P + i - n_pad)[:, None], key_mask)
        return i + 1, tokens, cache, step_logits[:, 0], done, finished, seen

    def cond(carry):
        return (carry[0] < N) & ~jnp.all(carry[4])

    tokens = jnp.full((B, N), pad_token_id, jnp.int32)
    seen = jnp.zeros((B, N, last.shape[-1]) if return_logits else (), jnp.float32)
    carry = (jnp.int32(0), tokens, cache, last, limit <= 0, jnp.zeros((B,), bool), seen)
    _, tokens, _, _, _, finished, seen = jax.lax.while_loop(cond, body, carry)
    return tokens, finished, (seen if return_logits else None)


def generate_tokens(model, ids, n_pad, *, max_new_tokens: int = 20, temperature: float = 0.0,
                    top_k: int | None = None, top_p: float | None = None, seed: int = 0, keys=None, budgets=None,
                    eos_token_id: int | None = None, pad_token_id: int = 0, vocab_limit: int | None = None,
                    return_logits: bool = False, prompts=None):
    """The jit-compiled sampling loop on arrays: left-padded ids int [B, P] with n_pad [B] pad tokens per row
    -> (tokens int32 [B, max_new_tokens], stopped-at-EOS bool [B], logits [B, max_new_tokens, V] or None).
    Greedy when temperature is 0 (top_k / top_p then ignored); tokens >= vocab_limit are never drawn.

    keys: typed PRNG keys [B] (or raw uint32 [B, 2]), one per row; default ``row_keys(seed, range(B))`` (seed is
    ignored when keys are given). budgets: int [B], each row's token budget in [0, max_new_tokens] (a row stops at
    EOS or after its budget, then emits pad; 0 = a filler row); default max_new_tokens for every row. prompts:
    (first, which) of `shared_prompts` when rows repeat a prompt (one prefill per prompt), or None."""
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    ids, n_pad = jnp.asarray(ids, jnp.int32), jnp.asarray(n_pad, jnp.int32)
    B = ids.shape[0]
    keys = row_keys(seed, np.arange(B)) if keys is None else _check_keys(keys, B)
    limit = np.full(B, max_new_tokens, np.int32) if budgets is None else _check_budgets(budgets, B, max_new_tokens)
    graphdef, state = nnx.split(model)
    i32 = lambda v: jnp.int32(v)  # noqa: E731
    return _generate_loop(
        graphdef, state, ids, n_pad, keys, jnp.asarray(limit),
        jnp.float32(temperature or 1.0), i32(2**31 - 1 if top_k is None else top_k),
        jnp.float32(2.0 if top_p is None else top_p), i32(-1 if eos_token_id is None else eos_token_id),
        i32(pad_token_id), i32(2**31 - 1 if vocab_limit is None else vocab_limit),
        None if prompts is None else tuple(jnp.asarray(x, jnp.int32) for x in prompts),
        max_new_tokens=max_new_tokens, greedy=temperature == 0,
        filters=(top_k is not None, top_p is not None), return_logits=return_logits)


def _check_keys(keys, B: int) -> jax.Array:
    if not (isinstance(keys, jax.Array) and jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)):
        keys = jax.random.wrap_key_data(jnp.asarray(keys, jnp.uint32))  # raw uint32 [B, 2] (legacy PRNGKey rows)
    if keys.shape != (B,):
        raise ValueError(f"expected one PRNG key per row ({B}), got keys of shape {keys.shape}")
    return keys


def _check_budgets(budgets, B: int, max_new_tokens: int) -> np.ndarray:
    limit = np.asarray(budgets)
    if limit.shape != (B,) or not np.issubdtype(limit.dtype, np.integer):
        raise UserError(f"expected one integer token budget per row ({B}), got {limit.dtype} of shape {limit.shape}")
    if B and (limit.min() < 0 or limit.max() > max_new_tokens):
        raise UserError(f"token budgets must be between 0 and max_new_tokens={max_new_tokens}, got "
                        f"{int(limit.min())}..{int(limit.max())}")
    return limit.astype(np.int32)


def check_sampling(max_new_tokens, temperature, top_k, top_p) -> None:
    """UserError unless max_new_tokens is a positive int, temperature >= 0 and finite, top_k >= 1 (or None) and
    top_p in (0, 1] (or None)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise UserError(f"the number of new tokens must be a positive integer, got {max_new_tokens!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise UserError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise UserError(f"top_k must be at least 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise UserError(f"top_p must be in (0, 1], got {top_p}")


def encode_prompts(loaded, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of each prompt with the model's default special tokens (a BOS when the model adds one).

    An empty or whitespace-only prompt is refused (``prompt 1 is empty: give some text to continue``), whether
    or not the model adds BOS: sampling from nothing but BOS is rarely what was meant, and never silently. So is
    a prompt that encodes to no tokens at all. Prompts are numbered from 1, as `mia-jax generate` lists them."""
    if isinstance(prompts, str):
        raise UserError("prompts must be a list of strings, not one string")
    if not prompts:
        raise UserError("no prompts given")
    for i, prompt in enumerate(prompts, 1):
        if not isinstance(prompt, str):
            raise UserError(f"prompt {i} is {type(prompt).__name__}, expected a string")
        if not prompt.strip():
            raise UserError(f"prompt {i} is {'empty' if not prompt else 'only whitespace'}: give some text to "
                            "continue")
    out = []
    for i, enc in enumerate(loaded.tokenizer.encode_batch(list(prompts)), 1):
        if not enc.ids:
            raise UserError(f"prompt {i} ({_short(prompts[i - 1])}) encodes to no tokens with this model's "
                            "tokenizer: give some other text to continue")
        out.append(list(enc.ids))
    return out


def _short(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n - 3] + "...")


def fit_prompt(ids: list[int], keep: int, bos: int | None) -> list[int]:
    """The last `keep` tokens of a prompt (a leading BOS stays in front): what fits the context before `keep`
    = context - new tokens."""
    if len(ids) <= keep:
        return ids
    if bos is not None and ids[0] == bos and keep > 1:
        return [bos] + ids[len(ids) - keep + 1:]
    return ids[len(ids) - keep:]


def generate_ids(loaded, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int = 20, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int = 0, keys=None, budgets=None,
                 stop_at_eos: bool = True, return_logits: bool = False) -> Generation:
    """Generate from token-id prompts (a `LoadedModel`). keys / budgets: one PRNG key and one token budget per
    prompt, as in `generate_tokens` (default: keys from the seed and the row, max_new_tokens for every prompt).
    A prompt longer than the context minus its budget keeps its last tokens (and a leading BOS)."""
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    B = len(prompt_ids)
    limit = np.full(B, max_new_tokens, np.int32) if budgets is None else _check_budgets(budgets, B, max_new_tokens)
    context = loaded.max_length
    most = int(limit.max()) if B else 0
    if most >= context:
        raise UserError(f"{most} new tokens do not fit the model's context of {context} tokens together with a "
                        "prompt; ask for fewer")
    bos = loaded.bos_token_id if loaded.add_bos else None
    fitted = [fit_prompt([int(t) for t in p], context - int(b), bos) for p, b in zip(prompt_ids, limit)]
    if not fitted or any(not p for p in fitted):
        raise UserError("a prompt has no tokens" if fitted else "no prompts given")
    truncated = [len(f) < len(p) for f, p in zip(fitted, prompt_ids)]
    P = -(-max(len(p) for p in fitted) // PROMPT_MULTIPLE) * PROMPT_MULTIPLE
    pad = loaded.pad_token_id if loaded.pad_token_id is not None else (loaded.eos_token_id or 0)
    ids, _ = pad_ids(fitted, len(fitted), P, pad, side="left")
    n_pad = np.array([P - len(p) for p in fitted], np.int32)
    vocab = loaded.tokenizer.get_vocab_size()
    tokens, finished, logits = generate_tokens(
        loaded.model, ids, n_pad, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
        top_p=top_p, seed=seed, keys=keys, budgets=limit, eos_token_id=loaded.eos_token_id if stop_at_eos else None,
        pad_token_id=pad, vocab_limit=vocab, return_logits=return_logits, prompts=shared_prompts(fitted))
    tokens, finished = np.asarray(tokens), np.asarray(finished)
    n_generated = limit.astype(np.int64)
    for r in np.flatnonzero(finished):
        n_generated[r] = int(np.argmax(tokens[r] == loaded.eos_token_id)) + 1
    return Generation(tokens=tokens, n_generated=n_generated, finished=finished, prompt_ids=fitted,
                      truncated=truncated, logits=None if logits is None else np.asarray(logits))


def shared_prompts(prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray] | None:
    """(first [U], which [B]) when the B prompts hold U < B distinct ones: ``first`` the row of each distinct prompt's
    first occurrence, padded with row 0 to a multiple of PROMPT_MULTIPLE (fewer compiled shapes), ``which[r]`` the
    index into ``first`` of row r's prompt; None when that saves no row (e.g. every prompt distinct).

    >>> first, which = shared_prompts([[5, 6]] * 4 + [[7]] + [[5, 6]] * 5)
    >>> print(first, which)
    [0 4 0 0 0 0 0 0] [0 0 0 0 1 0 0 0 0 0]
    >>> shared_prompts([[5, 6], [5, 6], [7]]) is None  # 8 prefill rows (2, padded) would save none of 3
    True
    """
    index: dict[tuple, int] = {}
    which = np.array([index.setdefault(tuple(p), len(index)) for p in prompts], np.int64)
    first = [int(np.argmax(which == u)) for u in range(len(index))]
    size = -(-len(first) // PROMPT_MULTIPLE) * PROMPT_MULTIPLE
    if size >= len(prompts):
        return None
    return np.array(first + [0] * (size - len(first)), np.int64), which


def generate(loaded, prompts: Sequence[str], *, max_new_tokens: int = 20, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0,
             stop_at_eos: bool = True) -> list[str]:
    """The completion of each prompt (the new text only, EOS and special tokens dropped)."""
    gen = generate_ids(loaded, encode_prompts(loaded, prompts), max_new_tokens=max_new_tokens,
                       temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop_at_eos=stop_at_eos)
    return [loaded.tokenizer.decode(gen.completion_ids(r), skip_special_tokens=True) for r in range(len(prompts))]


def text_hash(text: str) -> int:
    """The 32-bit key component of a text (for `row_keys`): the first 4 bytes of its UTF-8 SHA-256, little-endian."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "little")


def sample_completions(loaded, prompt_ids: Sequence[Sequence[int]], budgets: Sequence[int], key_texts: Sequence[str],
                       *, n_samples: int, temperature: float = 1.0, top_k: int | None = None,
                       top_p: float | None = None, seed: int = 0, batch_size: int = 8, progress: bool = True,
                       desc: str = "sampling") -> tuple[list[list[str]], list[list[int]]]:
    """``n_samples`` completions of each prompt (a `LoadedModel`; ``prompt_ids``: each prompt's token ids), each at
    most its budget of tokens (``budgets``: one per prompt, >= 1), stopping at EOS; greedy when temperature is 0
    (``top_k`` / ``top_p``: the filters of ``sample_logits``).

    Sample j of prompt i is drawn with the key ``row_keys(seed, text_hash(key_texts[i]), j)``, so it depends only on
    (seed, key text, j, prompt, budget), never on the other prompts. Prompts are sorted by (budget, prompt length)
    and ``batch_size`` of them x ``n_samples`` rows share one `generate_ids` loop; the last loop is filled up with
    rows of budget 0 (one compiled batch size) and each loop's length is its largest budget rounded up to
    ``NEW_TOKENS_MULTIPLE``. ``progress``: a tqdm bar named ``desc``, counting prompts.
    Returns (texts, n_tokens): per prompt its samples' decoded text (special tokens skipped) and generated token
    counts (EOS excluded), in sample order."""
    order = sorted(range(len(prompt_ids)), key=lambda i: (budgets[i], len(prompt_ids[i]), i))
    texts: list[list[str]] = [[] for _ in prompt_ids]
    n_tokens: list[list[int]] = [[] for _ in prompt_ids]
    per_call = min(batch_size, len(order)) * n_samples
    bar = tqdm(total=len(order), desc=desc, unit="text", disable=not progress)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        rows = [(i, j) for i in chunk for j in range(n_samples)]
        n_real = len(rows)
        rows += [rows[0]] * (per_call - n_real)  # filler rows (budget 0) keep one compiled batch size
        limit = np.array([budgets[i] for i, _ in rows], np.int32)
        limit[n_real:] = 0
        loop_length = -(-int(limit.max()) // NEW_TOKENS_MULTIPLE) * NEW_TOKENS_MULTIPLE
        keys = row_keys(seed, [text_hash(key_texts[i]) for i, _ in rows], [j for _, j in rows])
        gen = generate_ids(loaded, [prompt_ids[i] for i, _ in rows], max_new_tokens=loop_length,
                           temperature=temperature, top_k=top_k, top_p=top_p, keys=keys, budgets=limit)
        outs = [gen.completion_ids(r) for r in range(n_real)]
        for (i, _), out, text in zip(rows, outs, loaded.tokenizer.decode_batch(outs, skip_special_tokens=True)):
            texts[i].append(text)
            n_tokens[i].append(len(out))
        bar.update(len(chunk))
    bar.close()
    return texts, n_tokens
