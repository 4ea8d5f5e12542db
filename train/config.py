"""Experiment configs: dataclasses loaded from YAML, with ``key=value`` overrides from the command line.

A config file holds the sections below (every field has a default, so a file names only what it changes)::

    model:    which base model to continue pretraining (``tiny``, a HF folder, a .gguf, ``smollm2``)
    corpus:   the contaminated corpus (train/corpus.py)
    train:    the Optax trainer (train/trainer.py)
    score:    the detectors run before and after training
    ablation: the values each ``--ablation`` sweep takes

Overrides use dotted names and YAML values: ``train.lr=1e-5 corpus.n_positives=20 score.k=[0.1,0.2]``.
Unknown names are refused (with the known ones listed), so a typo never silently does nothing; every value, from
the file or an override, is converted to its field's type or refused with the key, the value and the type
expected (``override train.batch_size=abc: expected an int``).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mia_jax.errors import UserError
from mia_jax.metrics import MIN_PER_CLASS
from train.config_parse import apply_override, build, read_sections

DOWNSTREAM = ("boolq", "commonsenseqa", "imdb", "truthfulqa")


@dataclass
class TinyModelConfig:
    """A randomly initialised Llama (train/tiny.py) with a byte-level BPE tokenizer trained on the bundled text."""

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 256
    init_std: float = 0.02
    seed: int = 0


@dataclass
class ModelConfig:
    """The base model: ``path``, the load ``dtype`` and the ``tiny`` model's config."""
    path: str = "tiny"  # "tiny" | a Hugging Face folder | a .gguf file | a packaged name ("smollm2")
    dtype: str = "float32"  # dtype of the loaded base model (training keeps float32 master weights anyway)
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)


@dataclass
class NewsConfig:
    """The in-distribution variant (Figure 5b): news positives inserted into a corpus of more news."""

    path: str = "bundled:news2023_sample.jsonl"
    n_positives: int = 100
    n_negatives: int = 100
    n_background: int = 400  # news articles forming the corpus besides the positives


@dataclass
class TrapsConfig:
    """The copyright-trap variant (train/traps.py): trap lengths, perplexity bins, traps per cell, generation."""

    lengths: list[int] = field(default_factory=lambda: [24, 48])  # tokens per trap
    bins: int = 3  # equal-count perplexity bins per length (low / mid / high)
    per_cell: int = 4  # members per (length, bin, insertion count); as many non-members per (length, bin)
    temperatures: list[float] = field(default_factory=lambda: [0.5, 1.0, 1.5, 2.0])
    oversample: int = 3  # samples drawn per length: oversample x bins x traps needed per stratum
    jaccard: float = 0.2  # a sample sharing more of its token set with an earlier one is a near-duplicate
    batch_size: int = 32  # samples per generation call
    seed: int = 0


@dataclass
class CorpusConfig:
    """The contaminated corpus: its variant, background, downstream data, members and non-members, occurrences."""
    variant: str = "downstream"  # "downstream" (Table 3/4/7, Figure 5a/5c) | "news" (Figure 5b) | "traps"
    background: list[str] = field(default_factory=lambda: ["bundled:pile_sample.jsonl"])
    background_tokens: int = 180_000  # background documents are taken (seeded order) until this many tokens
    max_doc_chars: int | None = None  # cut longer background documents at a whitespace before this many characters
    data_dir: str = "bundled"  # folder with the downstream files (DATA.md names), or "bundled" (train/data)
    datasets: list[str] = field(default_factory=lambda: list(DOWNSTREAM))
    n_positives: int = 100  # per dataset, inserted into the corpus
    n_negatives: int = 100  # per dataset, held out (never inserted)
    # "fixed": each positive `occurrences` times | "poisson": k ~ Poisson(lambda), k >= 1 | "buckets": the positives
    # dealt evenly (stratified by label and length) over `occurrence_buckets`, a member of bucket k inserted k times
    occurrence: str = "fixed"
    occurrences: int = 1
    poisson_lambda: float = 2.0
    occurrence_buckets: list[int] = field(default_factory=lambda: [1, 2, 4])
    seed: int = 0
    news: NewsConfig = field(default_factory=NewsConfig)
    traps: TrapsConfig = field(default_factory=TrapsConfig)  # variant "traps" (train/traps.py)


