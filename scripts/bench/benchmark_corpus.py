"""Peak memory and speed of streamed scoring: two synthetic corpora, one ``--scale`` times the other, scored by
`mia-jax score` a window of texts at a time (``--stream-window``), each run in a fresh process whose peak RSS is
read from the kernel (``os.wait4``'s rusage of that child); and the large corpus scored again in memory (one window
holding every text) for the speed comparison. With tensorflow-datasets present, the small corpus is also built as a
TFDS dataset (``--tfds``) and scored through ``--data tfds:...``.

    python scripts/bench/benchmark_corpus.py [--texts 1000] [--scale 20] [--stream-window 500] [--model DIR]
    python scripts/bench/benchmark_corpus.py --processes 2     # each corpus scored by 2 processes, as on a pod

The model is a random-weight Llama of the ``tiny`` preset's sizes (``scripts/bench/random_model.py``: hidden 64,
2 layers) over a 512-id BPE tokenizer trained here, unless ``--model`` names one: a fast model is the strict case for
the speed claim, since what streaming adds (reading, writing shards, a window's pipeline drain) is per text, not per
FLOP. Texts are random words from a fixed list, 20 to
120 words each (seeded). Tokens per second come from each run's run.json (scoring seconds: reading, tokenizing,
packing, the steps and the writes). Each measured run is the second of two identical ones: the first, not measured,
puts every program the run needs in a persistent compilation cache, so no measured run compiles (``compiled``: 0)
and neither memory nor speed holds the compiler's share.
The last line printed is JSON: ``{"small": {"texts": N, "peak_rss_mib": X}, "large": {"texts": 20N,
"peak_rss_mib": Y}, "stream_tokens_per_s": S, "in_memory_tokens_per_s": T}``, with the CPU model and the tfds run.
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_tools beside this file
from bench_tools import cpu_model  # noqa: E402

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from mia_jax.runs import entry  # noqa: E402

PROG = "python scripts/bench/benchmark_corpus.py"
WORDS = ("the of river city old stone bridge north market winter light paper garden music station quiet harbour "
         "engine letter field morning council history railway museum village church summer island forest school "
         "season album team player record league film series bank trade law court ancient modern").split()


def build_parser() -> entry.ArgumentParser:
    ap = entry.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=entry.positive_int, default=1000, help="texts of the small corpus (default 1000)")
    ap.add_argument("--scale", type=entry.positive_int, default=20, help="the large corpus is this many times the "
                                                                         "small one (default 20)")
    ap.add_argument("--stream-window", type=entry.positive_int, default=500, help="texts per shard (default 500)")
    ap.add_argument("--model", type=entry.input_dir, help="a model folder (default: a random tiny Llama, built here)")
    ap.add_argument("--work", type=entry.out_dir, help="working folder (default: a temporary one)")
    ap.add_argument("--no-tfds", action="store_true", help="skip the TFDS run")
    ap.add_argument("--processes", type=entry.positive_int, default=1,
                    help="score each corpus on this many processes on this machine, as a pod does (default 1; the "
                         "peak RSS reported is the largest process's; no in-memory or TFDS run)")
    return ap


def main(argv=None) -> int:
    return entry.run(PROG, _main, argv)


def corpus(path: Path, n: int, seed: int = 0) -> Path:
    """``n`` random-word texts as JSONL at ``path``."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))}) + "\n")
    return path


# the random model: the `tiny` preset's sizes (scripts/bench/random_model.py) over a byte-level BPE tokenizer of
# VOCAB ids
VOCAB = 512
TINY = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128, max_position_embeddings=2048, rms_norm_eps=1e-5,
            tie_word_embeddings=True, model_type="llama", hidden_act="silu", attention_bias=False, mlp_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, architectures=["LlamaForCausalLM"])


def tiny_model(work: Path) -> Path:
    """A random tiny Llama: config + a BPE tokenizer trained on the benchmark's words here, then ``random_model.py
    build --numpy`` (float32 weights from NumPy)."""
    src, out = work / "tiny-src" / "tiny", work / "model"
    if not (out / "tiny" / "model.safetensors").exists():
        src.mkdir(parents=True, exist_ok=True)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([" ".join(WORDS)] * 4, trainer)
        tok.save(str(src / "tokenizer.json"))
        eos = tok.token_to_id("<|endoftext|>")
        (src / "config.json").write_text(json.dumps(dict(TINY, bos_token_id=eos, eos_token_id=eos)))
        subprocess.run([sys.executable, str(Path(__file__).with_name("random_model.py")), "build", str(out), str(src),
                        "--numpy", "--dtype", "float32"], check=True)
    return out / "tiny"


