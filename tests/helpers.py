"""Helpers shared by the test modules (imported as ``from helpers import ...``; fixtures stay in conftest.py):
tiny random checkpoints written without torch (Llama folder, llama GGUF, BERT / RoBERTa masked LM), the torch
logits of a transformers model, real subprocess runs interrupted mid-way, and a Ctrl-C at a chosen batch."""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from mia_jax.data import wikimia

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

@contextlib.contextmanager
def ctrl_c_at_batch(n: int):
    """Within the block, the runner's ``n``-th scored batch raises KeyboardInterrupt (as Ctrl-C does there), before
    its records are saved."""
    from mia_jax.engine.records import Sink

    real, calls = Sink.add, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    Sink.add = interrupted
    try:
        yield
    finally:
        Sink.add = real

REPO = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}


def complete_records(path: Path) -> list[dict]:
    """The records of a passes file that a resume can reuse (a torn last line is not one)."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def start(argv, cwd=REPO, env=None) -> subprocess.Popen:
    """The command in a child Python; its stderr goes to a file (a pipe nobody reads could block it)."""
    err = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env or ENV, stdout=subprocess.DEVNULL, stderr=err,
                            text=True)
    proc.err_file = err
    return proc


def stderr_of(proc: subprocess.Popen) -> str:
    proc.err_file.seek(0)
    return proc.err_file.read()


def wait_for(proc: subprocess.Popen, condition, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it could be interrupted:\n{stderr_of(proc)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.005)


def interrupt_when(proc: subprocess.Popen, path: Path, n_lines: int, sig: int, timeout: float = 300) -> str:
    """Send ``sig`` as soon as ``path`` holds ``n_lines`` complete records; returns the process's stderr."""
    wait_for(proc, lambda: len(complete_records(path)) >= n_lines, timeout)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    return stderr_of(proc)