@dataclass
class TrainConfig:
    """Continued pretraining: sequence length, batch, optimiser, schedule, checkpoints, mesh and memory options."""
    seq_len: int = 512  # tokens per packed sequence (documents separated by the EOS token)
    batch_size: int = 8  # sequences per optimizer step
    grad_accum: int = 1  # micro-batches per step (batch_size must be a multiple)
    lr: float = 1e-4
    schedule: str = "constant"  # "constant" | "cosine" (both with `warmup_steps` of linear warm-up)
    # "lm": minimise the next-token loss (continued pretraining) | "ascent": maximise it, i.e. gradient ascent on the
    # corpus, the simplest unlearning recipe (the audit-unlearning demonstration's "unlearned" model)
    objective: str = "lm"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # cosine: final lr / peak lr
    weight_decay: float = 0.0  # AdamW decay on matrices (ndim >= 2) only
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0  # None: no clipping
    compute_dtype: str = "float32"  # "float32" | "bfloat16" (master weights stay float32)
    remat: str = "none"  # "none" | "layer": recompute each decoder layer's activations in the backward pass
    loss_chunk: int = 8192  # vocabulary rows per chunk of the cross-entropy (the [B, T, V] logits never exist)
    mesh: str | None = None  # device mesh, as `mia-jax --mesh`: "data=8", "fsdp=4,model=2"; None: every device on data
    epochs: int = 1
    shuffle: bool = True  # shuffle the order of packed sequences (seeded)
    seed: int = 0
    checkpoint_every: int = 50  # optimizer steps; 0: only at the end
    keep_checkpoints: int = 2
    separator: str = "auto"  # document separator: "auto" (<|endoftext|> if the vocabulary has it, else EOS) or a token
    progress: bool = True
    # one device's peak TFLOP/s in the compute dtype (e.g. 989: an H100 SXM's dense bfloat16): speed.jsonl's MFU
    # (train/speed.py) is against this x the mesh's devices; None: no MFU. Display only (not in the fingerprint)
    peak_tflops: float | None = None
    # the order of the packed sequences (train/data.py): "grain" (grain's IndexSampler, seeded global shuffle) or
    # "numpy" (the per-epoch NumPy permutation of the runs made before grain, e.g. results/contamination/)
    sampler: str = "grain"


@dataclass
class ScoreConfig:
    """Scoring: the methods, Min-K% ``k``, batch size, bootstrap and neighbour settings."""
    methods: list[str] = field(default_factory=lambda: [
        "loss", "ppl", "zlib", "min_k", "min_k_pp", "max_k", "entropy", "rank", "lowercase", "ref"])
    k: list[float] = field(default_factory=lambda: [0.2])
    batch_size: int = 8
    n_bootstrap: int = 1000
    seed: int = 0
    n_neighbors: int = 10  # neighbours per text of the `neighbor` method (as `mia-jax eval --n-neighbors`)


@dataclass
class AblationConfig:
    """The values each ablation sweeps over."""
    lrs: list[float] = field(default_factory=lambda: [1e-5, 1e-4])  # Table 4
    background_tokens: list[int] = field(default_factory=lambda: [60_000, 180_000, 540_000])  # Figure 5a
    news_background: list[int] = field(default_factory=lambda: [100, 300, 600])  # Figure 5b (articles)