def score(model: Path, data: str, out: Path, window: int, cache: Path, extra=(), processes: int = 1) -> dict:
    """One `mia-jax score` in fresh processes (``processes`` of them, as one pod run: JAX's multi-controller runtime on
    localhost): its run.json's passes and speed, and the peak RSS (MiB) of each process."""
    cmd = [sys.executable, "-m", "mia_jax.cli", "score", "--model", str(model), "--data", data, "--out", str(out),
           "--stream-window", str(window), "--compilation-cache", str(cache), "--no-progress", *extra]
    env = dict(os.environ)
    if processes > 1:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env.update(MIA_JAX_DISTRIBUTED="1", MIA_JAX_COORDINATOR=f"127.0.0.1:{port}",
                   MIA_JAX_NUM_PROCESSES=str(processes), JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=dict(env, MIA_JAX_PROCESS_ID=str(i)) if processes > 1 else env)
             for i in range(processes)]
    peaks = []
    for proc in procs:
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err}")
        peaks.append(round(usage.ru_maxrss / 1024, 1))
    run = json.loads((out / "run.json").read_text())
    return {"texts": run["data"]["n"], "peak_rss_mib": max(peaks), "peak_rss_mib_per_process": peaks,
            "tokens_per_s": run["tokens_per_second"], "seconds": run["seconds"],
            "compiled": run["compile"]["compiled"], "programs": run["compile"]["scoring_programs"],
            "shards": run["passes"]["main"].get("shards")}


def tfds_run(model: Path, small: Path, work: Path, window: int, cache: Path) -> dict | None:
    """The small corpus as a TFDS dataset (ArrayRecord), scored through ``--data tfds:``; None without
    tensorflow-datasets or the project's TFDS reader."""
    try:
        import tensorflow_datasets as tfds  # optional: the TFDS run only

        from mia_jax.data import tfds_source  # noqa: F401  (present once TFDS input is part of the package)
    except ImportError:
        return None

    class BenchCorpus(tfds.core.GeneratorBasedBuilder):  # registered by TFDS as "bench_corpus"
        """The benchmark's small corpus."""
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text()}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            with open(small, encoding="utf-8") as f:
                for i, line in enumerate(f):
                    yield i, {"text": json.loads(line)["text"]}

    BenchCorpus(data_dir=str(work / "tfds"), file_format="array_record").download_and_prepare()
    return score(model, "tfds:bench_corpus:train", work / "runs" / "tfds", window, cache,
                 ["--data-dir", str(work / "tfds")])


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        (work / "runs").mkdir(parents=True, exist_ok=True)
        model = Path(args.model) if args.model else tiny_model(work)
        small = corpus(work / "small.jsonl", args.texts)
        large = corpus(work / "large.jsonl", args.texts * args.scale, seed=1)
        cache = work / "jax-cache"
        w, everything = args.stream_window, args.texts * args.scale
        runs = {}
        n = args.processes
        cases = [("small", small, w), ("large", large, w)]
        cases += [("large_in_memory", large, everything)] if n == 1 else []
        for name, data, window in cases:
            score(model, str(data), work / "runs" / f"{name}-warm", window, cache, processes=n)  # fills the cache
            runs[name] = score(model, str(data), work / "runs" / name, window, cache, processes=n)
        runs["tfds_small"] = None if args.no_tfds or n > 1 else tfds_run(model, small, work, w, cache)
        if n > 1:
            print(json.dumps({"processes": n, "stream_window": w, "cpu": cpu_model(),
                              **{k: {key: runs[k][key] for key in ("texts", "peak_rss_mib", "peak_rss_mib_per_process",
                                                                   "tokens_per_s")} for k in ("small", "large")}}))
            return 0
        for name, r in runs.items():
            print(f"{name}: {json.dumps(r)}", file=sys.stderr)
        print(json.dumps({"small": {k: runs["small"][k] for k in ("texts", "peak_rss_mib")},
                          "large": {k: runs["large"][k] for k in ("texts", "peak_rss_mib")},
                          "stream_tokens_per_s": runs["large"]["tokens_per_s"],
                          "in_memory_tokens_per_s": runs["large_in_memory"]["tokens_per_s"],
                          "large_in_memory_peak_rss_mib": runs["large_in_memory"]["peak_rss_mib"],
                          "tfds_small": runs["tfds_small"], "stream_window": w, "cpu": cpu_model()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
