"""Auditing machine unlearning with Min-K% Prob (Shi et al. 2023, *Detecting Pretraining Data from Large Language
Models*, section 7): which texts of a forget set does an "unlearned" model still know?

1. The forget-set texts are cut into ``chunk_words``-word chunks (``common.chunk_words``: verbatim, from a chunk's first
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
   from each model (``mia_jax.engine.generate``, sample j of a chunk drawn with ``row_keys(seed, text_hash(prompt), j)``
   under *both* models: paired draws) and compared with the true continuation by ROUGE-L F-measure (rouge-score's
   ``RougeScorer(['rougeL'])``: lowercased, non-alphanumerics dropped, no stemming), and, with a sentence encoder
   (``embed_model``, e.g. all-MiniLM-L6-v2), by the cosine similarity of mean-pooled, L2-normalised embeddings (the
   sentence-transformers recipe). Max and mean over the samples, under each model.
4. Optional QA probes: questions scored with Min-K% under both models and flagged by the same window; a greedy
   answer per question from each model (prompt ``"Question: {q}\\nAnswer:"``, its first non-empty line), ROUGE-L
   recall of the gold answer; mean recall of flagged vs other questions.

Outputs (``unlearning_report.write_outputs``): unlearning.md, unlearning.json, chunks.csv (per chunk: its place, q
under both models, ratios, flags), ratios.png and probes.jsonl (per probe: prompt, reference, every sample, its
ROUGE-L F and cosine similarity). Everything after scoring and generation (ratios, flags, their counts, the probe
and QA summaries) is ``analyse``; ``unlearning_rebuild.rebuild`` (``--from DIR``) feeds it the per-example values
of an output folder and so recomputes the same report without the models.

The parts: this module (the audit: its settings, chunks, scoring, ratios and analysis), ``unlearning_probes``
(steps 3-4: sampling, story completion, QA), ``unlearning_report`` (the outputs), ``unlearning_rebuild`` (reading
an output folder back) and the command, ``mia_jax.commands.audit_unlearning``.

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

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from mia_jax.audits.common import chunk_words, finite_or_none, score_texts
from mia_jax.audits.unlearning_probes import (N_SAMPLES, PROMPT_WORDS, QA_MAX_NEW_TOKENS, qa_probes,
                                              story_completion)
from mia_jax.errors import UserError
from mia_jax.engine.generate import check_sampling
from mia_jax.scorers import expand_methods

CHUNK_WORDS = 512
MIN_WORDS = 32
K = 0.2
RATIO = 1.15
MAX_PROBE = 50
SIDES = ("original", "unlearned")


def score_ratio(original, unlearned) -> np.ndarray:
    """float64 [N]: q(unlearned) / q(original) with q = -score (the paper's positive Min-K% NLL or perplexity from
    mia_jax's scores ``original`` / ``unlearned``, oriented higher = member); NaN where either q is not finite and
    positive."""
    qo, qu = -np.asarray(original, np.float64), -np.asarray(unlearned, np.float64)
    ok = np.isfinite(qo) & np.isfinite(qu) & (qo > 0) & (qu > 0)
    out = np.full(qo.shape, np.nan)
    out[ok] = qu[ok] / qo[ok]
    return out


def ratio_flags(original, unlearned, ratio: float = RATIO) -> tuple[np.ndarray, np.ndarray]:
    """(ratios, flags) of the scores ``original`` / ``unlearned``: ``score_ratio`` and bool [N], True where
    1/ratio < ratios < ratio (open; NaN: False)."""
    if not ratio > 1:
        raise UserError(f"the ratio window (1/r, r) needs r > 1, got {ratio}")
    r = score_ratio(original, unlearned)
    with np.errstate(invalid="ignore"):
        return r, (r > 1 / ratio) & (r < ratio)


def tokenizer_digest(loaded) -> str:
    """SHA-256 (hex) of the vocabulary (token -> id) and BOS policy of ``loaded`` (a ``LoadedModel``): equal digests
    tokenize alike."""
    blob = json.dumps([sorted(loaded.tokenizer.get_vocab().items()), loaded.add_bos], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _stats(x) -> tuple[float, float]:
    """(max, mean) of the values ``x`` (NaN, NaN when there are none)."""
    x = np.asarray(x, np.float64)
    return (float(x.max()), float(x.mean())) if x.size else (math.nan, math.nan)


# ----------------------------------------------------------------------------- the audit

@dataclass(frozen=True)
class UnlearningConfig:
    """The settings of an audit (``mia-jax audit-unlearning``' options of the same names; ``max_new_tokens`` None:
    the true continuation's length, at most ``MAX_NEW_TOKENS``)."""
    chunk_words: int = CHUNK_WORDS
    min_words: int = MIN_WORDS
    k: float = K
    ratio: float = RATIO
    max_probe: int = MAX_PROBE
    prompt_words: int = PROMPT_WORDS
    n_samples: int = N_SAMPLES
    max_new_tokens: int | None = None
    temperature: float = 1.0
    top_k: int | None = None
    seed: int = 0
    batch_size: int = 8
    chunk_size: int | None = None  # None: stats.default_chunk()
    qa_max_new_tokens: int = QA_MAX_NEW_TOKENS


@dataclass
class Chunk:
    """A piece of a forget-set text: where it is and (when the audit cut it, not a rebuild) its text."""
    source: int  # index of its text in the input file
    position: int  # its place among the text's chunks
    word_offset: int
    n_words: int
    text: str


@dataclass
class UnlearningResult:
    """An audit's result: what ``unlearning_report`` writes and ``unlearning_rebuild`` reads back."""
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


def make_chunks(texts: Sequence[str], n_words: int, min_words: int) -> tuple[list[Chunk], dict]:
    """(chunks, counts): every one of ``texts`` cut into ``n_words``-word chunks (``common.chunk_words``; a last
    piece under ``min_words`` dropped) and the counts of what was dropped."""
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


def check_options(cfg: UnlearningConfig) -> None:
    """UserError for a setting of ``cfg`` out of range (before anything is loaded or written)."""
    chunk_words, min_words, k, ratio = cfg.chunk_words, cfg.min_words, cfg.k, cfg.ratio
    max_probe, prompt_words, n_samples, batch_size = cfg.max_probe, cfg.prompt_words, cfg.n_samples, cfg.batch_size

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
    check_sampling(cfg.max_new_tokens or 1, cfg.temperature, cfg.top_k, None)
    if cfg.qa_max_new_tokens < 1:
        raise UserError(f"--qa-max-new-tokens must be >= 1, got {cfg.qa_max_new_tokens}")


def audit_unlearning(original, unlearned, texts: Sequence[str], cfg: UnlearningConfig = UnlearningConfig(), *,
                     qa: tuple[Sequence[str], Sequence[str]] | None = None, embedder=None,
                     run_dirs: dict | None = None, resume: dict | None = None,
                     progress: bool = True) -> UnlearningResult:
    """The audit of the module docstring. ``original`` / ``unlearned``: ``LoadedModel``s; ``texts``: the forget set;
    ``cfg``: the settings; ``qa``: (questions, answers); ``embedder``: a ``SentenceEncoder``; ``run_dirs`` /
    ``resume``: {side: folder / bool} of each model's scoring run (``runner.score_dataset``'s ``out_dir``; claimed
    by the caller); ``progress``: progress bars. Returns the result."""
    check_options(cfg)
    chunks, counts = make_chunks(texts, cfg.chunk_words, cfg.min_words)
    if not chunks:
        raise UserError(f"no chunks: none of the {len(texts)} texts has {cfg.min_words} words (--min-words)")
    methods = {"min_k": min_k_method(cfg.k), "ppl": "ppl"}
    models = {"original": original, "unlearned": unlearned}
    run_dirs, resume = run_dirs or {}, resume or {}
    scores, records = {}, {}
    for side in SIDES:
        by_method, records[side] = score_texts(models[side], [c.text for c in chunks], list(methods.values()),
                                               run_dirs.get(side), resume.get(side, False), cfg.batch_size,
                                               cfg.chunk_size, progress, f"scoring ({side})")
        scores[side] = {name: by_method[m] for name, m in methods.items()}
    truncated = {f"truncated_{side}": sum(1 for r in records[side] if r.get("truncated")) for side in SIDES}
    same_tok = tokenizer_digest(original) == tokenizer_digest(unlearned)
    config = dict(chunk_words=cfg.chunk_words, min_words=cfg.min_words, k=cfg.k, ratio=cfg.ratio,
                  max_probe=cfg.max_probe, prompt_words=cfg.prompt_words, n_samples=cfg.n_samples,
                  max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k, seed=cfg.seed,
                  same_tokenizer=same_tok)
    res = analyse(chunks, methods, scores, counts, config, _scoring_notes(models, truncated, same_tok))
    res.counts.update(truncated)
    probes, probe_counts = story_completion([c.text for c in chunks], res.ratios["min_k"], res.flags["min_k"],
                                            models, embedder, config, batch_size=cfg.batch_size, progress=progress)
    res.counts.update(probe_counts)
    res.probes = [probe_summary(p) for p in probes]
    if qa is not None:
        res.qa = qa_summary(qa_probes(models, qa, method=methods["min_k"], max_new_tokens=cfg.qa_max_new_tokens,
                                      batch_size=cfg.batch_size, chunk_size=cfg.chunk_size, progress=progress),
                            cfg.ratio, methods["min_k"])
    return res


def _scoring_notes(models: dict, truncated: dict, same_tokenizer: bool) -> list[str]:
    """The notes on scoring: chunks truncated to a model's context; models that tokenize differently."""
    notes = []
    trunc = {side: (truncated[f"truncated_{side}"], models[side].max_length) for side in SIDES}
    for who, (n, ctx) in ([("either model's", trunc["original"])] if trunc["original"] == trunc["unlearned"]
                          else [(f"the {side} model's", trunc[side]) for side in SIDES]):
        if n:
            notes.append(f"Note: {n} chunks are longer than {who} context of {ctx} tokens and were scored on their "
                         "first tokens only.")
    if not same_tokenizer:
        notes.append("Note: the two models tokenize differently; Min-K% and PPL are per-chunk quantities, so the "
                     "ratio is defined, but the per-token scores behind them are over different tokens.")
    return notes


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


PER_SAMPLE = ("rougeL", "embed")  # per-sample ROUGE-L F / embedding cosine similarity of a probe


def probe_summary(probe: dict) -> dict:
    """A story-completion probe (``chunk``, ``prompt``, ``reference``, ``samples``, ``rougeL_per_sample`` and
    optionally ``embed_per_sample``: {side: [value per sample]}) with, for each kind, ``{kind}_{side}`` = the max
    and mean over the samples. The keys in a fixed order (the same file whether written by the audit or rebuilt)."""
    out = {k: probe[k] for k in ("chunk", "prompt", "reference")}
    kinds = [kind for kind in PER_SAMPLE if f"{kind}_per_sample" in probe]
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
                         "ratio": finite_or_none(ratios[i]), "flagged": bool(flags[i]),
                         **{f"answer_{s}": q[f"answer_{s}"] for s in SIDES},
                         **{f"recall_{s}": q[f"recall_{s}"] for s in SIDES}} for i, q in enumerate(questions)]
    return out


def min_k_method(k: float) -> str:
    """The mia_jax method name of Min-K% at ``k`` (``min_k@0.2``)."""
    return expand_methods(["min_k"], [k])[0]
