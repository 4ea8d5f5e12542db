"""``mia-jax audit-unlearning``: which forget-set texts does an unlearned model still know? The options, the audit
run (inputs checked and both models loaded before anything is written; the folder and its scoring runs claimed) and
the ``--from`` rebuild. The audit itself: :mod:`mia_jax.audits.unlearning`."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from mia_jax import __version__, data, models
from mia_jax.runs import entry, rundir
from mia_jax.engine import runner
from mia_jax.audits.unlearning import (CHUNK_WORDS, K, MAX_PROBE, MIN_WORDS, N_SAMPLES, PROMPT_WORDS, QA_MAX_NEW_TOKENS,
                                       RATIO, SIDES, UnlearningConfig, UnlearningResult, audit_unlearning,
                                       check_options, make_chunks, min_k_method, tokenizer_digest)
from mia_jax.audits.unlearning_probes import MAX_NEW_TOKENS
from mia_jax.audits.unlearning_rebuild import rebuild
from mia_jax.audits.unlearning_report import REBUILD_READS, render_outputs, to_markdown, write_outputs
from mia_jax.commands import options
from mia_jax.commands.audit_options import (claim_runs, from_option, model_options, out_option, rebuild_command,
                                            resolved)
from mia_jax.commands.options import RESUME
from mia_jax.errors import UserError
from mia_jax.models.sentence import SentenceEncoder

NAME = "audit-unlearning"
HELP = "which forget-set texts does an unlearned model still know? (Min-K%% ratio audit, Shi et al. 2023 section 7)"
RESUME_HINT = RESUME  # what Ctrl-C tells: the scoring runs keep every finished batch


def add_arguments(p) -> None:
    """The options of ``mia-jax audit-unlearning`` on the argparse parser ``p``."""
    p.add_argument("--original", help="the model before unlearning (HF folder, .gguf or a name); required "
                                       "unless --from")
    p.add_argument("--unlearned", help="the model after unlearning; required unless --from")
    p.add_argument("--texts", metavar="FORGET", type=data.data_input,
                   help="the forget set (.jsonl / .csv / .tsv / .parquet, or tfds:NAME[/CONFIG][:SPLIT] built in "
                        "--data-dir); required unless --from")
    from_option(p, "audit-unlearning", "from_dir",
                help="rebuild the report from an earlier --out folder (its unlearning.json, chunks.csv and "
                     "probes.jsonl, checked against its manifest.json; its config, not this command's options) "
                     "into --out (new, empty, an earlier rebuild of DIR, or DIR itself), without the models")
    options.text(p, "--texts (the encoding: of --qa too)")
    options.data_dir(p)
    out_option(p, "unlearning.md / .json, chunks.csv, ratios.png, probes.jsonl, manifest.json; the scoring runs in "
                  "OUT/original and OUT/unlearned")
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
    p.add_argument("--qa", metavar="FILE", type=data.data_input,
                   help="optional QA probes: JSONL/CSV with question and answer fields (or a TFDS dataset "
                        "tfds:NAME[/CONFIG][:SPLIT] built in --data-dir)")
    p.add_argument("--qa-question-field", default="question")
    p.add_argument("--qa-answer-field", default="answer")
    p.add_argument("--qa-max-new-tokens", type=entry.positive_int, default=QA_MAX_NEW_TOKENS)
    p.add_argument("--embed-model", metavar="PATH",
                   help="sentence-transformers folder (e.g. all-MiniLM-L6-v2) for embedding similarity")
    model_options(p, "OUT/original and OUT/unlearned")


def run(args) -> None:
    """``mia-jax audit-unlearning`` with the parsed ``args``: ``run_rebuild`` with ``--from``, else ``run_audit``."""
    if args.from_dir is not None:
        run_rebuild(args)
    else:
        run_audit(args)


def config_of(args) -> UnlearningConfig:
    """The audit's settings from the parsed options."""
    return UnlearningConfig(chunk_words=args.chunk_words, min_words=args.min_words, k=args.k, ratio=args.ratio,
                            max_probe=args.max_probe, prompt_words=args.prompt_words, n_samples=args.n_samples,
                            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            seed=args.seed, batch_size=args.batch_size, chunk_size=args.chunk_size,
                            qa_max_new_tokens=args.qa_max_new_tokens)


