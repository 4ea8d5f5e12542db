"""``mia-jax audit-unlearning``: which forget-set texts does an unlearned model still know? The options, the audit
run (inputs checked and both models loaded before anything is written; the folder and its scoring runs claimed) and
the ``--from`` rebuild. The audit itself: :mod:`mia_jax.audits.unlearning`."""
from __future__ import annotations

from mia_jax import entry
from mia_jax.audits import model_options, unlearning
from mia_jax.audits.unlearning import (CHUNK_WORDS, K, MAX_NEW_TOKENS, MAX_PROBE, MIN_WORDS, N_SAMPLES, PROMPT_WORDS,
                                       QA_MAX_NEW_TOKENS, RATIO)

NAME = "audit-unlearning"
HELP = "which forget-set texts does an unlearned model still know? (Min-K%% ratio audit, Shi et al. 2023 section 7)"


def add_arguments(p) -> None:
    """The options of ``mia-jax audit-unlearning`` on the argparse parser ``p``."""
    p.add_argument("--original", help="the model before unlearning (HF folder, .gguf or a name); required "
                                       "unless --from")
    p.add_argument("--unlearned", help="the model after unlearning; required unless --from")
    p.add_argument("--texts", metavar="FORGET", type=entry.input_file,
                   help="the forget set (.jsonl / .csv / .tsv / .parquet); required "
                        "unless --from")
    p.add_argument("--from", dest="from_dir", metavar="DIR",
                   type=entry.source_dir("audit-unlearning", example="results/audits/unlearning"),
                   help="rebuild the report from an earlier --out folder (its unlearning.json, chunks.csv and "
                        "probes.jsonl, checked against its manifest.json; its config, not this command's options) "
                        "into --out (new, empty, an earlier rebuild of DIR, or DIR itself), without the models")
    p.add_argument("--text-field", default="text", help="field of the texts (default: text)")
    p.add_argument("--encoding", default="utf-8", help="text encoding of --texts and --qa (default: utf-8)")
    p.add_argument("--out", required=True, type=entry.out_dir,
                   help="output folder: unlearning.md / .json, chunks.csv, ratios.png, probes.jsonl, manifest.json; "
                        "the scoring runs in OUT/original and OUT/unlearned. A folder of another run is refused")
    p.add_argument("--chunk-words", type=entry.positive_int, default=CHUNK_WORDS,
                   help=f"words per chunk (default {CHUNK_WORDS})")
    p.add_argument("--min-words", type=entry.positive_int, default=MIN_WORDS,
                   help=f"a shorter text or last piece is dropped and counted (default {MIN_WORDS})")
    p.add_argument("--k", type=entry.fraction, default=K, help=f"Min-K%% fraction (default {K})")
    p.add_argument("--ratio", type=entry.positive_float, default=RATIO,
                   help=f"flag when the ratio is in (1/r, r) (default {RATIO})")
    p.add_argument("--max-probe", type=entry.nonneg_int, default=MAX_PROBE,
                   help=f"flagged chunks probed by story completion, closest ratio first (default {MAX_PROBE})")
    p.add_argument("--prompt-words", type=entry.positive_int, default=PROMPT_WORDS,
                   help=f"prompt words (default {PROMPT_WORDS})")
    p.add_argument("--n-samples", type=entry.positive_int, default=N_SAMPLES,
                   help=f"continuations per chunk (default {N_SAMPLES})")
    p.add_argument("--max-new-tokens", type=entry.positive_int,
                   help=f"tokens per continuation (default: the true continuation's, at most {MAX_NEW_TOKENS})")
    p.add_argument("--temperature", type=entry.nonneg_float, default=1.0,
                   help="sampling temperature (default 1: multinomial)")
    p.add_argument("--top-k", type=entry.positive_int, help="sample from the k most likely tokens (default: all)")
    p.add_argument("--seed", type=entry.nonneg_int, default=0, help="sampling seed (default 0)")
    p.add_argument("--qa", metavar="FILE", type=entry.input_file,
                   help="optional QA probes: JSONL/CSV with question and answer fields")
    p.add_argument("--qa-question-field", default="question")
    p.add_argument("--qa-answer-field", default="answer")
    p.add_argument("--qa-max-new-tokens", type=entry.positive_int, default=QA_MAX_NEW_TOKENS)
    p.add_argument("--embed-model", metavar="PATH",
                   help="sentence-transformers folder (e.g. all-MiniLM-L6-v2) for embedding similarity")
    model_options(p, "OUT/original and OUT/unlearned")


def run(args) -> None:
    """``mia-jax audit-unlearning`` with the parsed ``args`` (with ``--from``: the rebuild)."""
    unlearning.command(args)
