"""A random-weight Hugging Face folder with a packaged model's architecture (or a preset shape over a packaged
model's tokenizer), for speed benchmarks on a machine the real weights cannot reach (the lent GPU takes a 64 MiB
working tree; SmolLM2's GGUF is 94 MB). Speed does not depend on weight values. Two steps::

    python scripts/bench/random_model.py prepare DIR [--models smollm2 gemma3-270m llama-1b]  # here: no weights
    python scripts/bench/random_model.py build OUT DIR/smollm2 [...] [--layers N] [--numpy]   # there: + weights

``prepare`` reads each packaged GGUF's config (``cfg.to_hf()``) and tokenizer, no weights. A preset (``PRESETS``:
``llama-1b``, a ~1.07B-parameter Llama shape -- hidden 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, tied
embedding -- and ``tiny``, for smoke runs) is its base model's config with the preset's sizes, and the base model's
tokenizer (SmolLM2's: vocabulary 49152). ``build`` (needs torch and transformers) makes the model with
transformers' own initialisation (seed 0), saves it in float32 and copies the tokenizer (gzipped ones too);
``build --numpy`` (Llama configs only) writes the weights without torch: every matrix N(0, initializer_range)
from NumPy (one seeded generator per tensor, several threads), every norm weight 1, stored as ``--dtype`` (default
bfloat16 with ``--numpy``) with safetensors' NumPy writer -- seconds for a 1B model. ``--layers`` cuts the model
down for a quick local check. ``mia_jax.models.load`` and ``transformers.AutoModelForCausalLM.from_pretrained``
both read the result.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mia_jax.runs import entry
from mia_jax.errors import UserError

PROG = "python scripts/bench/random_model.py"

# preset shapes: a packaged base model (its config's other fields and its tokenizer) and the sizes that change
PRESETS = {
    "llama-1b": ("smollm2", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                 head_dim=64, intermediate_size=8192, tie_word_embeddings=True)),
    "tiny": ("smollm2", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=16, intermediate_size=128, tie_word_embeddings=True)),
}


def prepare(out: Path, names: list[str]) -> None:
    from mia_jax.models import checkpoint, gguf_io

    for name in names:
        folder = out / name
        if name in PRESETS:
            base, sizes = PRESETS[name]
            if not (out / base / "config.json").exists():
                prepare(out, [base])
            folder.mkdir(parents=True, exist_ok=True)
            cfg = dict(json.loads((out / base / "config.json").read_text()), **sizes)
            (folder / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
            tok = next(p for p in (out / base / "tokenizer.json", out / base / "tokenizer.json.gz") if p.exists())
            shutil.copy(tok, folder / tok.name)
            print(f"{folder}: preset {name} ({llama_parameters(cfg) / 1e6:.0f} M parameters), tokenizer of {base}",
                  file=sys.stderr)
            continue
        path = checkpoint.resolve_model(name)
        meta, arrays = gguf_io.read_arrays(path)
        cfg = checkpoint.architecture(meta["general.architecture"])[0].config_from_gguf(meta, arrays)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(cfg.to_hf(), indent=1) + "\n")
        gguf_io.tokenizer_from_gguf(meta, path).save(str(folder / "tokenizer.json"))
        print(f"{folder}: config.json + tokenizer.json of {path}", file=sys.stderr)


def _config(src: Path, layers: int | None) -> dict:
    raw = json.loads((src / "config.json").read_text())
    if layers:
        raw["num_hidden_layers"] = layers
        if raw.get("layer_types"):
            raw["layer_types"] = raw["layer_types"][:layers]
    return raw


def _copy_tokenizer(src: Path, dst: Path) -> None:
    if (src / "tokenizer.json").exists():
        shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
    else:
        with gzip.open(src / "tokenizer.json.gz", "rb") as f, open(dst / "tokenizer.json", "wb") as g:
            shutil.copyfileobj(f, g)


def build(out: Path, sources: list[Path], layers: int | None) -> None:
    import torch
    import transformers

    for src in sources:
        raw = _config(src, layers)
        cfg = transformers.AutoConfig.for_model(**raw)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        dst = out / src.name
        model.save_pretrained(dst, safe_serialization=True)
        _copy_tokenizer(src, dst)
        n = sum(p.numel() for p in model.parameters())
        print(f"{dst}: {type(model).__name__}, {n / 1e6:.1f} M parameters, {cfg.num_hidden_layers} layers, "
              f"transformers {transformers.__version__}", flush=True)


def llama_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """{Hugging Face tensor name: shape} of a Llama config (``LlamaForCausalLM``'s state dict)."""
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    h, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or d // h
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (h * hd, d), p + "self_attn.k_proj.weight": (kv * hd, d),
                       p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.o_proj.weight": (d, h * hd),
                       p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                       p + "mlp.down_proj.weight": (d, f), p + "input_layernorm.weight": (d,),
                       p + "post_attention_layernorm.weight": (d,)})
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (v, d)
    return shapes