def write_tiny_gguf(path, folder):
    """A float32 llama GGUF of the tiny HF folder, converted as llama.cpp does (q/k rows permuted)."""
    import gguf

    from mia_jax.models.llama import GGUF_TO_HF

    cfg = json.loads((folder / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    to_gguf = {hf.format(i=i): g.format(i=i) for g, hf in GGUF_TO_HF.items() for i in range(n)}
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in [("block_count", n), ("context_length", cfg["max_position_embeddings"]),
                       ("embedding_length", cfg["hidden_size"]), ("feed_forward_length", cfg["intermediate_size"]),
                       ("head_count", cfg["num_attention_heads"]), ("head_count_kv", cfg["num_key_value_heads"]),
                       ("rope_freq_base", 10000.0), ("layer_norm_rms_eps", 1e-5), ("vocab_size", cfg["vocab_size"]),
                       ("tokenizer_model", "gpt2"), ("tokenizer_pre", "gpt-2"), ("eos_token_id", cfg["eos_token_id"])]:
        getattr(w, f"add_{add}")(value)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get) + [f"<pad{i}>" for i in range(cfg["vocab_size"] - len(vocab))]
    w.add_token_list(tokens)
    w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m
                        for m in json.loads(tok.to_str())["model"]["merges"]])
    for name, a in load_file(str(folder / "model.safetensors")).items():
        if ".q_proj." in name or ".k_proj." in name:
            heads = cfg["num_attention_heads" if ".q_proj." in name else "num_key_value_heads"]
            a = a.reshape(heads, 2, a.shape[0] // heads // 2, a.shape[1]).swapaxes(1, 2).reshape(a.shape)
        w.add_tensor(to_gguf[name], a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path

TINY_MLM = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=72)

def tiny_mlm_tokenizer(model_type: str) -> Tokenizer:
    """A WordPiece tokenizer ([PAD]=0 ... [MASK]=4, '[CLS] $A [SEP]') for BERT, a byte-level BPE
    (<s>=0, <pad>=1, </s>=2, <unk>=3, <mask>=4, RobertaProcessing) for RoBERTa."""
    texts = wikimia(32).texts[:200]
    if model_type == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.train_from_iterator(texts, trainers.WordPieceTrainer(
            vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True)
    return tok

def hf_config(model_type: str, vocab_size: int) -> dict:
    extra = (dict(pad_token_id=0, layer_norm_eps=1e-12) if model_type == "bert"
             else dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, type_vocab_size=1))
    return dict(model_type=model_type, vocab_size=vocab_size, hidden_act="gelu", **TINY_MLM, **extra)

def write_tiny_mlm(path, model_type: str = "bert", seed: int = 0):
    """A random *ForMaskedLM folder written with numpy in the Hugging Face layout (no torch needed)."""
    tok = tiny_mlm_tokenizer(model_type)
    cfg = hf_config(model_type, tok.get_vocab_size())
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    p = "bert." if model_type == "bert" else "roberta."
    t = {p + "embeddings.word_embeddings.weight": w(v, d),
         p + "embeddings.position_embeddings.weight": w(cfg["max_position_embeddings"], d),
         p + "embeddings.token_type_embeddings.weight": w(cfg.get("type_vocab_size", 2), d),
         p + "embeddings.LayerNorm.weight": 1 + w(d), p + "embeddings.LayerNorm.bias": w(d)}
    for i in range(cfg["num_hidden_layers"]):
        q = f"{p}encoder.layer.{i}."
        for name, shape in [("attention.self.query", (d, d)), ("attention.self.key", (d, d)),
                            ("attention.self.value", (d, d)), ("attention.output.dense", (d, d)),
                            ("intermediate.dense", (f, d)), ("output.dense", (d, f))]:
            t[q + name + ".weight"], t[q + name + ".bias"] = w(*shape), w(shape[0])
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[q + name + ".weight"], t[q + name + ".bias"] = 1 + w(d), w(d)
    head = ({"cls.predictions.transform.dense": (d, d)} if model_type == "bert" else {"lm_head.dense": (d, d)})
    for name, shape in head.items():
        t[name + ".weight"], t[name + ".bias"] = w(*shape), w(d)
    norm = "cls.predictions.transform.LayerNorm" if model_type == "bert" else "lm_head.layer_norm"
    t[norm + ".weight"], t[norm + ".bias"] = 1 + w(d), w(d)
    t["cls.predictions.bias" if model_type == "bert" else "lm_head.bias"] = w(v)
    path.mkdir(parents=True, exist_ok=True)
    save_file(t, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    tok.save(str(path / "tokenizer.json"))
    return path

# texts for tokenizer and perplexity parity (whitespace, digits, unicode, code, special tokens)
TEXTS = ["Hello world", "In 2023, 1234567 people paid $19.99 each.", "  spaces   and\ttabs\n\n\nlines",
         "naïve café — 日本語 🙂", "def f(x):\n    return x**2  # note\n", "<|endoftext|>a<|endoftext|>"]

PARAGRAPH = (
    "Bread is a staple food prepared from a dough of flour and water, usually by baking. Throughout recorded "
    "history and around the world, it has been an important part of many cultures' diet. It is one of the oldest "
    "human-made foods, having been of significant importance since the dawn of agriculture, and plays an essential "
    "role in both religious rituals and secular culture. Bread may be leavened by naturally occurring microbes, "
    "chemicals, industrially produced yeast, or high-pressure aeration, which creates the gas bubbles that fluff up "
    "bread. In many countries, commercial bread often contains additives to improve flavor, texture, color, shelf "
    "life, nutrition, and ease of production."
)

def torch_logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(ids)).logits.float().numpy()

def nll(logprobs, ids):
    return -np.take_along_axis(logprobs[:-1], np.asarray(ids)[1:, None], axis=-1).mean()


def tpr_ref(labels, scores, fpr):
    """Largest TPR over thresholds t in {+inf} U scores (member when score >= t) with FPR <= fpr."""
    labels, scores = np.asarray(labels), np.asarray(scores, np.float64)
    best = 0.0
    for t in np.concatenate([[np.inf], np.unique(scores)]):
        pred = scores >= t
        if pred[labels == 0].mean() <= fpr:
            best = max(best, pred[labels == 1].mean())
    return best


def assert_chunked_gradient_matches_full(q, k, v, **opts) -> None:
    """``jax.grad`` of a weighted sum of ``attention(q, k, v, **opts)`` through the "chunked" implementation (finite)
    equals the "full" one's, for q, k and v."""
    import jax
    import jax.numpy as jnp

    from mia_jax.models import attention

    w = jnp.asarray(np.random.default_rng(3).standard_normal(q.shape).astype(np.float32))

    @jax.jit
    def grads(q, k, v):
        loss = lambda q, k, v, impl: jnp.sum(attention.attention(q, k, v, implementation=impl, **opts) * w)  # noqa
        return {impl: jax.grad(loss, argnums=(0, 1, 2))(q, k, v, impl) for impl in ("full", "chunked")}

    g = grads(q, k, v)
    for g_full, g_chunk, what in zip(g["full"], g["chunked"], "qkv"):
        assert np.all(np.isfinite(np.asarray(g_chunk))), what
        np.testing.assert_allclose(np.asarray(g_chunk), np.asarray(g_full), rtol=1e-5, atol=2e-6, err_msg=what)


def snapshot(folder) -> dict:
    """Every file under ``folder`` (relative path -> bytes), every sub-folder (-> None) and every link (-> its
    target): compare two snapshots to prove that nothing in a folder changed."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (("link", os.readlink(p)) if p.is_symlink() else None if p.is_dir()
                                         else p.read_bytes()) for p in sorted(folder.rglob("*"))}


def assert_clean_error(rc: int, stderr: str, *needles: str) -> None:
    """A user error as every entry point reports it: exit 2, one line on stderr, no traceback; each of ``needles``
    in the message."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc == 2, f"exit {rc}, stderr:\n{stderr}"
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{stderr}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def cut_mid_row(path) -> None:
    """The file cut in the middle of its last row (as a full disk or a killed copy leaves it)."""
    data = Path(path).read_bytes()
    start = data.rindex(b"\n", 0, len(data) - 1) + 1
    Path(path).write_bytes(data[: start + max(1, (len(data) - start) // 2)])


def drop_line(path, n: int = 1) -> None:
    """The file without its line ``n`` (from 0)."""
    lines = Path(path).read_bytes().splitlines(keepends=True)
    Path(path).write_bytes(b"".join(lines[:n] + lines[n + 1:]))


# the damages a --from rebuild must refuse by name: {what: how(path)}
DAMAGE = {"cut mid-row": cut_mid_row, "a missing line": drop_line, "empty": lambda p: Path(p).write_bytes(b""),
          "missing": lambda p: Path(p).unlink()}


# ----------------------------------------------------------------------------- a --from rebuild of a committed folder

def sealed_copy(committed, tmp_path) -> Path:
    """A copy of the committed results folder ``committed`` (sealed: manifest.json) in ``tmp_path/src``."""
    src = Path(tmp_path) / "src"
    shutil.copytree(committed, src)
    return src


def rebuild_cli(command: str, src, out, capsys) -> tuple[int, str]:
    """``mia-jax COMMAND --from SRC --out OUT`` in this process: (exit code, its stderr); what was captured before
    is dropped."""
    from mia_jax.cli import main  # the commands load jax: only the tests that rebuild pay for it

    capsys.readouterr()
    rc = main([command, "--from", str(src), "--out", str(out)])
    return rc, capsys.readouterr().err


def check_damage_refused(command: str, sealed, name: str, damage: str, out, capsys) -> None:
    """``--from sealed`` with its file ``name`` damaged (``damage``, a key of DAMAGE, done already) is refused by
    name, one line, with ``sealed`` untouched and ``out`` never made."""
    before = snapshot(sealed)
    rc, err = rebuild_cli(command, sealed, out, capsys)
    assert_clean_error(rc, err, name, "manifest.json" if damage == "missing" else "changed or cut")
    assert snapshot(sealed) == before and not Path(out).exists()


def check_refused_into(command: str, sealed, other_run, other, capsys) -> None:
    """A rebuild of ``sealed`` into ``other`` (a copy of the folder ``other_run`` of another run) is refused, one
    line, both folders untouched."""
    shutil.copytree(other_run, other)
    before, src_before = snapshot(other), snapshot(sealed)
    rc, err = rebuild_cli(command, sealed, other, capsys)
    assert_clean_error(rc, err, str(other), "refusing to write into it")
    assert snapshot(other) == before and snapshot(sealed) == src_before


def check_rebuilds_again(command: str, sealed, out, info: str, capsys) -> None:
    """``out``, a rebuild of ``sealed``: rebuilding ``sealed`` into it again changes nothing, and rebuilding it in
    place changes nothing but its ``info`` file (which records the source) and its manifest."""
    first = snapshot(out)
    rc, err = rebuild_cli(command, sealed, out, capsys)  # its own earlier rebuild of the same source
    assert rc == 0, err
    assert snapshot(out) == first
    rc, err = rebuild_cli(command, out, out, capsys)  # in place
    assert rc == 0, err
    assert {k: v for k, v in snapshot(out).items() if k not in (info, "manifest.json")} == \
        {k: v for k, v in first.items() if k not in (info, "manifest.json")}


def transformers_gguf_ppl(path: str, loaded, texts, model_class: str, ids) -> float:
    """transformers' perplexity of the token ``ids`` under the GGUF file ``path`` (loaded as ``model_class``, as
    ``from_pretrained(gguf_file=...)`` does, without needing accelerate), once ``loaded``'s tokenizer is checked to
    give transformers' ids on each of ``texts``. Skips the test without torch or transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, fname = path.rsplit("/", 1)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    for text in texts:
        assert loaded.tokenizer.encode(text).ids == hf_tok(text)["input_ids"], text
    cls = getattr(transformers, model_class)
    ref = cls(transformers.AutoConfig.from_pretrained(folder, gguf_file=fname)).eval()
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=ref)["tensors"]
    ref.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    with torch.no_grad():
        return float(torch.exp(ref(torch.tensor([ids]), labels=torch.tensor([ids])).loss))


def check_rebuild_twice(main, src, out, expected: set) -> dict:
    """``main(["--from", src, "--out", out])`` into a new folder (writing at least the files ``expected``), then
    again into its own earlier rebuild: accepted, nothing changed. Returns the folder's ``snapshot``."""
    assert main(["--from", str(src), "--out", str(out)]) == 0
    first = snapshot(out)
    assert expected <= set(first)
    assert main(["--from", str(src), "--out", str(out)]) == 0  # its own earlier rebuild: accepted
    assert snapshot(out) == first
    return first
