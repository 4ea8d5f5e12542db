"""Experiment configs: dataclasses loaded from YAML, with ``key=value`` overrides from the command line.

A config file holds the sections below (every field has a default, so a file names only what it changes)::

    model:    which base model to continue pretraining (``tiny``, a HF folder, a .gguf, ``smollm2``)
    corpus:   the contaminated corpus (train/corpus.py)
    train:    the Optax trainer (train/trainer.py)
    score:    the detectors run before and after training
    ablation: the values each ``--ablation`` sweep takes

Overrides use dotted names and YAML values: ``train.lr=1e-5 corpus.n_positives=20 score.k=[0.1,0.2]``.
Unknown names are refused (with the known ones listed), so a typo never silently does nothing.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mia_jax.errors import UserError

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
class CorpusConfig:
    variant: str = "downstream"  # "downstream" (Table 3/4/7, Figure 5a/5c) | "news" (Figure 5b)
    background: list[str] = field(default_factory=lambda: ["bundled:pile_sample.jsonl"])
    background_tokens: int = 180_000  # background documents are taken (seeded order) until this many tokens
    max_doc_chars: int | None = None  # cut longer background documents at a whitespace before this many characters
    data_dir: str = "bundled"  # folder with the downstream files (DATA.md names), or "bundled" (train/data)
    datasets: list[str] = field(default_factory=lambda: list(DOWNSTREAM))
    n_positives: int = 100  # per dataset, inserted into the corpus
    n_negatives: int = 100  # per dataset, held out (never inserted)
    occurrence: str = "fixed"  # "fixed": each positive `occurrences` times | "poisson": k ~ Poisson(lambda), k >= 1
    occurrences: int = 1
    poisson_lambda: float = 2.0
    seed: int = 0
    news: NewsConfig = field(default_factory=NewsConfig)


@dataclass
class TrainConfig:
    seq_len: int = 512  # tokens per packed sequence (documents separated by the EOS token)
    batch_size: int = 8  # sequences per optimizer step
    grad_accum: int = 1  # micro-batches per step (batch_size must be a multiple)
    lr: float = 1e-4
    schedule: str = "constant"  # "constant" | "cosine" (both with `warmup_steps` of linear warm-up)
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # cosine: final lr / peak lr
    weight_decay: float = 0.0  # AdamW decay on matrices (ndim >= 2) only
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0  # None: no clipping
    compute_dtype: str = "float32"  # "float32" | "bfloat16" (master weights stay float32)
    epochs: int = 1
    shuffle: bool = True  # shuffle the order of packed sequences (seeded)
    seed: int = 0
    checkpoint_every: int = 50  # optimizer steps; 0: only at the end
    keep_checkpoints: int = 2
    separator: str = "auto"  # document separator: "auto" (<|endoftext|> if the vocabulary has it, else EOS) or a token
    progress: bool = True


@dataclass
class ScoreConfig:
    methods: list[str] = field(default_factory=lambda: [
        "loss", "ppl", "zlib", "min_k", "min_k_pp", "max_k", "entropy", "rank", "lowercase", "ref"])
    k: list[float] = field(default_factory=lambda: [0.2])
    batch_size: int = 8
    n_bootstrap: int = 1000
    seed: int = 0


@dataclass
class AblationConfig:
    lrs: list[float] = field(default_factory=lambda: [1e-5, 1e-4])  # Table 4
    background_tokens: list[int] = field(default_factory=lambda: [60_000, 180_000, 540_000])  # Figure 5a
    news_background: list[int] = field(default_factory=lambda: [100, 300, 600])  # Figure 5b (articles)
    poisson_lambda: float = 2.0  # Figure 5c


@dataclass
class ExperimentConfig:
    name: str = "contamination"
    model: ModelConfig = field(default_factory=ModelConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _build(cls, data: Any, where: str):
    """A dataclass instance from a (nested) dict, refusing unknown keys."""
    if not dataclasses.is_dataclass(cls):
        return data
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise UserError(f"{where or 'config'}: expected a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(f"{where or 'config'}: unknown key(s) {unknown}; known: {sorted(fields)}")
    kwargs = {}
    for name, value in data.items():
        sub = _nested_type(cls, name)
        kwargs[name] = _build(sub, value, f"{where}.{name}" if where else name) if sub else value
    return cls(**kwargs)


def _nested_type(cls, name: str):
    default = cls.__dataclass_fields__[name].default_factory
    if default is dataclasses.MISSING:
        return None
    value = default()
    return type(value) if dataclasses.is_dataclass(value) else None


def _set(tree: dict, dotted: str, value, known: dict) -> None:
    keys = dotted.split(".")
    node, ref = tree, known
    for i, key in enumerate(keys):
        if not isinstance(ref, dict) or key not in ref:
            options = sorted(ref) if isinstance(ref, dict) else []
            raise UserError(f"override {dotted!r}: unknown key {'.'.join(keys[:i + 1])!r}; known here: {options}")
        if i == len(keys) - 1:
            node[key] = value
        else:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise UserError(f"override {dotted!r}: {'.'.join(keys[:i + 1])} is not a section")
            ref = ref[key]


def parse_overrides(items: Sequence[str]) -> list[tuple[str, Any]]:
    out = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UserError(f"override {item!r} must look like section.key=value (e.g. train.lr=1e-5)")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as e:
            raise UserError(f"override {item!r}: value is not valid YAML ({e})") from None
        if isinstance(value, str) and _is_number(value):
            value = float(value)  # YAML 1.1 reads "1e-5" as a string
        out.append((key, _fix_numbers(value)))
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _fix_numbers(obj):
    """YAML 1.1 reads 1e-5 (no dot) as a string; turn such strings into floats."""
    if isinstance(obj, dict):
        return {k: _fix_numbers(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fix_numbers(v) for v in obj]
    if isinstance(obj, str) and _is_number(obj) and obj.strip().lower() not in ("nan", "inf", "-inf", "infinity"):
        return float(obj)
    return obj


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The config in ``path`` (YAML) with ``overrides`` (``a.b=value``) applied; defaults when ``path`` is None."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise UserError(f"cannot read config {path}: {e}") from e
        except yaml.YAMLError as e:
            raise UserError(f"config {path} is not valid YAML: {e}") from e
        if not isinstance(data, dict):
            raise UserError(f"config {path}: expected a mapping at the top level")
    data = _fix_numbers(data)
    known = ExperimentConfig().to_dict()
    for key, value in parse_overrides(overrides):
        _set(data, key, value, known)
    cfg = _build(ExperimentConfig, data, "")
    validate(cfg)
    return cfg


def validate(cfg: ExperimentConfig) -> None:
    t, c = cfg.train, cfg.corpus
    checks = [
        (t.seq_len >= 2, f"train.seq_len must be at least 2, got {t.seq_len}"),
        (t.batch_size >= 1, f"train.batch_size must be at least 1, got {t.batch_size}"),
        (t.grad_accum >= 1 and t.batch_size % t.grad_accum == 0,
         f"train.batch_size ({t.batch_size}) must be a positive multiple of train.grad_accum ({t.grad_accum})"),
        (t.lr > 0, f"train.lr must be positive, got {t.lr}"),
        (t.schedule in ("constant", "cosine"), f"train.schedule must be 'constant' or 'cosine', got {t.schedule!r}"),
        (t.compute_dtype in ("float32", "bfloat16"),
         f"train.compute_dtype must be 'float32' or 'bfloat16', got {t.compute_dtype!r}"),
        (t.epochs >= 1, f"train.epochs must be at least 1, got {t.epochs}"),
        (t.checkpoint_every >= 0, f"train.checkpoint_every must be >= 0, got {t.checkpoint_every}"),
        (c.variant in ("downstream", "news"), f"corpus.variant must be 'downstream' or 'news', got {c.variant!r}"),
        (c.occurrence in ("fixed", "poisson"), f"corpus.occurrence must be 'fixed' or 'poisson', got {c.occurrence!r}"),
        (c.occurrences >= 1, f"corpus.occurrences must be at least 1, got {c.occurrences}"),
        (c.poisson_lambda > 0, f"corpus.poisson_lambda must be positive, got {c.poisson_lambda}"),
        (c.n_positives >= 1 and c.n_negatives >= 1,
         f"corpus.n_positives and corpus.n_negatives must be at least 1, got {c.n_positives}, {c.n_negatives}"),
        (c.background_tokens >= 0, f"corpus.background_tokens must be >= 0, got {c.background_tokens}"),
        (all(d in DOWNSTREAM for d in c.datasets), f"corpus.datasets must be among {DOWNSTREAM}, got {c.datasets}"),
    ]
    for ok, message in checks:
        if not ok:
            raise UserError(message)


def fingerprint(obj) -> str:
    """A stable JSON text of a config (section) for comparisons and hashes."""
    return json.dumps(dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj, sort_keys=True)