def llama_parameters(cfg: dict) -> int:
    import math

    return sum(math.prod(s) for s in llama_shapes(cfg).values())


def build_numpy(dst: Path, src: Path, layers: int | None = None, dtype: str = "bfloat16", seed: int = 0) -> int:
    """``dst``: ``src``'s config.json (``layers``: cut to that many) and tokenizer, and random Llama weights from
    NumPy (see the module docstring) in ``model.safetensors``; returns the number of parameters."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    cfg = _config(src, layers)
    if cfg.get("model_type") != "llama":
        raise UserError(f"{src}: build --numpy writes Llama weights only (model_type {cfg.get('model_type')!r}); "
                         "use build without --numpy (torch)")
    shapes = llama_shapes(cfg)
    std = float(cfg.get("initializer_range", 0.02))
    out_dtype = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}[dtype]
    seeds = np.random.SeedSequence(seed).spawn(len(shapes))

    def one(item):
        (name, shape), ss = item
        if len(shape) == 1:  # RMSNorm weights
            return name, np.ones(shape, out_dtype)
        x = np.random.default_rng(ss).standard_normal(shape, dtype=np.float32)
        x *= std
        return name, x.astype(out_dtype)

    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        tensors = dict(pool.map(one, zip(shapes.items(), seeds)))
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg["torch_dtype"] = dtype
    (dst / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    _copy_tokenizer(src, dst)
    return sum(int(t.size) for t in tensors.values())


def prepared(text: str) -> Path:
    """argparse type of ``build``'s sources: a folder ``prepare`` made (config.json and a tokenizer)."""
    import argparse

    path = entry.input_dir(text)
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text} has no config.json: give a folder made by "
                                         f"'{PROG} prepare'")
    if not any((path / n).is_file() for n in ("tokenizer.json", "tokenizer.json.gz")):
        raise argparse.ArgumentTypeError(f"{text} has no tokenizer.json: give a folder made by '{PROG} prepare'")
    return path


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="config.json + tokenizer.json of packaged models or presets (no weights)")
    p.add_argument("out", type=entry.out_dir)
    p.add_argument("--models", nargs="+", default=["smollm2", "gemma3-270m"],
                   help=f"packaged model names or presets ({', '.join(PRESETS)})")
    b = sub.add_parser("build", help="random weights for prepared folders (torch + transformers, or --numpy)")
    b.add_argument("out", type=entry.out_dir)
    b.add_argument("src", type=prepared, nargs="+")
    b.add_argument("--layers", type=entry.positive_int, help="cut the model down to N layers (a quick check)")
    b.add_argument("--numpy", action="store_true", help="write Llama weights with NumPy + safetensors (no torch)")
    b.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="stored dtype with --numpy (default bfloat16; torch's build saves float32)")
    b.add_argument("--seed", type=entry.nonneg_int, default=0, help="seed of the --numpy weights (default 0)")
    return ap


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    if args.step == "prepare":
        prepare(args.out, args.models)
    elif args.numpy:
        for src in args.src:
            n = build_numpy(args.out / src.name, src, args.layers, args.dtype, args.seed)
            print(f"{args.out / src.name}: random Llama weights from NumPy, {n / 1e6:.1f} M parameters, "
                  f"{args.dtype}", flush=True)
    else:
        build(args.out, args.src, args.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
