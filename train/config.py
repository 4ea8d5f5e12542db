"""Experiment configs: pydantic dataclasses loaded from YAML, with ``key=value`` overrides from the command line.

A config file holds the sections below (every field has a default, so a file names only what it changes)::

    model:    which base model to continue pretraining (``tiny``, a HF folder, a .gguf, ``smollm2``)
    corpus:   the contaminated corpus (train/corpus.py)
    train:    the Optax trainer (train/trainer.py)
    score:    the detectors run before and after training
    ablation: the values each ``--ablation`` sweep takes

Overrides use dotted names and YAML values: ``train.lr=1e-5 corpus.n_positives=20 score.k=[0.1,0.2]``.
Unknown names are refused (with the closest and the known ones listed), so a typo never silently does nothing; every
value, from the file or an override, is converted to its field's type or refused with the key, the value and what is
expected (``override train.batch_size=abc: expected an int``, ``override train.remat=all: expected 'none' or
'layer'``).

The types are checked by pydantic v2 (``pydantic.dataclasses`` in lax mode: an integral float is an int, numeric text
a number, a number given to a text field its text; no NaN or infinity; a bool is never a number), the choices of a
key are ``Literal`` types, unknown keys are refused (``extra="forbid"``), and ``validate`` checks what
a type cannot say (ranges, one key against another). pydantic rather than draccus (levanter's): pydantic's
dataclasses stay standard dataclasses, so ``dataclasses.asdict`` -- run.json's config and every fingerprint made
from it -- gives what it gave before (runs made before still resume), and pydantic's structured errors (type,
location, input, a Literal's choices) make the one-line messages, with ``key=value`` overrides as before (draccus
parses ``--train.lr`` options and raises its own messages). train/config_parse.py reads the file and the overrides.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticKnownError

from mia_jax.errors import UserError
from mia_jax.evaluation.metrics import MIN_PER_CLASS
from train.config_parse import apply_override, read_sections, validated

Downstream = Literal["boolq", "commonsenseqa", "imdb", "truthfulqa"]
DOWNSTREAM = typing.get_args(Downstream)
DType = Literal["float32", "bfloat16"]

# every section: unknown keys refused, no NaN or infinity, a number given to a text field taken as its text
section = dataclass(config=ConfigDict(extra="forbid", allow_inf_nan=False, coerce_numbers_to_str=True))


def _not_a_bool(error: str) -> BeforeValidator:
    """pydantic's lax mode reads true as 1; a config value never means that: refused as ``error`` (its type)."""
    def check(value):
        if isinstance(value, bool):
            raise PydanticKnownError(error)
        return value
    return BeforeValidator(check)


Int = Annotated[int, _not_a_bool("int_type")]
Float = Annotated[float, _not_a_bool("float_type")]
EMPTY_IS_DEFAULT = BeforeValidator(lambda value: {} if value is None else value)  # ``train:`` with no keys


@section
class TinyModelConfig:
    """A randomly initialised Llama (train/tiny.py) with a byte-level BPE tokenizer trained on the bundled text."""

    vocab_size: Int = 512
    hidden_size: Int = 64
    intermediate_size: Int = 128
    num_hidden_layers: Int = 2
    num_attention_heads: Int = 4
    num_key_value_heads: Int = 2
    max_position_embeddings: Int = 256
    init_std: Float = 0.02
    seed: Int = 0


@section
class ModelConfig:
    """The base model: ``path``, the load ``dtype`` and the ``tiny`` model's config."""
    path: str = "tiny"  # "tiny" | a Hugging Face folder | a .gguf file | a packaged name ("smollm2")
    dtype: str = "float32"  # dtype of the loaded base model (training keeps float32 master weights anyway)
    tiny: Annotated[TinyModelConfig, EMPTY_IS_DEFAULT] = field(default_factory=TinyModelConfig)


@section
class NewsConfig:
    """The in-distribution variant (Figure 5b): news positives inserted into a corpus of more news."""

    path: str = "bundled:news2023_sample.jsonl"
    n_positives: Int = 100
    n_negatives: Int = 100
    n_background: Int = 400  # news articles forming the corpus besides the positives