@dataclass
class ExperimentConfig:
    """One contamination experiment: name, model, corpus, train, score and ablation sections."""
    name: str = "contamination"
    model: ModelConfig = field(default_factory=ModelConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)

    def to_dict(self) -> dict:
        """The config as nested dicts."""
        return dataclasses.asdict(self)


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The config in ``path`` (YAML) with ``overrides`` (``a.b=value``) applied; defaults when ``path`` is None.

    Every value is converted to its field's type (see ``config_parse``) or refused, like an unknown key, with one
    line naming the file or the override, the key, the value and the type expected."""
    data, head = read_sections(path)
    cfg = build(ExperimentConfig, data, "", head)
    for item in overrides:
        apply_override(cfg, item)
    validate(cfg)
    return cfg


def validate(cfg: ExperimentConfig) -> None:
    """UserError (one line) for a value of the right type that cannot work: every check of a config that needs no
    data nor model. Members and non-members per dataset must be at least ``metrics.MIN_PER_CLASS``: with fewer,
    every table cell would be n/a (an AUROC of 3 members against 3 non-members is 1.000 by chance far too often)."""
    t, c, s, a = cfg.train, cfg.corpus, cfg.score, cfg.ablation
    n_pos = c.news.n_positives if c.variant == "news" else c.n_positives
    sizes = [("corpus.n_positives", c.n_positives), ("corpus.n_negatives", c.n_negatives)]
    if c.variant == "news":
        sizes = [("corpus.news.n_positives", c.news.n_positives), ("corpus.news.n_negatives", c.news.n_negatives)]
    few = next(((k, v) for k, v in sizes if v < MIN_PER_CLASS), None)
    checks = [
        (t.warmup_steps >= 0, f"train.warmup_steps must be >= 0, got {t.warmup_steps}"),
        (0 <= t.min_lr_ratio <= 1, f"train.min_lr_ratio must be in [0, 1], got {t.min_lr_ratio}"),
        (t.weight_decay >= 0, f"train.weight_decay must be >= 0, got {t.weight_decay}"),
        (0 <= t.b1 < 1 and 0 <= t.b2 < 1, f"train.b1 and train.b2 must be in [0, 1), got {t.b1}, {t.b2}"),
        (t.eps > 0, f"train.eps must be positive, got {t.eps}"),
        (t.max_grad_norm is None or t.max_grad_norm > 0,
         f"train.max_grad_norm must be positive or null (no clipping), got {t.max_grad_norm}"),
        (t.keep_checkpoints >= 1, f"train.keep_checkpoints must be at least 1, got {t.keep_checkpoints}"),
        (t.peak_tflops is None or t.peak_tflops > 0,
         f"train.peak_tflops must be positive or null (no MFU), got {t.peak_tflops}"),
        (min(t.seed, c.seed, s.seed, cfg.model.tiny.seed) >= 0,
         f"seeds must be >= 0, got train.seed={t.seed}, corpus.seed={c.seed}, score.seed={s.seed}, "
         f"model.tiny.seed={cfg.model.tiny.seed}"),
        (s.batch_size >= 1, f"score.batch_size must be at least 1, got {s.batch_size}"),
        (s.n_bootstrap >= 1, f"score.n_bootstrap must be at least 1, got {s.n_bootstrap}"),
        (bool(s.methods), "score.methods is empty: name at least one method"),
        (bool(s.k) and all(0 < k <= 1 for k in s.k), f"score.k must be fractions in (0, 1], got {s.k}"),
        (c.max_doc_chars is None or c.max_doc_chars >= 1,
         f"corpus.max_doc_chars must be at least 1 or null, got {c.max_doc_chars}"),
        (c.news.n_background >= 0, f"corpus.news.n_background must be >= 0, got {c.news.n_background}"),
        (bool(c.datasets), "corpus.datasets is empty: name at least one downstream dataset"),
        (all(v > 0 for v in a.lrs) and bool(a.lrs), f"ablation.lrs must be positive learning rates, got {a.lrs}"),
        (all(v >= 0 for v in a.background_tokens) and bool(a.background_tokens),
         f"ablation.background_tokens must be token counts >= 0, got {a.background_tokens}"),
        (all(v >= 0 for v in a.news_background) and bool(a.news_background),
         f"ablation.news_background must be article counts >= 0, got {a.news_background}"),
        (all(v >= 1 for v in dataclasses.astuple(cfg.model.tiny)[:7]),
         "model.tiny sizes (vocab_size ... max_position_embeddings) must be at least 1"),
        (cfg.model.tiny.init_std > 0, f"model.tiny.init_std must be positive, got {cfg.model.tiny.init_std}"),
        (t.seq_len >= 2, f"train.seq_len must be at least 2, got {t.seq_len}"),
        (t.batch_size >= 1, f"train.batch_size must be at least 1, got {t.batch_size}"),
        (t.grad_accum >= 1 and t.batch_size % t.grad_accum == 0,
         f"train.batch_size ({t.batch_size}) must be a positive multiple of train.grad_accum ({t.grad_accum})"),
        (t.lr > 0, f"train.lr must be positive, got {t.lr}"),
        (t.schedule in ("constant", "cosine"), f"train.schedule must be 'constant' or 'cosine', got {t.schedule!r}"),
        (t.objective in ("lm", "ascent"), f"train.objective must be 'lm' or 'ascent', got {t.objective!r}"),
        (t.compute_dtype in ("float32", "bfloat16"),
         f"train.compute_dtype must be 'float32' or 'bfloat16', got {t.compute_dtype!r}"),
        (cfg.score.n_neighbors >= 1, f"score.n_neighbors must be at least 1, got {cfg.score.n_neighbors}"),
        (t.remat in ("none", "layer"), f"train.remat must be 'none' or 'layer', got {t.remat!r}"),
        (t.loss_chunk >= 1, f"train.loss_chunk must be at least 1, got {t.loss_chunk}"),
        (t.epochs >= 1, f"train.epochs must be at least 1, got {t.epochs}"),
        (t.checkpoint_every >= 0, f"train.checkpoint_every must be >= 0, got {t.checkpoint_every}"),
        (t.sampler in ("grain", "numpy"), f"train.sampler must be 'grain' or 'numpy', got {t.sampler!r}"),
        (t.seed < 2**32, f"train.seed must be below 2**32 (grain's shuffle), got {t.seed}"),
        (c.variant in ("downstream", "news", "traps"),
         f"corpus.variant must be 'downstream', 'news' or 'traps', got {c.variant!r}"),
        (bool(c.traps.lengths) and min(c.traps.lengths) >= 2 and c.traps.bins >= 1 and c.traps.per_cell >= 1
         and c.traps.oversample >= 1 and c.traps.batch_size >= 1 and bool(c.traps.temperatures)
         and min(c.traps.temperatures) > 0 and 0 < c.traps.jaccard <= 1,
         f"corpus.traps: lengths >= 2, bins, per_cell, oversample, batch_size >= 1, temperatures > 0 and jaccard in "
         f"(0, 1] needed, got {c.traps}"),
        (c.occurrence in ("fixed", "poisson", "buckets"),
         f"corpus.occurrence must be 'fixed', 'poisson' or 'buckets', got {c.occurrence!r}"),
        (bool(c.occurrence_buckets) and all(k >= 1 for k in c.occurrence_buckets)
         and len(set(c.occurrence_buckets)) == len(c.occurrence_buckets),
         f"corpus.occurrence_buckets must be distinct occurrence counts >= 1, got {c.occurrence_buckets}"),
        (c.occurrence != "buckets" or n_pos >= len(c.occurrence_buckets),
         f"corpus.occurrence=buckets needs at least one positive per bucket: {len(c.occurrence_buckets)} buckets "
         f"({c.occurrence_buckets}) but {n_pos} positives per dataset"),
        (c.occurrences >= 1, f"corpus.occurrences must be at least 1, got {c.occurrences}"),
        (c.poisson_lambda > 0, f"corpus.poisson_lambda must be positive, got {c.poisson_lambda}"),
        (c.n_positives >= 1 and c.n_negatives >= 1,
         f"corpus.n_positives and corpus.n_negatives must be at least 1, got {c.n_positives}, {c.n_negatives}"),
        (c.background_tokens >= 0, f"corpus.background_tokens must be >= 0, got {c.background_tokens}"),
        (all(d in DOWNSTREAM for d in c.datasets), f"corpus.datasets must be among {DOWNSTREAM}, got {c.datasets}"),
        (few is None, f"{few[0]}={few[1]}: at least {MIN_PER_CLASS} members and {MIN_PER_CLASS} non-members per "
         "dataset are needed for an AUROC (metrics.MIN_PER_CLASS); with fewer every cell would be n/a" if few else ""),
    ]
    for ok, message in checks:
        if not ok:
            raise UserError(message)


def fingerprint(obj) -> str:
    """A stable JSON text of a config (section) for comparisons and hashes."""
    return json.dumps(dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj, sort_keys=True)
