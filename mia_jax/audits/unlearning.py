"""Auditing machine unlearning with Min-K% Prob (Shi et al. 2023, *Detecting Pretraining Data from Large Language
Models*, section 7): which texts of a forget set does an "unlearned" model still know?

1. The forget-set texts are cut into ``chunk_words``-word chunks (``chunk_words``: verbatim, from a chunk's first
   word to its last, so line breaks inside a chunk stay; words are whitespace-separated). A text's last piece
   (or a whole text shorter than one chunk) is kept if it has at least ``min_words`` words, else dropped and
   counted.
2. Every chunk is scored with Min-K% (k = 0.2) and PPL under the original and the unlearned model (the runner:
   one resumable run folder per model). On the paper's quantities, both positive,

       q_mink(x) = -(1/|E|) sum_{i in E} log p(x_i | x_<i)      (E: the k% least likely tokens; mia_jax's min_k@k
                                                                  score is minus this, oriented higher = member)
       q_ppl(x)  = exp(-(1/n) sum_i log p(x_i | x_<i))          (mia_jax's ppl score is minus this)
       ratio(x)  = q(x; unlearned) / q(x; original)

   a chunk is flagged "likely still known" when 1/r < ratio < r (open window, r = 1.15): the unlearned model
   finds it about as likely as the original did. (Unlearning that worked raises the NLL: ratio >= r.) The ratio of
   the two mia_jax scores is the same number (both negative); it is left undefined (NaN, never flagged) where a
   quantity is not finite and positive. Counts are reported for Min-K% and PPL.
3. Story completion on the flagged chunks (Min-K%), the ``max_probe`` with the ratio closest to 1 first: the first
   ``prompt_words`` words are the prompt, the rest the true continuation; ``n_samples`` continuations are sampled
   from each model (``mia_jax.generate``, sample j of a chunk drawn with ``row_keys(seed, text_hash(prompt), j)``
   under *both* models: paired draws) and compared with the true continuation by ROUGE-L F-measure (rouge-score's
   ``RougeScorer(['rougeL'])``: lowercased, non-alphanumerics dropped, no stemming), and, with a sentence encoder
   (``embed_model``, e.g. all-MiniLM-L6-v2), by the cosine similarity of mean-pooled, L2-normalised embeddings (the
   sentence-transformers recipe). Max and mean over the samples, under each model.
4. Optional QA probes: questions scored with Min-K% under both models and flagged by the same window; a greedy
   answer per question from each model (prompt ``"Question: {q}\\nAnswer:"``, its first non-empty line), ROUGE-L
   recall of the gold answer; mean recall of flagged vs other questions.

Outputs (``write_outputs``): unlearning.md, unlearning.json, chunks.csv (per chunk: its place, q under both models,
ratios, flags), ratios.png and probes.jsonl (per probe: prompt, reference, every sample, its ROUGE-L F and cosine
similarity). Everything after scoring and generation (ratios, flags, their counts, the probe and QA summaries) is
``analyse``; ``rebuild`` (``--from DIR``) feeds it the per-example values of an output folder and so recomputes the
same report without the models.

Where this follows the paper: 512-word chunks, Min-K% scores of each chunk under both models, the window
(1/1.15, 1.15) on their ratio, the same comparison with perplexity (the paper: 188 chunks flagged by Min-K%, none
by perplexity), prompts of the first 200 words, 20 sampled continuations per chunk (multinomial sampling: temperature
1, no top-k by default), QA answers compared with the gold answer by ROUGE-L recall, flagged vs unflagged questions.

Where it differs:

- Story completions are compared by ROUGE-L F (and MiniLM cosine similarity when asked) instead of SimCSE scores and
  GPT-4 ratings, and under both models: the original model's similarity is the reference level.
- The length of a completion: the paper does not say. Here a sample gets as many tokens as the true continuation has
  after the prompt (in each model's tokenizer), capped at ``max_new_tokens`` (default 128) and half the context; when
  capped, the reference is the continuation cut to its first cap tokens (whole words, original model's tokenizer), so
  ROUGE-L F compares texts of similar length.
- At most ``max_probe`` (50) flagged chunks are probed (the paper: all 188), those with the ratio closest to 1 first.
- QA: the paper generates 1000 questions with GPT-4 and samples 20 answers each; here the questions come from a file,
  one greedy answer per model (the paper's template is not given; the one above is ours).
- Models with different tokenizers are allowed: Min-K% and PPL are per-text quantities, so the ratio is defined,
  but the two models' per-token scores are over different tokens (the output says so).
- A chunk longer than a model's context is truncated to it (counted, as the runner records it).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from mia_jax import files
from mia_jax.errors import UserError
from mia_jax.models.sentence import SentenceEncoder

CHUNK_WORDS = 512
MIN_WORDS = 32
K = 0.2
RATIO = 1.15
MAX_PROBE = 50
PROMPT_WORDS = 200
N_SAMPLES = 20
MAX_NEW_TOKENS = 128  # default cap of a completion (its budget: the true continuation's token count)
QA_MAX_NEW_TOKENS = 32
QA_TEMPLATE = "Question: {question}\nAnswer:"
SIDES = ("original", "unlearned")
_WORD = re.compile(r"\S+")


# ----------------------------------------------------------------------------- pure helpers

def chunk_words(text: str, n_words: int = CHUNK_WORDS, min_words: int = MIN_WORDS) -> tuple[list[str], int]:
    """(chunks, dropped): the text's consecutive ``n_words``-word pieces, each verbatim from its first word to its
    last (whitespace-separated words); the last piece is kept when it has at least ``min_words`` words, else
    dropped, and ``dropped`` is its word count (0 when nothing was dropped)."""
    if n_words < 1 or min_words < 1:
        raise UserError(f"chunks need n_words >= 1 and min_words >= 1, got {n_words} and {min_words}")
    spans = [m.span() for m in _WORD.finditer(text)]
    chunks, dropped = [], 0
    for start in range(0, len(spans), n_words):
        piece = spans[start:start + n_words]
        if len(piece) < min_words:
            dropped = len(piece)
            break
        chunks.append(text[piece[0][0]:piece[-1][1]])
    return chunks, dropped


def split_prompt(text: str, prompt_words: int = PROMPT_WORDS) -> tuple[str, str]:
    """(prompt, continuation): the first ``prompt_words`` words (verbatim) and the rest (verbatim, stripped)."""
    spans = [m.span() for m in _WORD.finditer(text)]
    if len(spans) <= prompt_words:
        return text.strip(), ""
    return text[spans[0][0]:spans[prompt_words - 1][1]], text[spans[prompt_words][0]:].strip()


def score_ratio(original, unlearned) -> np.ndarray:
    """float64 [N]: q(unlearned) / q(original) with q = -score (the paper's positive Min-K% NLL or perplexity from
    mia_jax's scores, oriented higher = member); NaN where either q is not finite and positive."""
    qo, qu = -np.asarray(original, np.float64), -np.asarray(unlearned, np.float64)
    ok = np.isfinite(qo) & np.isfinite(qu) & (qo > 0) & (qu > 0)
    out = np.full(qo.shape, np.nan)
    out[ok] = qu[ok] / qo[ok]
    return out


def ratio_flags(original, unlearned, ratio: float = RATIO) -> tuple[np.ndarray, np.ndarray]:
    """(ratios, flags): ``score_ratio`` and bool [N], True where 1/ratio < ratios < ratio (open; NaN: False)."""
    if not ratio > 1:
        raise UserError(f"the ratio window (1/r, r) needs r > 1, got {ratio}")
    r = score_ratio(original, unlearned)
    with np.errstate(invalid="ignore"):
        return r, (r > 1 / ratio) & (r < ratio)


_ROUGE = None


def rouge_l(candidates: Sequence[str], reference: str, measure: str = "fmeasure") -> np.ndarray:
    """float64 [len(candidates)]: rouge-score's ROUGE-L (``fmeasure``, ``recall`` or ``precision``) of each candidate
    against ``reference`` (default tokenizer: lowercase alphanumeric words; no stemming); 0 for an empty one."""
    global _ROUGE
    if _ROUGE is None:
        from rouge_score import rouge_scorer

        _ROUGE = rouge_scorer.RougeScorer(["rougeL"])
    return np.array([getattr(_ROUGE.score(reference, c)["rougeL"], measure) for c in candidates], np.float64)


def tokenizer_digest(loaded) -> str:
    """SHA-256 of a model's vocabulary (token -> id) and BOS policy: equal digests tokenize alike."""
    blob = json.dumps([sorted(loaded.tokenizer.get_vocab().items()), loaded.add_bos], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _stats(x) -> tuple[float, float]:
    x = np.asarray(x, np.float64)
    return (float(x.max()), float(x.mean())) if x.size else (math.nan, math.nan)


# ----------------------------------------------------------------------------- sampling (mia_jax.generate)

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
    the key ``row_keys(seed, text_hash(prompt), j)`` (the same draws under any model; greedy when temperature 0)."""
    from mia_jax import generate
    from mia_jax.samia import NEW_TOKENS_MULTIPLE, text_hash

    prompt_ids = generate.encode_prompts(loaded, list(prompts)) if prompts else []
    order = sorted(range(len(prompts)), key=lambda i: (budgets[i], len(prompt_ids[i]), i))
    out: list[list[str]] = [[] for _ in prompts]
    per_call = min(batch_size, len(order)) * n_samples
    bar = tqdm(total=len(order), desc=desc, unit="text", disable=not progress)
    for start in range(0, len(order), batch_size):
        rows = [(i, j) for i in order[start:start + batch_size] for j in range(n_samples)]
        n_real = len(rows)
        rows += [rows[0]] * (per_call - n_real)  # filler rows (budget 0): one compiled batch size
        limit = np.array([budgets[i] for i, _ in rows], np.int32)
        limit[n_real:] = 0
        length = -(-int(limit.max()) // NEW_TOKENS_MULTIPLE) * NEW_TOKENS_MULTIPLE
        keys = generate.row_keys(seed, [text_hash(prompts[i]) for i, _ in rows], [j for _, j in rows])
        gen = generate.generate_ids(loaded, [prompt_ids[i] for i, _ in rows], max_new_tokens=length,
                                    temperature=temperature, top_k=top_k, keys=keys, budgets=limit)
        texts = loaded.tokenizer.decode_batch([gen.completion_ids(r) for r in range(n_real)],
                                              skip_special_tokens=True)
        for (i, _), text in zip(rows, texts):
            out[i].append(text)
        bar.update(n_real // n_samples)
    bar.close()
    return out


# ----------------------------------------------------------------------------- the audit

@dataclass
class Chunk:
    source: int  # index of its text in the input file
    position: int  # its place among the text's chunks
    word_offset: int
    n_words: int
    text: str


@dataclass
class UnlearningResult:
    chunks: list[Chunk]
    methods: dict  # "min_k" / "ppl" -> the mia_jax method name
    scores: dict  # side -> method -> float64 [n_chunks], mia_jax orientation (higher = member)
    ratios: dict  # "min_k" / "ppl" -> float64 [n_chunks]
    flags: dict  # "min_k" / "ppl" -> bool [n_chunks]
    counts: dict
    probes: list[dict] = field(default_factory=list)
    qa: dict | None = None
    notes: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # what a rebuilt result read from unlearning.json besides the above

    def to_markdown(self) -> str:
        from mia_jax.report import fmt, markdown

        c, r = self.counts, self.config["ratio"]
        head = (f"## Unlearning audit (Shi et al. 2023, section 7)\n\n"
                f"{c['texts']} texts -> {c['chunks']} chunks of up to {self.config['chunk_words']} words "
                f"({c['texts_too_short']} texts under {self.config['min_words']} words and {c['tails_dropped']} "
                f"trailing pieces under {self.config['min_words']} words dropped). A chunk is flagged *likely still "
                f"known* when q(unlearned) / q(original) is in (1/{r:g}, {r:g}) = ({1 / r:.4f}, {r:.4f}); q: the "
                f"Min-K% (k = {self.config['k']:g}) average negative log-likelihood, or the perplexity.\n\n")
        counts = markdown(["Method", "Chunks scored", "Flagged", "Ratio undefined"], [
            [f"{name} ({self.methods[name]})", str(c[f"scored_{name}"]), str(c[f"flagged_{name}"]),
             str(c[f"undefined_{name}"])] for name in ("min_k", "ppl")])
        notes = "".join(f"\n{n}\n" for n in self.notes)
        body = ""
        if self.probes:
            embed = "embed_original" in self.probes[0]
            hdr = ["Chunk", "Text", "Words", "Min-K% NLL orig", "unl", "Ratio", "PPL ratio", "ROUGE-L max orig", "unl",
                   "ROUGE-L mean orig", "unl"] + (["Cos max orig", "unl", "Cos mean orig", "unl"] if embed else [])
            rows = []
            for p in self.probes:
                i = p["chunk"]
                ch = self.chunks[i]
                row = [str(i), str(ch.source), f"{ch.word_offset + 1}-{ch.word_offset + ch.n_words}",
                       fmt(-self.scores["original"]["min_k"][i]), fmt(-self.scores["unlearned"]["min_k"][i]),
                       fmt(self.ratios["min_k"][i]), fmt(self.ratios["ppl"][i]),
                       fmt(p["rougeL_original"]["max"]), fmt(p["rougeL_unlearned"]["max"]),
                       fmt(p["rougeL_original"]["mean"]), fmt(p["rougeL_unlearned"]["mean"])]
                if embed:
                    row += [fmt(p["embed_original"]["max"]), fmt(p["embed_unlearned"]["max"]),
                            fmt(p["embed_original"]["mean"]), fmt(p["embed_unlearned"]["mean"])]
                rows.append(row)
            body += (f"\n### Story completion on {len(self.probes)} flagged chunks\n\nPrompt: the first "
                     f"{self.config['prompt_words']} words; {self.config['n_samples']} sampled continuations per "
                     f"model, compared with the true continuation (ROUGE-L F"
                     f"{'; Cos: cosine similarity of sentence embeddings' if embed else ''}; max and mean over "
                     f"samples).\n\n"
                     + markdown(hdr, rows))
        if self.qa:
            q = self.qa
            body += (f"\n### QA probes ({q['n']} questions, {q['n_flagged']} flagged by Min-K%)\n\nMean ROUGE-L "
                     f"recall of the gold answer (greedy answers):\n\n" + markdown(
                         ["Questions", "n", "Original", "Unlearned"],
                         [[g, str(q[g]["n"]), fmt(q[g]["original"]), fmt(q[g]["unlearned"])]
                          for g in ("flagged", "other", "all")]))
        return head + counts + notes + body


def make_chunks(texts: Sequence[str], n_words: int, min_words: int) -> tuple[list[Chunk], dict]:
    """Every text's chunks (``chunk_words``) and the counts of what was dropped."""
    chunks, counts = [], {"texts": len(texts), "texts_too_short": 0, "tails_dropped": 0, "words_dropped": 0}
    for s, text in enumerate(texts):
        pieces, dropped = chunk_words(text, n_words, min_words)
        if not pieces:
            counts["texts_too_short"] += 1
        elif dropped:
            counts["tails_dropped"] += 1
        counts["words_dropped"] += dropped
        chunks += [Chunk(s, j, j * n_words, len(p.split()), p) for j, p in enumerate(pieces)]
    counts["chunks"] = len(chunks)
    return chunks, counts


def check_options(*, chunk_words: int, min_words: int, k: float, ratio: float, max_probe: int, prompt_words: int,
                  n_samples: int, max_new_tokens: int | None, temperature: float, top_k: int | None,
                  batch_size: int) -> None:
    """UserError for an option out of range (before anything is loaded or written)."""
    from mia_jax.generate import check_sampling

    if chunk_words < 1 or not 1 <= min_words <= chunk_words:
        raise UserError(f"--chunk-words must be >= 1 and --min-words between 1 and --chunk-words, got {chunk_words} "
                        f"and {min_words}")
    if not 0 < k <= 1:
        raise UserError(f"--k must be in (0, 1], got {k}")
    if not (math.isfinite(ratio) and ratio > 1):
        raise UserError(f"--ratio must be a number above 1 (the window is (1/r, r)), got {ratio}")
    if max_probe < 0:
        raise UserError(f"--max-probe must be >= 0, got {max_probe}")
    if not 1 <= prompt_words < chunk_words:
        raise UserError(f"--prompt-words must be between 1 and --chunk-words - 1, got {prompt_words}")
    if n_samples < 1 or batch_size < 1:
        raise UserError(f"--n-samples and --batch-size must be >= 1, got {n_samples} and {batch_size}")
    check_sampling(max_new_tokens or 1, temperature, top_k, None)


def _score(loaded, texts, methods, run_dir, resume, batch_size, chunk_size, progress, desc) -> tuple[dict, list]:
    from mia_jax import runner
    from mia_jax.metrics import scores_by_method

    recs = runner.score_dataset(loaded, texts, methods, out_dir=run_dir, resume=resume, batch_size=batch_size,
                                chunk_size=chunk_size, progress=progress, desc=desc)
    return scores_by_method(recs, methods), recs


def audit_unlearning(original, unlearned, texts: Sequence[str], *, chunk_words: int = CHUNK_WORDS,
                     min_words: int = MIN_WORDS, k: float = K, ratio: float = RATIO, max_probe: int = MAX_PROBE,
                     prompt_words: int = PROMPT_WORDS, n_samples: int = N_SAMPLES, max_new_tokens: int | None = None,
                     temperature: float = 1.0, top_k: int | None = None, seed: int = 0, batch_size: int = 8,
                     chunk_size: int = 8192, qa: tuple[Sequence[str], Sequence[str]] | None = None,
                     qa_max_new_tokens: int = QA_MAX_NEW_TOKENS, embedder: SentenceEncoder | None = None,
                     run_dirs: dict | None = None, resume: dict | None = None,
                     progress: bool = True) -> UnlearningResult:
    """The audit of the module docstring. ``original`` / ``unlearned``: ``LoadedModel``s; ``texts``: the forget set;
    ``qa``: (questions, answers); ``embedder``: a ``SentenceEncoder``; ``run_dirs`` / ``resume``: {side: folder /
    bool} of each model's scoring run (``runner.score_dataset``'s ``out_dir``; claimed by the caller)."""
    check_options(chunk_words=chunk_words, min_words=min_words, k=k, ratio=ratio, max_probe=max_probe,
                  prompt_words=prompt_words, n_samples=n_samples, max_new_tokens=max_new_tokens,
                  temperature=temperature, top_k=top_k, batch_size=batch_size)
    chunks, counts = make_chunks(texts, chunk_words, min_words)
    if not chunks:
        raise UserError(f"no chunks: none of the {len(texts)} texts has {min_words} words (--min-words)")
    methods = {"min_k": min_k_method(k), "ppl": "ppl"}
    models = {"original": original, "unlearned": unlearned}
    run_dirs, resume = run_dirs or {}, resume or {}
    scores, records = {}, {}
    for side in SIDES:
        by_method, records[side] = _score(models[side], [c.text for c in chunks], list(methods.values()),
                                          run_dirs.get(side), resume.get(side, False), batch_size, chunk_size,
                                          progress, f"scoring ({side})")
        scores[side] = {name: by_method[m] for name, m in methods.items()}
    truncated = {f"truncated_{side}": sum(1 for r in records[side] if r.get("truncated")) for side in SIDES}
    notes = []
    trunc = {side: (truncated[f"truncated_{side}"], models[side].max_length) for side in SIDES}
    for who, (n, ctx) in ([("either model's", trunc["original"])] if trunc["original"] == trunc["unlearned"]
                          else [(f"the {side} model's", trunc[side]) for side in SIDES]):
        if n:
            notes.append(f"Note: {n} chunks are longer than {who} context of {ctx} tokens and were scored on their "
                         "first tokens only.")
    same_tok = tokenizer_digest(original) == tokenizer_digest(unlearned)
    if not same_tok:
        notes.append("Note: the two models tokenize differently; Min-K% and PPL are per-chunk quantities, so the "
                     "ratio is defined, but the per-token scores behind them are over different tokens.")
    config = dict(chunk_words=chunk_words, min_words=min_words, k=k, ratio=ratio, max_probe=max_probe,
                  prompt_words=prompt_words, n_samples=n_samples, max_new_tokens=max_new_tokens,
                  temperature=temperature, top_k=top_k, seed=seed, same_tokenizer=same_tok)
    res = analyse(chunks, methods, scores, counts, config, notes)
    res.counts.update(truncated)
    probes = _story_completion(res, models, embedder, batch_size=batch_size, progress=progress)
    res.probes = [probe_summary(p) for p in probes]
    if qa is not None:
        res.qa = qa_summary(_qa_probes(models, qa, k=k, max_new_tokens=qa_max_new_tokens, batch_size=batch_size,
                                       chunk_size=chunk_size, progress=progress), ratio, methods["min_k"])
    return res


def _story_completion(res: UnlearningResult, models: dict, embedder, *, batch_size: int, progress: bool) -> list:
    """Probe the flagged chunks (ratio closest to 1 first, at most max_probe, with a continuation): per probe its
    chunk, prompt, reference, ``samples`` and the per-sample ``rougeL_per_sample`` (and ``embed_per_sample``) values,
    {side: [n_samples]}; ``probe_summary`` adds the max and mean."""
    cfg = res.config
    log_r = np.abs(np.log(np.where(res.flags["min_k"], res.ratios["min_k"], np.nan)))
    flagged = [int(i) for i in np.argsort(log_r, kind="stable") if res.flags["min_k"][i]]
    splits = {i: split_prompt(res.chunks[i].text, cfg["prompt_words"]) for i in flagged}
    with_cont = [i for i in flagged if splits[i][1]]
    res.counts["flagged_without_continuation"] = len(flagged) - len(with_cont)
    todo = with_cont[:cfg["max_probe"]]
    res.counts["probed"] = len(todo)
    if not todo:
        return []
    prompts = [splits[i][0] for i in todo]
    cap_o = min(cfg["max_new_tokens"] or MAX_NEW_TOKENS, models["original"].max_length // 2)
    refs = [cut_reference(models["original"], p, splits[i][1], cap_o) for p, i in zip(prompts, todo)]
    samples = {}
    for side in SIDES:
        m = models[side]
        cap = max(1, min(cfg["max_new_tokens"] or MAX_NEW_TOKENS, m.max_length // 2))
        budgets = [max(1, min(cap, len(ids))) for ids in continuation_ids(m, prompts, refs)]
        samples[side] = sample(m, prompts, budgets, n_samples=cfg["n_samples"], temperature=cfg["temperature"],
                               top_k=cfg["top_k"], seed=cfg["seed"], batch_size=batch_size, progress=progress,
                               desc=f"completions ({side})")
    probes = [{"chunk": i, "prompt": prompt, "reference": ref,
               "samples": {side: samples[side][r] for side in SIDES},
               "rougeL_per_sample": {side: rouge_l(samples[side][r], ref).tolist() for side in SIDES}}
              for r, (i, prompt, ref) in enumerate(zip(todo, prompts, refs))]
    if embedder is not None:
        flat = list(refs) + [s for side in SIDES for ss in samples[side] for s in ss]
        emb = embedder.embed(flat, batch_size=max(8, batch_size), progress=progress)
        ref_e, rest = emb[:len(refs)], emb[len(refs):]
        n = cfg["n_samples"]
        for r, p in enumerate(probes):
            p["embed_per_sample"] = {
                side: (rest[(s * len(refs) + r) * n:(s * len(refs) + r + 1) * n].astype(np.float64)
                       @ ref_e[r].astype(np.float64)).tolist() for s, side in enumerate(SIDES)}
    return probes


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _qa_probes(models: dict, qa, *, k: float, max_new_tokens: int, batch_size: int, chunk_size: int,
               progress: bool) -> list[dict]:
    """Per question: its Min-K% NLL under both models (``min_k_nll_{side}``, None where not finite), each model's
    greedy answer and its ROUGE-L recall of the gold answer; ``qa_summary`` flags and averages them."""
    questions, answers = list(qa[0]), list(qa[1])
    method = min_k_method(k)
    prompts = [QA_TEMPLATE.format(question=q) for q in questions]
    sc, recall, answers_by = {}, {}, {}
    for side in SIDES:
        m = models[side]
        sc[side] = _score(m, questions, [method], None, False, batch_size, chunk_size, progress,
                          f"scoring questions ({side})")[0][method]
        cap = max(1, min(max_new_tokens, m.max_length // 2))
        gen = sample(m, prompts, [cap] * len(prompts), n_samples=1, temperature=0.0, batch_size=batch_size,
                     progress=progress, desc=f"answers ({side})")
        answers_by[side] = [_first_line(g[0]) for g in gen]
        recall[side] = [float(rouge_l([a], gold, "recall")[0]) for a, gold in zip(answers_by[side], answers)]
    return [{"question": q, "answer": a, **{f"min_k_nll_{s}": _num(-sc[s][i]) for s in SIDES},
             **{f"answer_{s}": answers_by[s][i] for s in SIDES}, **{f"recall_{s}": recall[s][i] for s in SIDES}}
            for i, (q, a) in enumerate(zip(questions, answers))]


def _num(x) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


# ----------------------------------------------------------------------------- strict reading of what a run wrote

def read_csv_rows(path: Path, columns: Sequence[str], what: str) -> list[tuple[int, dict]]:
    """(line, {column: cell}) of every record of a CSV file a run wrote, read strictly: UTF-8 (a byte-order mark is
    read), a header with every one of ``columns``, every record as many fields as the header; a torn, padded or
    empty row, a quote left open or bytes that are not UTF-8 are a UserError naming the file and line. ``what``: the
    command that writes the file (for the message)."""
    import csv

    line = 1
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh, strict=True)
            header = next(reader, None)
            if not header:
                raise UserError(f"{path} is empty (no header); not the file `{what}` writes")
            missing = [c for c in columns if c not in header]
            if missing:
                raise UserError(f"{path}: no column {', '.join(map(repr, missing))}; not the file `{what}` writes")
            rows = []
            for rec in reader:
                line = reader.line_num
                if len(rec) != len(header):
                    raise UserError(f"{path} line {line}: {len(rec)} fields where the header has {len(header)} (a "
                                    "torn or damaged row)")
                rows.append((line, dict(zip(header, rec))))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except csv.Error as e:
        raise UserError(f"{path} line {line + 1}: not a CSV record ({e})") from None
    return rows


def cell_int(row: dict, column: str, where: str) -> int:
    """A whole-number cell (``where``: "FILE line N")."""
    text = row[column]
    if not re.fullmatch(r"-?[0-9]+", text):
        raise UserError(f"{where}: {column} is {text!r}, not a whole number")
    return int(text)


def cell_float(row: dict, column: str, where: str) -> float:
    """A number cell as the runs write them (a float's repr, empty for a value that is not finite: NaN)."""
    text = row[column]
    if text == "":
        return math.nan
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UserError(f"{where}: {column} is {text!r}, not a number (an empty cell stands for no value)")
    return value


def cell_bool(row: dict, column: str, where: str) -> bool:
    text = row[column]
    if text not in ("True", "False"):
        raise UserError(f"{where}: {column} is {text!r}, not True or False")
    return text == "True"


# ----------------------------------------------------------------------------- the analysis (audit and rebuild)

def analyse(chunks: list[Chunk], methods: dict, scores: dict, counts: dict, config: dict, notes: Sequence[str],
            probes: Sequence[dict] = (), qa: Sequence[dict] | None = None) -> UnlearningResult:
    """Everything the report says that is not scoring or generation: each method's ratios and flags (``ratio_flags``
    with ``config["ratio"]``) and their counts (``scored_``, ``flagged_``, ``undefined_``; the other ``counts`` are
    kept), the story-completion summaries (``probe_summary`` of each probe) and the QA summary (``qa_summary`` of
    the per-question values). ``scores``: side -> "min_k" / "ppl" -> float64 [n_chunks] (mia_jax orientation)."""
    counts, ratios, flags = dict(counts), {}, {}
    for name in methods:
        ratios[name], flags[name] = ratio_flags(scores["original"][name], scores["unlearned"][name], config["ratio"])
        counts[f"scored_{name}"] = int(np.sum(np.isfinite(scores["original"][name])
                                              & np.isfinite(scores["unlearned"][name])))
        counts[f"flagged_{name}"] = int(flags[name].sum())
        counts[f"undefined_{name}"] = int(np.isnan(ratios[name]).sum())
    res = UnlearningResult(chunks, dict(methods), scores, ratios, flags, counts, notes=list(notes),
                           config=dict(config))
    res.probes = [probe_summary(p) for p in probes]
    if qa is not None:
        res.qa = qa_summary(qa, config["ratio"], methods["min_k"])
    return res


_PER_SAMPLE = ("rougeL", "embed")  # per-sample ROUGE-L F / embedding cosine similarity of a probe


def probe_summary(probe: dict) -> dict:
    """A story-completion probe (``chunk``, ``prompt``, ``reference``, ``samples``, ``rougeL_per_sample`` and
    optionally ``embed_per_sample``: {side: [value per sample]}) with, for each kind, ``{kind}_{side}`` = the max
    and mean over the samples. The keys in a fixed order (the same file whether written by the audit or rebuilt)."""
    out = {k: probe[k] for k in ("chunk", "prompt", "reference")}
    kinds = [kind for kind in _PER_SAMPLE if f"{kind}_per_sample" in probe]
    for kind in kinds:
        for side in SIDES:
            mx, mean = _stats(probe[f"{kind}_per_sample"][side])
            out[f"{kind}_{side}"] = {"max": mx, "mean": mean}
    out["samples"] = probe["samples"]
    out.update({f"{kind}_per_sample": probe[f"{kind}_per_sample"] for kind in kinds})
    return out


def qa_summary(questions: Sequence[dict], ratio: float, method: str) -> dict:
    """The QA probes' summary from per-question values (``question``, ``answer``, ``min_k_nll_{side}``: the Min-K%
    NLL, None where not finite, ``answer_{side}``, ``recall_{side}``): each question's ratio and flag
    (``ratio_flags``), and the mean ROUGE-L recall of the flagged, other and all questions under each model."""
    nll = {s: np.array([math.nan if q[f"min_k_nll_{s}"] is None else q[f"min_k_nll_{s}"] for q in questions],
                       np.float64) for s in SIDES}
    ratios, flags = ratio_flags(-nll["original"], -nll["unlearned"], ratio)
    recall = {s: np.array([q[f"recall_{s}"] for q in questions], np.float64) for s in SIDES}
    out = {"n": len(questions), "n_flagged": int(flags.sum()), "method": method}
    for group, sel in (("flagged", flags), ("other", ~flags), ("all", np.ones_like(flags))):
        out[group] = {"n": int(sel.sum()), **{side: float(recall[side][sel].mean()) if sel.any() else None
                                              for side in SIDES}}
    out["questions"] = [{"question": q["question"], "answer": q["answer"],
                         **{f"min_k_nll_{s}": q[f"min_k_nll_{s}"] for s in SIDES},
                         "ratio": _num(ratios[i]), "flagged": bool(flags[i]),
                         **{f"answer_{s}": q[f"answer_{s}"] for s in SIDES},
                         **{f"recall_{s}": q[f"recall_{s}"] for s in SIDES}} for i, q in enumerate(questions)]
    return out


# ----------------------------------------------------------------------------- outputs

REBUILD_READS = ("unlearning.json", "chunks.csv", "probes.jsonl")  # what --from reads (sealed in manifest.json)


def render_outputs(res: UnlearningResult, meta: dict) -> dict[str, bytes]:
    """{name: bytes} of unlearning.md, chunks.csv, ratios.png, unlearning.json and probes.jsonl (with every sample
    and its per-sample values): what ``rebuild`` reads back."""
    import csv
    import io

    from mia_jax.report import pyplot

    files = {"unlearning.md": (res.to_markdown() + "\n").encode("utf-8")}
    probed = {p["chunk"]: p for p in res.probes}
    s, rows = res.scores, []
    for i, c in enumerate(res.chunks):
        p = probed.get(i, {})
        rows.append([i, c.source, c.position, c.word_offset, c.n_words,
                     *(_num(-s[side][name][i]) for name in ("min_k", "ppl") for side in SIDES),
                     _num(res.ratios["min_k"][i]), bool(res.flags["min_k"][i]), _num(res.ratios["ppl"][i]),
                     bool(res.flags["ppl"][i]), i in probed,
                     *(p.get(f"rougeL_{side}", {}).get(a) for a in ("max", "mean") for side in SIDES)])
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(CHUNKS_COLUMNS)
    w.writerows(rows)
    files["chunks.csv"] = buf.getvalue().encode("utf-8")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    r = res.config["ratio"]
    logs = {name: np.log(res.ratios[name][np.isfinite(res.ratios[name])]) for name in ("min_k", "ppl")}
    edges = np.histogram_bin_edges(np.concatenate([*logs.values(), [-math.log(r), math.log(r)]]), bins=40)
    for (name, x), color in zip(logs.items(), ("C0", "C1")):
        if x.size:
            ax.hist(x, bins=edges, alpha=0.6, color=color,
                    label=f"{res.methods[name]} ({res.counts[f'flagged_{name}']} of {x.size} flagged)")
    ax.axvspan(-math.log(r), math.log(r), color="grey", alpha=0.2, label=f"window (1/{r:g}, {r:g})")
    ax.set_xlabel("log( q(unlearned) / q(original) )")
    ax.set_ylabel("chunks")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title("Forget-set chunks: score ratio, unlearned vs original")
    ax.legend(fontsize=8)
    files["ratios.png"] = figure_bytes(fig)
    record = {**meta, "config": res.config, "methods": res.methods, "counts": res.counts, "notes": res.notes,
              "flagged_min_k": [int(i) for i in np.flatnonzero(res.flags["min_k"])],
              "flagged_ppl": [int(i) for i in np.flatnonzero(res.flags["ppl"])],
              "probes": [{k: v for k, v in p.items() if k != "samples" and not k.endswith("_per_sample")}
                         for p in res.probes],
              "qa": res.qa}
    files["unlearning.json"] = (json.dumps(record, indent=2, default=str) + "\n").encode("utf-8")
    files["probes.jsonl"] = "".join(json.dumps(p) + "\n" for p in res.probes).encode("utf-8")
    return files


def figure_bytes(fig, dpi: int = 120) -> bytes:
    """A figure as PNG bytes (laid out with ``tight_layout``, as ``report.save_figure`` saves it), closed."""
    import io

    from mia_jax.report import pyplot

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    pyplot().close(fig)
    return buf.getvalue()


def write_outputs(res: UnlearningResult, out: Path, meta: dict) -> None:
    """``render_outputs`` into ``out``, all or none (``files.write_all``), then sealed (``rundir.seal``: the record
    a ``--from`` rebuild checks its inputs against)."""
    from mia_jax import rundir
    from mia_jax.files import write_all

    write_all(out, render_outputs(res, meta))
    rundir.seal(out, list(REBUILD_READS))


# ----------------------------------------------------------------------------- rebuild from a results folder

_CSV_Q = {"min_k": "min_k_nll", "ppl": "ppl"}  # chunks.csv: the column prefix of each method's q (= -score)
_CSV_INT = ("chunk", "source_text", "chunk_in_text", "word_offset", "n_words")
CHUNKS_COLUMNS = ["chunk", "source_text", "chunk_in_text", "word_offset", "n_words", "min_k_nll_original",
                  "min_k_nll_unlearned", "ppl_original", "ppl_unlearned", "min_k_ratio", "min_k_flagged", "ppl_ratio",
                  "ppl_flagged", "probed", "rougeL_max_original", "rougeL_max_unlearned", "rougeL_mean_original",
                  "rougeL_mean_unlearned"]
_CSV_FLOAT = [c for c in CHUNKS_COLUMNS[5:] if not c.endswith(("_flagged", "probed"))]
_CSV_BOOL = ("min_k_flagged", "ppl_flagged", "probed")
_RESULT_KEYS = ("config", "methods", "counts", "notes", "flagged_min_k", "flagged_ppl", "probes", "qa")


def _load_json(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a JSON file ({e})") from None
    missing = [k for k in ("config", "methods", "counts", "notes") if k not in (record if isinstance(record, dict)
                                                                                 else {})]
    if missing:
        raise UserError(f"{path}: no {', '.join(missing)}: not the unlearning.json of `mia-jax audit-unlearning`")
    if not (isinstance(record["methods"], dict) and set(record["methods"]) == set(_CSV_Q)
            and isinstance(record["counts"], dict) and isinstance(record["config"], dict)):
        raise UserError(f"{path}: its methods, counts or config are not those `mia-jax audit-unlearning` writes")
    return record


def _load_chunks(path: Path, methods: dict) -> tuple[list[Chunk], dict, list[int]]:
    """The chunks (positions only: texts are not in chunks.csv), side -> name -> float64 scores and the chunks
    marked probed; every cell checked (``read_csv_rows``, ``cell_*``)."""
    rows = read_csv_rows(path, CHUNKS_COLUMNS, "mia-jax audit-unlearning")
    chunks, probed = [], []
    q = {f"{_CSV_Q[name]}_{side}": np.full(len(rows), np.nan) for name in methods for side in SIDES}
    for i, (line, row) in enumerate(rows):
        where = f"{path} line {line}"
        ints = [cell_int(row, c, where) for c in _CSV_INT]
        for c in _CSV_FLOAT:
            value = cell_float(row, c, where)
            if c in q:
                q[c][i] = value  # written with repr: exact
        flags = {c: cell_bool(row, c, where) for c in _CSV_BOOL}
        if ints[0] != i:
            raise UserError(f"{where} is chunk {ints[0]}, expected {i} (rows in chunk order, none missing)")
        if flags["probed"]:
            probed.append(i)
        chunks.append(Chunk(*ints[1:], text=""))
    return chunks, {side: {name: -q[f"{_CSV_Q[name]}_{side}"] for name in methods} for side in SIDES}, probed


def _load_probes(path: Path, n_chunks: int) -> list[dict]:
    probes = []
    seen = set()
    for n, p in files.read_jsonl(path):
        missing = [k for k in ("chunk", "prompt", "reference", "samples", "rougeL_per_sample")
                   if k not in (p if isinstance(p, dict) else {})]
        if missing:
            raise UserError(f"{path}: line {n} has no {', '.join(missing)} (written by a mia-jax that did not "
                            "keep per-sample values?); rerun the audit to rebuild from it")
        if not (isinstance(p["chunk"], int) and not isinstance(p["chunk"], bool) and 0 <= p["chunk"] < n_chunks):
            raise UserError(f"{path}: line {n} probes chunk {p['chunk']!r}, not one of the {n_chunks} chunks")
        if p["chunk"] in seen:
            raise UserError(f"{path}: line {n} probes chunk {p['chunk']} a second time")
        seen.add(p["chunk"])
        for kind in _PER_SAMPLE:
            values = p.get(f"{kind}_per_sample")
            if values is not None and not (isinstance(values, dict) and all(
                    isinstance(values.get(side), list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                               for x in values[side]) for side in SIDES)):
                raise UserError(f"{path}: line {n}: {kind}_per_sample is not a list of numbers per model")
        probes.append(p)
    return probes


def rebuild(folder: str | Path) -> UnlearningResult:
    """The result of the audit whose outputs are in ``folder``, recomputed without the models by ``analyse`` (the
    code the audit runs): the per-chunk scores from chunks.csv, the story-completion probes with their samples and
    per-sample values from probes.jsonl, and config, methods, counts, notes and the QA per-question values from
    unlearning.json (the rest of it, models and command, in ``meta``). Not redone, only read: scoring, sampling,
    which chunks were probed, ROUGE-L and embeddings of each sample, the counts of chunking, truncation and probing.
    Chunk texts are not in the folder (``Chunk.text`` is ""). Reads only: first every file against the folder's
    manifest.json (``rundir.verify``), then strictly (every cell, and the files against each other); UserError for
    a missing, changed or malformed file."""
    from mia_jax import rundir

    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"--from {folder}: no such folder")
    rundir.verify(folder, list(REBUILD_READS))
    paths = {name: folder / name for name in REBUILD_READS}
    record = _load_json(paths["unlearning.json"])
    chunks, scores, probed = _load_chunks(paths["chunks.csv"], record["methods"])
    n = record["counts"].get("chunks")
    if n != len(chunks):
        raise UserError(f"{paths['chunks.csv']} has {len(chunks)} chunks, {paths['unlearning.json']} counts {n}")
    probes = _load_probes(paths["probes.jsonl"], len(chunks))
    in_probes = sorted(p["chunk"] for p in probes)
    if in_probes != probed:
        lost = sorted(set(probed) - set(in_probes))
        extra = sorted(set(in_probes) - set(probed))
        raise UserError(f"{paths['chunks.csv']} marks {len(probed)} chunks probed, {paths['probes.jsonl']} holds "
                        f"{len(in_probes)} probes ("
                        + (f"no probe of chunk {lost[0]}" if lost else f"chunk {extra[0]} is not marked probed")
                        + "); the two files are not of one run")
    if record["counts"].get("probed", len(probes)) != len(probes):
        raise UserError(f"{paths['probes.jsonl']} holds {len(probes)} probes, {paths['unlearning.json']} counts "
                        f"{record['counts']['probed']}")
    qa = record.get("qa")
    if qa is not None:
        keys = [f"{k}_{s}" for k in ("min_k_nll", "answer", "recall") for s in SIDES]
        if not all(all(k in q for k in ("question", "answer", *keys)) for q in qa.get("questions", [])):
            raise UserError(f"{paths['unlearning.json']}: its QA questions lack per-question values "
                            f"({', '.join(keys)}); rerun the audit to rebuild from it")
        qa = qa["questions"]
    res = analyse(chunks, record["methods"], scores, record["counts"], record["config"], record["notes"], probes,
                  qa)
    res.meta = {k: v for k, v in record.items() if k not in _RESULT_KEYS}
    return res


def rebuild_command(args) -> UnlearningResult:
    """`mia-jax audit-unlearning --from DIR --out OUT`: ``rebuild`` DIR, then OUT's files as the audit writes them
    (unlearning.json adds ``rebuilt``: from where, the command, the package version). OUT: new, empty, an earlier
    rebuild of the same DIR, or DIR itself (in place: written only once every output is computed)."""
    from mia_jax import __version__, rundir
    from mia_jax.entry import check_out
    from mia_jax.files import write_all

    given = [flag for flag, v in (("--original", args.original), ("--unlearned", args.unlearned),
                                  ("--texts", args.texts), ("--qa", args.qa), ("--embed-model", args.embed_model))
             if v is not None]
    if given:
        raise UserError(f"--from rebuilds the report from a results folder, without models or data: leave out "
                        f"{', '.join(given)}")
    src, out = Path(args.from_dir), check_out(args.out)
    if out.resolve() != src.resolve() and src.resolve() in out.resolve().parents:
        raise UserError(f"--out {out} is inside --from {src}; a rebuild never writes into a folder inside the one it "
                        "reads: give another --out")
    res = rebuild(src)
    meta = {**res.meta, "rebuilt": {"from": str(src), "command": " ".join(sys.argv), "package_version": __version__}}
    files = render_outputs(res, meta)
    with rundir.rebuild_into(out, [src], "audit-unlearning"):
        write_all(out, files)
        rundir.seal(out, list(REBUILD_READS))
    print(res.to_markdown())
    print(f"wrote {out}/ (rebuilt from {src}/)", file=sys.stderr)
    return res


# ----------------------------------------------------------------------------- mia-jax audit-unlearning

def add_parser(sub) -> argparse.ArgumentParser:
    """The ``audit-unlearning`` subparser (its options: ``mia_jax.commands.audit_unlearning``)."""
    from mia_jax.commands import audit_unlearning as command_module  # the command's own module (until cli.py uses it)

    p = sub.add_parser(command_module.NAME, help=command_module.HELP)
    command_module.add_arguments(p)
    return p


def command(args) -> UnlearningResult:
    """`mia-jax audit-unlearning`: every input checked and both models loaded before anything is written."""
    from mia_jax import __version__, data, models, rundir, runner

    if args.from_dir is not None:
        return rebuild_command(args)
    missing = [flag for flag, v in (("--original", args.original), ("--unlearned", args.unlearned),
                                    ("--texts", args.texts)) if v is None]
    if missing:
        raise UserError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required (or --from DIR to "
                        "rebuild the report of an earlier --out folder)")
    check_options(chunk_words=args.chunk_words, min_words=args.min_words, k=args.k, ratio=args.ratio,
                  max_probe=args.max_probe, prompt_words=args.prompt_words, n_samples=args.n_samples,
                  max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                  batch_size=args.batch_size)
    if args.qa_max_new_tokens < 1:
        raise UserError(f"--qa-max-new-tokens must be >= 1, got {args.qa_max_new_tokens}")
    ds = data.load_records(args.texts, args.text_field, None, encoding=args.encoding)
    chunks, _ = make_chunks(ds.texts, args.chunk_words, args.min_words)
    if not chunks:
        raise UserError(f"{args.texts}: no chunks: none of its {len(ds)} texts has {args.min_words} words "
                        "(--min-words)")
    qa = None
    if args.qa:
        qds = data.load_records(args.qa, args.qa_question_field, None, encoding=args.encoding,
                                extra=(args.qa_answer_field,))
        answers = qds.extra[args.qa_answer_field]
        if not qds.texts:
            raise UserError(f"{args.qa}: no questions")
        bad = [i for i, (q, a) in enumerate(zip(qds.texts, answers))
               if not (q.strip() and isinstance(a, str) and a.strip())]
        if bad:
            raise UserError(f"{args.qa}: row {bad[0] + 1} has no {args.qa_question_field!r} or no "
                            f"{args.qa_answer_field!r} text (fields: --qa-question-field, --qa-answer-field)")
        qa = (qds.texts, answers)
    out = rundir.check_path(args.out)
    load = dict(dtype=args.dtype, allow_download=args.allow_download)
    loaded = {"original": models.load(args.original, **load), "unlearned": models.load(args.unlearned, **load)}
    embedder = SentenceEncoder(args.embed_model, args.dtype) if args.embed_model else None
    texts = [c.text for c in chunks]
    methods = [min_k_method(args.k), "ppl"]
    fingerprint = audit_fingerprint(args, loaded, embedder, ds.files, qa_files=qds.files if args.qa else None)
    # the folder is this audit's (or refused untouched); each model's scoring run is claimed on its own inside it
    with rundir.claim(out, fingerprint, overwrite=args.overwrite), contextlib.ExitStack() as stack:
        run_dirs, resume = {}, {}
        for side in SIDES:
            run_dirs[side] = rundir.check_path(out / side)
            fp = runner.run_fingerprint(loaded[side], texts, None, methods, data_files=ds.files, labeled=False,
                                        encoding=args.encoding, text_field=args.text_field,
                                        chunk_words=args.chunk_words, min_words=args.min_words,
                                        batch_size=args.batch_size, chunk_size=args.chunk_size, dtype=args.dtype)
            resume[side] = stack.enter_context(rundir.claim(run_dirs[side], fp, overwrite=args.overwrite))
            if resume[side]:
                print(f"resuming the {side} run in {run_dirs[side]}", file=sys.stderr)
        res = audit_unlearning(
            loaded["original"], loaded["unlearned"], ds.texts, chunk_words=args.chunk_words,
            min_words=args.min_words, k=args.k, ratio=args.ratio, max_probe=args.max_probe,
            prompt_words=args.prompt_words, n_samples=args.n_samples, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_k=args.top_k, seed=args.seed, batch_size=args.batch_size,
            chunk_size=args.chunk_size, qa=qa, qa_max_new_tokens=args.qa_max_new_tokens, embedder=embedder,
            run_dirs=run_dirs, resume=resume, progress=not args.no_progress)
        meta = {"command": " ".join(sys.argv), "package_version": __version__, "data_files": ds.files,
                "models": {side: {"name": m.name, "source": m.source, "files": m.files, "dtype": m.dtype,
                                  "add_bos": m.add_bos, "max_length": m.max_length,
                                  "tokenizer_sha256": tokenizer_digest(m)} for side, m in loaded.items()},
                "embed_model": {"name": embedder.name, "files": embedder.files} if embedder else None}
        res.meta = meta
        write_outputs(res, out, meta)
    print(res.to_markdown())
    print(f"wrote {out}/", file=sys.stderr)
    return res


# Options of `audit-unlearning` that are not in the folder's fingerprint, and why (every other one is)
NOT_IN_FINGERPRINT = ("from_dir", "out", "overwrite", "no_progress", "allow_download", "original", "unlearned",
                      "texts", "qa", "embed_model")  # the last five: by their files' SHA-256 instead


def audit_fingerprint(args, loaded: dict, embedder, data_files: dict, qa_files: dict | None) -> dict:
    """What makes an audit-unlearning folder (``rundir.claim``): both models' and every data file's SHA-256 and
    every option that can change a result; a folder holding anything else is refused."""
    from mia_jax import __version__

    def resolved(files):
        return {str(Path(f).resolve()): h for f, h in files.items()} if files is not None else None

    options = {k: v for k, v in sorted(vars(args).items()) if k not in NOT_IN_FINGERPRINT and k != "command"}
    return {"command": "audit-unlearning", "models": {side: resolved(m.files) for side, m in loaded.items()},
            "embed_model": resolved(embedder.files) if embedder is not None else None,
            "data_files": resolved(data_files), "qa_files": resolved(qa_files), **options,
            "package_version": __version__}


def min_k_method(k: float) -> str:
    """The mia_jax method name of Min-K% at ``k`` (``min_k@0.2``)."""
    from mia_jax.scorers import expand_methods

    return expand_methods(["min_k"], [k])[0]
