"""The unlearning audit's probes (steps 3-4 of :mod:`mia_jax.audits.unlearning`): story completion of the flagged
chunks (a prompt of their first words, completions sampled from both models with paired draws, compared with the
true continuation by ROUGE-L F and, optionally, by sentence-embedding similarity) and the QA probes (each question's
Min-K% NLL under both models, a greedy answer from each, its ROUGE-L recall of the gold answer)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from mia_jax.engine import generate
from mia_jax.audits.common import WORD, finite_or_none, score_texts

PROMPT_WORDS = 200
N_SAMPLES = 20
MAX_NEW_TOKENS = 128  # default cap of a completion (its budget: the true continuation's token count)
QA_MAX_NEW_TOKENS = 32
QA_TEMPLATE = "Question: {question}\nAnswer:"


def split_prompt(text: str, prompt_words: int) -> tuple[str, str]:
    """(prompt, continuation) of ``text``: its first ``prompt_words`` words (verbatim) and the rest (verbatim,
    stripped)."""
    spans = [m.span() for m in WORD.finditer(text)]
    if len(spans) <= prompt_words:
        return text.strip(), ""
    return text[spans[0][0]:spans[prompt_words - 1][1]], text[spans[prompt_words][0]:].strip()


_ROUGE = None


def rouge_l(candidates: Sequence[str], reference: str, measure: str = "fmeasure") -> np.ndarray:
    """float64 [len(candidates)]: rouge-score's ROUGE-L (``measure``: ``fmeasure``, ``recall`` or ``precision``) of
    each of ``candidates`` against ``reference`` (default tokenizer: lowercase alphanumeric words; no stemming); 0
    for an empty one."""
    global _ROUGE
    if _ROUGE is None:
        from rouge_score import rouge_scorer  # loaded when a probe is compared, not when the command starts

        _ROUGE = rouge_scorer.RougeScorer(["rougeL"])
    return np.array([getattr(_ROUGE.score(reference, c)["rougeL"], measure) for c in candidates], np.float64)


# ----------------------------------------------------------------------------- sampling (mia_jax.engine.generate)

def continuation_ids(loaded, prompts: Sequence[str], continuations: Sequence[str]) -> list[list[int]]:
    """Each continuation's tokens in context after its prompt (``encode(prompt + " " + continuation)`` after the
    prompt's own tokens, as SaMIA counts a reference)."""
    whole = loaded.tokenizer.encode_batch([p + " " + c for p, c in zip(prompts, continuations)])
    alone = loaded.tokenizer.encode_batch(list(prompts))
    return [w.ids[len(a.ids):] for w, a in zip(whole, alone)]


def cut_reference(loaded, prompt: str, continuation: str, cap: int) -> str:
    """The continuation's first ``cap`` tokens in context (whole words; at least one word), or all of it."""
    ids = continuation_ids(loaded, [prompt], [continuation])[0]
    words = continuation.split()
    if len(ids) <= cap:
        return " ".join(words)
    head = loaded.tokenizer.decode(ids[:cap], skip_special_tokens=True).split()
    n = len(head)
    if n and n <= len(words) and head[-1] != words[n - 1]:  # the cut fell inside a word
        n -= 1
    return " ".join(words[:max(n, 1)])


def sample(loaded, prompts: Sequence[str], budgets: Sequence[int], *, n_samples: int = N_SAMPLES,
           temperature: float = 1.0, top_k: int | None = None, seed: int = 0, batch_size: int = 8,
           progress: bool = True, desc: str = "sampling") -> list[list[str]]:
    """``n_samples`` completions of each prompt (at most its budget of tokens, stopping at EOS), as SaMIA draws them:
    ``batch_size`` prompts x ``n_samples`` rows per ``generate.generate_ids`` loop, sample j of a prompt drawn with
    the key ``row_keys(seed, text_hash(prompt), j)`` (the same draws under any model; greedy when temperature 0;
    ``generate.sample_completions``). ``budgets``: each prompt's token budget; ``progress`` / ``desc``: a tqdm bar.
    Returns per prompt its ``n_samples`` completions."""
    prompt_ids = generate.encode_prompts(loaded, list(prompts)) if prompts else []
    return generate.sample_completions(loaded, prompt_ids, budgets, prompts, n_samples=n_samples,
                                       temperature=temperature, top_k=top_k, seed=seed, batch_size=batch_size,
                                       progress=progress, desc=desc)[0]


# ----------------------------------------------------------------------------- the probes