@section
class TrapsConfig:
    """The copyright-trap variant (train/traps.py): trap lengths, perplexity bins, traps per cell, generation."""

    lengths: list[Int] = field(default_factory=lambda: [24, 48])  # tokens per trap
    bins: Int = 3  # equal-count perplexity bins per length (low / mid / high)
    per_cell: Int = 4  # members per (length, bin, insertion count); as many non-members per (length, bin)
    temperatures: list[Float] = field(default_factory=lambda: [0.5, 1.0, 1.5, 2.0])
    oversample: Int = 3  # samples drawn per length: oversample x bins x traps needed per stratum
    jaccard: Float = 0.2  # a sample sharing more of its token set with an earlier one is a near-duplicate
    batch_size: Int = 32  # samples per generation call
    seed: Int = 0


@section
class CorpusConfig:
    """The contaminated corpus: its variant, background, downstream data, members and non-members, occurrences."""
    variant: Literal["downstream", "news", "traps"] = "downstream"  # Table 3/4/7, Figure 5a/5c | Figure 5b | traps
    background: list[str] = field(default_factory=lambda: ["bundled:pile_sample.jsonl"])
    background_tokens: Int = 180_000  # background documents are taken (seeded order) until this many tokens
    max_doc_chars: Int | None = None  # cut longer background documents at a whitespace before this many characters
    data_dir: str = "bundled"  # folder with the downstream files (DATA.md names), or "bundled" (train/data)
    datasets: list[Downstream] = field(default_factory=lambda: list(DOWNSTREAM))
    n_positives: Int = 100  # per dataset, inserted into the corpus
    n_negatives: Int = 100  # per dataset, held out (never inserted)
    # "fixed": each positive `occurrences` times | "poisson": k ~ Poisson(lambda), k >= 1 | "buckets": the positives
    # dealt evenly (stratified by label and length) over `occurrence_buckets`, a member of bucket k inserted k times
    occurrence: Literal["fixed", "poisson", "buckets"] = "fixed"
    occurrences: Int = 1
    poisson_lambda: Float = 2.0
    occurrence_buckets: list[Int] = field(default_factory=lambda: [1, 2, 4])
    seed: Int = 0
    news: Annotated[NewsConfig, EMPTY_IS_DEFAULT] = field(default_factory=NewsConfig)
    traps: Annotated[TrapsConfig, EMPTY_IS_DEFAULT] = field(default_factory=TrapsConfig)  # variant "traps"


@section
class TrainConfig:
    """Continued pretraining: sequence length, batch, optimiser, schedule, checkpoints, mesh and memory options."""
    seq_len: Int = 512  # tokens per packed sequence (documents separated by the EOS token)
    batch_size: Int = 8  # sequences per optimizer step
    grad_accum: Int = 1  # micro-batches per step (batch_size must be a multiple)
    lr: Float = 1e-4
    schedule: Literal["constant", "cosine"] = "constant"  # both with `warmup_steps` of linear warm-up
    # "lm": minimise the next-token loss (continued pretraining) | "ascent": maximise it, i.e. gradient ascent on the
    # corpus, the simplest unlearning recipe (the audit-unlearning demonstration's "unlearned" model)
    objective: Literal["lm", "ascent"] = "lm"
    warmup_steps: Int = 0
    min_lr_ratio: Float = 0.0  # cosine: final lr / peak lr
    weight_decay: Float = 0.0  # AdamW decay on matrices (ndim >= 2) only
    b1: Float = 0.9
    b2: Float = 0.999
    eps: Float = 1e-8
    max_grad_norm: Float | None = 1.0  # None: no clipping
    compute_dtype: DType = "float32"  # master weights stay float32
    remat: Literal["none", "layer"] = "none"  # layer: recompute each decoder layer's activations in the backward pass
    loss_chunk: Int = 8192  # vocabulary rows per chunk of the cross-entropy (the [B, T, V] logits never exist)
    mesh: str | None = None  # device mesh, as `mia-jax --mesh`: "data=8", "fsdp=4,model=2"; None: every device on data
    epochs: Int = 1
    shuffle: bool = True  # shuffle the order of packed sequences (seeded)
    seed: Int = 0
    checkpoint_every: Int = 50  # optimizer steps; 0: only at the end
    keep_checkpoints: Int = 2
    separator: str = "auto"  # document separator: "auto" (<|endoftext|> if the vocabulary has it, else EOS) or a token
    progress: bool = True
    # one device's peak TFLOP/s in the compute dtype (e.g. 989: an H100 SXM's dense bfloat16): speed.jsonl's MFU
    # (train/speed.py) is against this x the mesh's devices; None: no MFU. Display only (not in the fingerprint)
    peak_tflops: Float | None = None
    # the order of the packed sequences (train/data.py): "grain" (grain's IndexSampler, seeded global shuffle) or
    # "numpy" (the per-epoch NumPy permutation of the runs made before grain, e.g. results/contamination/)
    sampler: Literal["grain", "numpy"] = "grain"