def run_audit(args) -> UnlearningResult:
    """The audit of ``args`` (``--original``, ``--unlearned``, ``--texts``, ...): every input checked and both
    models loaded before anything is written, then the folder and each model's scoring run claimed (resumed when
    the same), the outputs written and the report printed. Returns the result."""
    missing = [flag for flag, v in (("--original", args.original), ("--unlearned", args.unlearned),
                                    ("--texts", args.texts)) if v is None]
    if missing:
        raise UserError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required (or --from DIR to "
                        "rebuild the report of an earlier --out folder)")
    cfg = config_of(args)
    check_options(cfg)
    ds = data.load(args.texts, args.data_dir, args.text_field, None, encoding=args.encoding)
    chunks, _ = make_chunks(ds.texts, args.chunk_words, args.min_words)
    if not chunks:
        raise UserError(f"{args.texts}: no chunks: none of its {len(ds)} texts has {args.min_words} words "
                        "(--min-words)")
    qa, qa_files = _load_qa(args) if args.qa else (None, None)
    out = entry.check_out(args.out)
    load = dict(dtype=args.dtype, allow_download=args.allow_download)
    loaded = {"original": models.load(args.original, **load), "unlearned": models.load(args.unlearned, **load)}
    embedder = SentenceEncoder(args.embed_model, args.dtype) if args.embed_model else None
    fingerprint = audit_fingerprint(args, loaded, embedder, ds.files, qa_files=qa_files)
    # the folder is this audit's (or refused untouched); each model's scoring run is claimed on its own inside it
    inputs = [args.texts, args.qa, args.data_dir, args.original, args.unlearned, args.embed_model, *ds.files,
              *(qa_files or ()), *(f for m in loaded.values() for f in (m.source, *m.files)),
              *(embedder.files if embedder else ())]
    with rundir.claim(out, fingerprint, overwrite=args.overwrite, inputs=inputs), contextlib.ExitStack() as stack:
        run_dirs, resume = _claim_runs(args, stack, out, loaded, [c.text for c in chunks], ds.files)
        res = audit_unlearning(loaded["original"], loaded["unlearned"], ds.texts, cfg, qa=qa, embedder=embedder,
                               run_dirs=run_dirs, resume=resume, progress=not args.no_progress)
        meta = {"command": " ".join(sys.argv), "package_version": __version__, "data_files": ds.files,
                "models": {side: {"name": m.name, "source": m.source, "files": m.files, "dtype": m.dtype,
                                  "add_bos": m.add_bos, "max_length": m.max_length,
                                  "tokenizer_sha256": tokenizer_digest(m)} for side, m in loaded.items()},
                "embed_model": {"name": embedder.name, "files": embedder.files} if embedder else None}
        res.meta = meta
        write_outputs(res, out, meta)
    print(to_markdown(res))
    print(f"wrote {out}/", file=sys.stderr)
    return res


def _load_qa(args) -> tuple[tuple[list[str], list[str]], dict]:
    """((questions, answers), {file: sha256}) of ``--qa``; UserError for a file without questions or a row without
    a question or an answer."""
    qds = data.load(args.qa, args.data_dir, args.qa_question_field, None, encoding=args.encoding,
                    extra=(args.qa_answer_field,))
    answers = qds.extra[args.qa_answer_field]
    if not qds.texts:
        raise UserError(f"{args.qa}: no questions")
    bad = [i for i, (q, a) in enumerate(zip(qds.texts, answers))
           if not (q.strip() and isinstance(a, str) and a.strip())]
    if bad:
        raise UserError(f"{args.qa}: row {bad[0] + 1} has no {args.qa_question_field!r} or no "
                        f"{args.qa_answer_field!r} text (fields: --qa-question-field, --qa-answer-field)")
    return (qds.texts, answers), qds.files


def _claim_runs(args, stack, out: Path, loaded: dict, texts: list[str], data_files: dict) -> tuple[dict, dict]:
    """({side: run folder}, {side: resume?}) of each model's scoring run of the chunk ``texts``, each claimed in
    ``stack`` with the fingerprint of its texts and options."""
    methods = [min_k_method(args.k), "ppl"]
    def fingerprint_of(side):
        return runner.run_fingerprint(loaded[side], texts, None, methods, data_files=data_files, labeled=False,
                                      encoding=args.encoding, text_field=args.text_field,
                                      chunk_words=args.chunk_words, min_words=args.min_words,
                                      batch_size=args.batch_size, chunk_size=args.chunk_size, dtype=args.dtype)

    return claim_runs(stack, out, SIDES, fingerprint_of, args.overwrite)


# Options of `audit-unlearning` that are not in the folder's fingerprint, and why (every other one is)
NOT_IN_FINGERPRINT = ("from_dir", "out", "overwrite", "no_progress", "allow_download", "original", "unlearned",
                      "texts", "qa", "embed_model", "data_dir")  # the last six: by their files' SHA-256 instead


def audit_fingerprint(args, loaded: dict, embedder, data_files: dict, qa_files: dict | None) -> dict:
    """What makes an audit-unlearning folder (``rundir.claim``): both models' (``loaded``: {side: LoadedModel}), the
    ``embedder``'s and every data file's (``data_files``, ``qa_files``: {file: sha256}) SHA-256 and every option of
    ``args`` that can change a result; a folder holding anything else is refused. Returns the fingerprint dict."""
    options = {k: v for k, v in sorted(vars(args).items()) if k not in NOT_IN_FINGERPRINT and k != "command"}
    return {"command": "audit-unlearning", "models": {side: resolved(m.files) for side, m in loaded.items()},
            "embed_model": resolved(embedder.files) if embedder is not None else None,
            "data_files": resolved(data_files), "qa_files": resolved(qa_files), **options,
            "package_version": __version__}


def run_rebuild(args) -> UnlearningResult:
    """`mia-jax audit-unlearning --from DIR --out OUT` (:func:`audit_options.rebuild_command`): unlearning.json adds
    ``rebuilt`` (from where, the command, the package version). Returns the rebuilt result."""
    settings = {"--original": args.original, "--unlearned": args.unlearned, "--texts": args.texts, "--qa": args.qa,
                "--embed-model": args.embed_model}
    return rebuild_command("audit-unlearning", Path(args.from_dir), args.out, settings, rebuild,
                           lambda source, res: res.meta, render_outputs, REBUILD_READS, to_markdown)
