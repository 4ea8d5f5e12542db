"""Copyright traps (Meeus et al. 2024, "Copyright Traps for Large Language Models", ICML): synthetic sequences
sampled from a reference model, binned by that model's perplexity, of controlled length in tokens; some are
inserted 1, 4, 16 or 64 times into the continued-pretraining corpus (the members), the others never (the
non-members). Members and non-members come from the same generator and are stratified on (length, perplexity bin),
so nothing but training can tell them apart: the blind bag-of-words baseline is ~0.5 by construction (measured in
every run's tables).

Following the authors' ``src/scripts/gen_traps.py`` (github.com/computationalprivacy/copyright-traps):

- sequences are sampled from the start of a document (the authors: from BOS; here from the corpus's document
  separator, ``<|endoftext|>`` for SmolLM2, which has no BOS) at a cycle of temperatures (``traps.temperatures``;
  the authors: 0.5 to 4 by 0.5), exactly ``length`` new tokens each;
- the length is exact in the tokens of the text as the tokenizer encodes it (the authors' ``--retokenize`` keeps the
  samples whose re-encoded ids equal the generated ones): here each sample runs a margin past ``length`` tokens,
  its text is re-encoded and cut to the first ``length`` tokens, and it is kept when the cut text re-encodes to
  exactly those tokens (the inserted and scored text is then ``length`` tokens long; a sample that stops early at
  EOS is dropped);
- near-duplicates are dropped: a sample whose token set has a Jaccard similarity above ``traps.jaccard`` (the
  authors' default 0.2) with an earlier kept sample of any length;
- each kept sample's perplexity under the reference model decides its bin.

Where this differs:

- **the generator**: the authors sampled with a separate, larger model (LLaMA-2-7B) and inserted the traps into the
  training of another model (CroissantLLM); here the reference model is the base model that is then trained
  (SmolLM2-135M, the offline model): the traps are the base model's own likely text, so the base model's loss
  scores them all low and its low-perplexity bin is text it already predicts well. A separate generator would make
  the traps' perplexity under the trained model's starting point differ from their perplexity under the generator;
  here the two are the same model, and the bins are exactly the base model's perplexity.
- **the bins**: the authors sample until each integer perplexity in [1, 100] holds the same number of traps and
  group them in fixed ranges (1-11, 11-21, ...). Here the bins are equal-count quantiles of the generated pool's
  perplexity per length (``traps.bins``: 3 = low / mid / high); the manifest records each bin's perplexity range.
- **the perplexity**: the reference model's loss of the trap text as the run scores it (``runner.score_texts``,
  the ``loss`` method: the text read as a document start, so with no BOS its first token is not predicted), not the
  authors' loss from BOS over all the tokens.
- **the repetitions**: the authors inserted traps 1, 10, 100 and 1000 times into a 3-trillion-token corpus; here 1,
  4, 16 or 64 times into a corpus of ~10^5 tokens (``corpus.occurrence_buckets``), so a trap is a far larger share.

The pool (every sample kept, with its temperature, perplexity and bin) is written once to
``<run>/traps/pool.jsonl`` and reused on resume; the split into members and non-members is train/corpus.py's
(``_choose_traps``): the pool's 13-gram isolation against the background, then :func:`balanced` picks the same
number of traps in every (length, bin) stratum, and ``split.split`` halves each stratum.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from mia_jax.engine import runner
from mia_jax.errors import UserError
from mia_jax.engine.generate import sample_completions
from train.config import CorpusConfig, TrapsConfig
from train.sources import Example

DATASET = "traps"
BIN_NAMES = {1: ["all"], 2: ["low", "high"], 3: ["low", "mid", "high"], 4: ["low", "mid-low", "mid-high", "high"]}
POOL = "pool.jsonl"


def bin_names(n: int) -> list[str]:
    """The names of ``n`` perplexity bins, lowest first (``b1`` ... beyond 4)."""
    return BIN_NAMES.get(n, [f"b{i + 1}" for i in range(n)])


def stratum(length: int, bin_name: str) -> str:
    """The (length, bin) stratum of a trap as its eval record names it: ``"24/low"``."""
    return f"{length}/{bin_name}"


def parse_stratum(value: str) -> tuple[int, str]:
    """(length, bin name) of a stratum written by :func:`stratum`."""
    length, bin_name = value.split("/", 1)
    return int(length), bin_name


def members_per_stratum(cfg: CorpusConfig) -> int:
    """Members of each (length, bin) stratum: ``traps.per_cell`` per insertion count (as many non-members)."""
    return cfg.traps.per_cell * len(cfg.occurrence_buckets)


def needed(cfg: CorpusConfig) -> int:
    """Traps (members + non-members) of each (length, bin) stratum."""
    return 2 * members_per_stratum(cfg)


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b| of two token sets."""
    return len(a & b) / max(1, len(a | b))