@section
class ScoreConfig:
    """Scoring: the methods, Min-K% ``k``, batch size, bootstrap and neighbour settings."""
    methods: list[str] = field(default_factory=lambda: [
        "loss", "ppl", "zlib", "min_k", "min_k_pp", "max_k", "entropy", "rank", "lowercase", "ref"])
    k: list[Float] = field(default_factory=lambda: [0.2])
    batch_size: Int = 8
    n_bootstrap: Int = 1000
    seed: Int = 0
    n_neighbors: Int = 10  # neighbours per text of the `neighbor` method (as `mia-jax eval --n-neighbors`)


@section
class AblationConfig:
    """The values each ablation sweeps over."""
    lrs: list[Float] = field(default_factory=lambda: [1e-5, 1e-4])  # Table 4
    background_tokens: list[Int] = field(default_factory=lambda: [60_000, 180_000, 540_000])  # Figure 5a
    news_background: list[Int] = field(default_factory=lambda: [100, 300, 600])  # Figure 5b (articles)


@section
class ExperimentConfig:
    """One contamination experiment: name, model, corpus, train, score and ablation sections."""
    name: str = "contamination"
    model: Annotated[ModelConfig, EMPTY_IS_DEFAULT] = field(default_factory=ModelConfig)
    corpus: Annotated[CorpusConfig, EMPTY_IS_DEFAULT] = field(default_factory=CorpusConfig)
    train: Annotated[TrainConfig, EMPTY_IS_DEFAULT] = field(default_factory=TrainConfig)
    score: Annotated[ScoreConfig, EMPTY_IS_DEFAULT] = field(default_factory=ScoreConfig)
    ablation: Annotated[AblationConfig, EMPTY_IS_DEFAULT] = field(default_factory=AblationConfig)

    def to_dict(self) -> dict:
        """The config as nested dicts."""
        return dataclasses.asdict(self)


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The config in ``path`` (YAML) with ``overrides`` (``a.b=value``) applied; defaults when ``path`` is None.

    Every value is converted to its field's type by pydantic or refused, like an unknown key, with one line naming
    the file or the override, the key, the value and what is expected (``config_parse``)."""
    data, head = read_sections(path)
    cfg = validated(ExperimentConfig, data, head)
    for item in overrides:
        cfg = apply_override(cfg, item)
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
        (cfg.score.n_neighbors >= 1, f"score.n_neighbors must be at least 1, got {cfg.score.n_neighbors}"),
        (t.loss_chunk >= 1, f"train.loss_chunk must be at least 1, got {t.loss_chunk}"),
        (t.epochs >= 1, f"train.epochs must be at least 1, got {t.epochs}"),
        (t.checkpoint_every >= 0, f"train.checkpoint_every must be >= 0, got {t.checkpoint_every}"),
        (t.seed < 2**32, f"train.seed must be below 2**32 (grain's shuffle), got {t.seed}"),
        (bool(c.traps.lengths) and min(c.traps.lengths) >= 2 and c.traps.bins >= 1 and c.traps.per_cell >= 1
         and c.traps.oversample >= 1 and c.traps.batch_size >= 1 and bool(c.traps.temperatures)
         and min(c.traps.temperatures) > 0 and 0 < c.traps.jaccard <= 1,
         f"corpus.traps: lengths >= 2, bins, per_cell, oversample, batch_size >= 1, temperatures > 0 and jaccard in "
         f"(0, 1] needed, got {c.traps}"),
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
        (few is None, f"{few[0]}={few[1]}: at least {MIN_PER_CLASS} members and {MIN_PER_CLASS} non-members per "
         "dataset are needed for an AUROC (metrics.MIN_PER_CLASS); with fewer every cell would be n/a" if few else ""),
    ]
    for ok, message in checks:
        if not ok:
            raise UserError(message)


def fingerprint(obj) -> str:
    """A stable JSON text of a config (section) for comparisons and hashes."""
    return json.dumps(dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj, sort_keys=True)
