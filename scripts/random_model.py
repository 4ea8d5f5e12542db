"""A random-weight Hugging Face folder with a packaged model's architecture, for speed benchmarks on a machine the
real weights cannot reach (the lent GPU takes a 64 MiB working tree; SmolLM2's GGUF is 94 MB). Speed does not depend
on weight values. Two steps::

    python scripts/random_model.py prepare DIR [--models smollm2 gemma3-270m]   # here: config.json + tokenizer.json
    python scripts/random_model.py build OUT DIR/smollm2 [...] [--layers N]     # there: + random model.safetensors

``prepare`` reads each packaged GGUF's config (``cfg.to_hf()``) and tokenizer, no weights; ``build`` (needs torch and
transformers) makes the model with transformers' own initialisation (seed 0), saves it in float32 and copies the
tokenizer (gzipped ones too). ``--layers`` cuts the model down for a quick local check. ``mia_jax.models.load`` and
``transformers.AutoModelForCausalLM.from_pretrained`` both read the result.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path


def prepare(out: Path, names: list[str]) -> None:
    from mia_jax.models import checkpoint, gguf_io

    for name in names:
        path = checkpoint.resolve_model(name)
        meta, arrays = gguf_io.read_arrays(path)
        cfg = checkpoint.architecture(meta["general.architecture"])[0].config_from_gguf(meta, arrays)
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(cfg.to_hf(), indent=1) + "\n")
        gguf_io.tokenizer_from_gguf(meta, path).save(str(folder / "tokenizer.json"))
        print(f"{folder}: config.json + tokenizer.json of {path}", file=sys.stderr)


def build(out: Path, sources: list[Path], layers: int | None) -> None:
    import torch
    import transformers

    for src in sources:
        raw = json.loads((src / "config.json").read_text())
        if layers:
            raw["num_hidden_layers"] = layers
            if raw.get("layer_types"):
                raw["layer_types"] = raw["layer_types"][:layers]
        cfg = transformers.AutoConfig.for_model(**raw)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        dst = out / src.name
        model.save_pretrained(dst, safe_serialization=True)
        if (src / "tokenizer.json").exists():
            shutil.copy(src / "tokenizer.json", dst / "tokenizer.json")
        else:
            with gzip.open(src / "tokenizer.json.gz", "rb") as f, open(dst / "tokenizer.json", "wb") as g:
                shutil.copyfileobj(f, g)
        n = sum(p.numel() for p in model.parameters())
        print(f"{dst}: {type(model).__name__}, {n / 1e6:.1f} M parameters, {cfg.num_hidden_layers} layers, "
              f"transformers {transformers.__version__}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="config.json + tokenizer.json of packaged models (no weights)")
    p.add_argument("out", type=Path)
    p.add_argument("--models", nargs="+", default=["smollm2", "gemma3-270m"])
    b = sub.add_parser("build", help="random float32 weights for prepared folders (torch + transformers)")
    b.add_argument("out", type=Path)
    b.add_argument("src", type=Path, nargs="+")
    b.add_argument("--layers", type=int, help="cut the model down to N layers (a quick check)")
    args = ap.parse_args(argv)
    if args.step == "prepare":
        prepare(args.out, args.models)
    else:
        build(args.out, args.src, args.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