def story_completion(texts: Sequence[str], ratios, flags, models: dict, embedder, cfg: dict, *, batch_size: int,
                     progress: bool) -> tuple[list[dict], dict]:
    """Probe the flagged chunks (``texts``: every chunk's, ``ratios`` / ``flags``: their Min-K% ratios and flags;
    ratio closest to 1 first, at most ``cfg["max_probe"]``, with a continuation after ``cfg["prompt_words"]``):
    ``cfg["n_samples"]`` completions from each of ``models`` ({side: LoadedModel}, "original" first; sampling as
    ``cfg`` says), their ROUGE-L F against the reference and, with ``embedder`` (a ``SentenceEncoder``), their
    embedding similarity. Returns (probes, counts): per probe its chunk, prompt, reference, ``samples`` and the
    per-sample ``rougeL_per_sample`` (and ``embed_per_sample``) values, {side: [n_samples]} (``probe_summary`` adds
    the max and mean); counts ``flagged_without_continuation`` and ``probed``."""
    log_r = np.abs(np.log(np.where(flags, ratios, np.nan)))
    flagged = [int(i) for i in np.argsort(log_r, kind="stable") if flags[i]]
    splits = {i: split_prompt(texts[i], cfg["prompt_words"]) for i in flagged}
    with_cont = [i for i in flagged if splits[i][1]]
    todo = with_cont[:cfg["max_probe"]]
    counts = {"flagged_without_continuation": len(flagged) - len(with_cont), "probed": len(todo)}
    if not todo:
        return [], counts
    prompts = [splits[i][0] for i in todo]
    cap_o = min(cfg["max_new_tokens"] or MAX_NEW_TOKENS, models["original"].max_length // 2)
    refs = [cut_reference(models["original"], p, splits[i][1], cap_o) for p, i in zip(prompts, todo)]
    samples = {}
    for side, m in models.items():
        cap = max(1, min(cfg["max_new_tokens"] or MAX_NEW_TOKENS, m.max_length // 2))
        budgets = [max(1, min(cap, len(ids))) for ids in continuation_ids(m, prompts, refs)]
        samples[side] = sample(m, prompts, budgets, n_samples=cfg["n_samples"], temperature=cfg["temperature"],
                               top_k=cfg["top_k"], seed=cfg["seed"], batch_size=batch_size, progress=progress,
                               desc=f"completions ({side})")
    probes = [{"chunk": i, "prompt": prompt, "reference": ref,
               "samples": {side: samples[side][r] for side in models},
               "rougeL_per_sample": {side: rouge_l(samples[side][r], ref).tolist() for side in models}}
              for r, (i, prompt, ref) in enumerate(zip(todo, prompts, refs))]
    if embedder is not None:
        _embed_similarity(probes, refs, samples, embedder, cfg["n_samples"], batch_size, progress)
    return probes, counts


def _embed_similarity(probes: list[dict], refs: list[str], samples: dict, embedder, n: int, batch_size: int,
                      progress: bool) -> None:
    """Each probe's ``embed_per_sample``: {side: cosine similarity of each sample's embedding to the reference's}."""
    flat = list(refs) + [s for side in samples for ss in samples[side] for s in ss]
    emb = embedder.embed(flat, batch_size=max(8, batch_size), progress=progress)
    ref_e, rest = emb[:len(refs)], emb[len(refs):]
    for r, p in enumerate(probes):
        p["embed_per_sample"] = {
            side: (rest[(s * len(refs) + r) * n:(s * len(refs) + r + 1) * n].astype(np.float64)
                   @ ref_e[r].astype(np.float64)).tolist() for s, side in enumerate(samples)}


def _first_line(text: str) -> str:
    """The first non-empty line of ``text``, stripped ("" when none)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def qa_probes(models: dict, qa, *, method: str, max_new_tokens: int, batch_size: int, chunk_size: int | None,
              progress: bool) -> list[dict]:
    """The QA probes of ``qa`` = (questions, gold answers) under ``models`` ({side: LoadedModel}): per question its
    Min-K% NLL (``method``: the Min-K% method name) under each model (``min_k_nll_{side}``, None where not finite),
    each model's greedy answer (at most ``max_new_tokens``) and its ROUGE-L recall of the gold answer. Returns the
    per-question records (``qa_summary`` flags and averages them)."""
    questions, answers = list(qa[0]), list(qa[1])
    prompts = [QA_TEMPLATE.format(question=q) for q in questions]
    sc, recall, answers_by = {}, {}, {}
    for side, m in models.items():
        sc[side] = score_texts(m, questions, [method], None, False, batch_size, chunk_size, progress,
                               f"scoring questions ({side})")[0][method]
        cap = max(1, min(max_new_tokens, m.max_length // 2))
        gen = sample(m, prompts, [cap] * len(prompts), n_samples=1, temperature=0.0, batch_size=batch_size,
                     progress=progress, desc=f"answers ({side})")
        answers_by[side] = [_first_line(g[0]) for g in gen]
        recall[side] = [float(rouge_l([a], gold, "recall")[0]) for a, gold in zip(answers_by[side], answers)]
    return [{"question": q, "answer": a, **{f"min_k_nll_{s}": finite_or_none(-sc[s][i]) for s in models},
             **{f"answer_{s}": answers_by[s][i] for s in models}, **{f"recall_{s}": recall[s][i] for s in models}}
            for i, (q, a) in enumerate(zip(questions, answers))]