def _cut(tokenizer, text: str, length: int) -> tuple[list[int], str | None]:
    """(the first ``length`` ids of ``text`` as the tokenizer encodes it, None) when their decoded text encodes to
    exactly those ids again; ([], reason) otherwise (``short``: fewer tokens; ``retokenized_length``: the cut text
    re-encodes otherwise)."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:length] if text.strip() else []
    if len(ids) < length:
        return [], "short"
    again = tokenizer.encode(tokenizer.decode(ids, skip_special_tokens=True), add_special_tokens=False).ids
    return (ids, None) if again == ids else ([], "retokenized_length")


def _sample_length(loaded, tcfg: TrapsConfig, length: int, prompt: list[int], n: int, progress: bool) -> list[dict]:
    """``n`` samples of ``length`` new tokens at each temperature: [{"length", "temperature", "sample", "ids"}]
    (ids of the samples of exactly ``length`` tokens, EOS not reached)."""
    out = []
    per_prompt = max(1, tcfg.batch_size)
    n_prompts = -(-n // per_prompt)
    for t in tcfg.temperatures:
        keys = [f"trap length {length} temperature {t:g} prompt {p}" for p in range(n_prompts)]
        budget = length + length // 4 + 4  # a margin: the text is re-encoded, then cut to `length` tokens (_cut)
        texts, counts = sample_completions(loaded, [prompt] * n_prompts, [budget] * n_prompts, keys,
                                           n_samples=per_prompt, temperature=float(t), seed=tcfg.seed,
                                           batch_size=1, progress=progress, desc=f"traps {length} t={t:g}")
        for p in range(n_prompts):
            for j, (text, k) in enumerate(zip(texts[p], counts[p])):
                out.append({"length": length, "temperature": float(t), "sample": p * per_prompt + j, "text": text,
                            "generated": int(k)})
    return out


def generate_pool(loaded, cfg: CorpusConfig, separator: int, progress: bool = True) -> tuple[list[dict], dict]:
    """Every kept trap sample (see the module docstring) with its perplexity and bin, and the generation record
    (samples drawn, dropped by reason, bin edges per length). Seeded by ``traps.seed``: the same call gives the
    same pool."""
    tcfg = cfg.traps
    names = bin_names(tcfg.bins)
    want = tcfg.oversample * tcfg.bins * needed(cfg)
    kept, seen_sets = [], []
    record = {"drawn": 0, "dropped": {"short": 0, "retokenized_length": 0, "near_duplicate": 0},
              "lengths": {}}
    for length in tcfg.lengths:
        n = -(-want // len(tcfg.temperatures))
        for s in _sample_length(loaded, tcfg, length, [separator], n, progress):
            record["drawn"] += 1
            ids, reason = _cut(loaded.tokenizer, s["text"], length)
            if reason is None and any(jaccard(set(ids), other) > tcfg.jaccard or set(ids) == other
                                      for other in seen_sets):
                reason = "near_duplicate"
            if reason is not None:
                record["dropped"][reason] += 1
                continue
            s["text"] = loaded.tokenizer.decode(ids, skip_special_tokens=True)
            seen_sets.append(set(ids))
            kept.append(s)
    if not kept:
        raise UserError("the trap generator kept no sample (all too short, re-tokenized to another length or "
                        "near-duplicates); raise corpus.traps.oversample or change corpus.traps.temperatures")
    recs = runner.score_texts(loaded, [s["text"] for s in kept], ["loss"], progress=False)
    for s, r in zip(kept, recs):
        loss = r["scores"]["loss"]
        # the `loss` score is the negated mean token loss (higher: more likely a member)
        s["ppl"] = float(math.exp(-loss)) if loss is not None and np.isfinite(loss) else None
    kept = [s for s in kept if s["ppl"] is not None]
    for length in tcfg.lengths:
        mine = [s for s in kept if s["length"] == length]
        ppl = np.array([s["ppl"] for s in mine], np.float64)
        edges = np.quantile(ppl, np.linspace(0, 1, tcfg.bins + 1)) if len(ppl) else np.zeros(tcfg.bins + 1)
        for s in mine:
            b = min(int(np.searchsorted(edges[1:-1], s["ppl"], side="right")), tcfg.bins - 1)
            s["bin"] = names[b]
        record["lengths"][str(length)] = {
            "kept": len(mine), "bin_edges_ppl": [float(e) for e in edges],
            "per_bin": {nm: sum(1 for s in mine if s["bin"] == nm) for nm in names}}
    for i, s in enumerate(kept):
        s["id"] = f"trap-{s['length']}-{i:05d}"
    return kept, record


def examples(pool: list[dict]) -> list[Example]:
    """The pool's traps as corpus examples (dataset ``traps``, stratum ``length/bin``)."""
    return [Example(DATASET, s["id"], s["text"], s["text"], {"text": s["text"]}, stratum(s["length"], s["bin"]), i)
            for i, s in enumerate(pool)]


def balanced(cands: list[Example], cfg: CorpusConfig, rng) -> list[Example]:
    """Exactly :func:`needed` traps of every (length, bin) stratum, a seeded sample of its candidates (in pool
    order); UserError naming the stratum when one has too few."""
    out = []
    for length in cfg.traps.lengths:
        for name in bin_names(cfg.traps.bins):
            group = [e for e in cands if e.stratum == stratum(length, name)]
            if len(group) < needed(cfg):
                raise UserError(f"traps: stratum length {length}, perplexity bin {name} has {len(group)} usable "
                                f"traps, {needed(cfg)} needed; raise corpus.traps.oversample or lower "
                                "corpus.traps.per_cell")
            out += [group[i] for i in sorted(rng.choice(len(group), needed(cfg), replace=False))]
    return sorted(out, key=lambda e: e.index)


def trap_pool(loaded, cfg: CorpusConfig, separator: int, folder: Path, progress: bool = True) -> tuple[list, dict]:
    """(examples, generation record) of the run's trap pool: read from ``folder/pool.jsonl`` when it was generated
    with the same traps config, else generated (:func:`generate_pool`) and written there."""
    path = Path(folder) / POOL
    want = {"traps": dataclasses.asdict(cfg.traps), "occurrence_buckets": list(cfg.occurrence_buckets),
            "model_files": getattr(loaded, "files", None), "separator": separator}
    want = json.loads(json.dumps(want, default=str))
    if path.is_file():
        head, *rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if head.get("config") == want:
            return examples(rows), head["record"]
    pool, record = generate_pool(loaded, cfg, separator, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in [{"config": want, "record": record}, *pool]),
                   encoding="utf-8")
    tmp.replace(path)
    return examples(pool), record
