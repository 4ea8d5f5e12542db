"""``mia-jax audit-unlearning``: which forget-set texts does an unlearned model still know? The options, the audit
run (inputs checked and both models loaded before anything is written; the folder and its scoring runs claimed) and
the ``--from`` rebuild. The audit itself: :mod:`mia_jax.audits.unlearning`."""
from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

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
from mia_jax.commands.request import AuditRunRequest, CommandRequest
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


@dataclass(frozen=True)
class UnlearningInputs:
    """What is audited: the models before and after unlearning (``--original``, ``--unlearned``), the forget set
    (``--texts``, read from ``--data-dir`` with ``--encoding`` / ``--text-field``) and the sentence encoder of the
    similarity (``--embed-model``)."""
    original: str | None
    unlearned: str | None
    texts: Path | str | None
    encoding: str
    text_field: str | None
    data_dir: Path | None
    embed_model: str | None


@dataclass(frozen=True)
class UnlearningSettings:
    """How: the chunks (``--chunk-words``, ``--min-words``), the Min-K% ratio that flags them (``--k``,
    ``--ratio``) and the story-completion probes of the flagged ones (``--max-probe``, ``--prompt-words``,
    ``--n-samples``, ``--max-new-tokens``, ``--temperature``, ``--top-k``, ``--seed``)."""
    chunk_words: int
    min_words: int
    k: float
    ratio: float
    max_probe: int
    prompt_words: int
    n_samples: int
    max_new_tokens: int | None
    temperature: float
    top_k: int | None
    seed: int


@dataclass(frozen=True)
class QARequest:
    """The optional QA probes: ``--qa`` (its ``--qa-question-field`` / ``--qa-answer-field``), answered in
    ``--qa-max-new-tokens`` tokens."""
    qa: Path | str | None
    qa_question_field: str
    qa_answer_field: str
    qa_max_new_tokens: int


@dataclass(frozen=True)
class UnlearningRequest(CommandRequest):
    """``mia-jax audit-unlearning`` as asked: an audit (``inputs``, ``settings``, ``qa``, ``run``) into ``--out``,
    or the rebuild of the audit in ``--from`` (``from_dir``)."""
    COMMAND: ClassVar[str] = NAME
    inputs: UnlearningInputs
    settings: UnlearningSettings
    qa: QARequest
    run: AuditRunRequest
    from_dir: Path | None
    out: Path


def run(args: argparse.Namespace) -> None:
    """``mia-jax audit-unlearning`` with the parsed ``args`` made into its request
    (:meth:`UnlearningRequest.from_args`, the only reader of ``args``): ``run_rebuild`` with ``--from``, else
    ``run_audit``."""
    request = UnlearningRequest.from_args(args)
    if request.from_dir is not None:
        run_rebuild(request)
    else:
        run_audit(request)


def config_of(request: UnlearningRequest) -> UnlearningConfig:
    """The audit's settings from the request."""
    s = request.settings
    return UnlearningConfig(chunk_words=s.chunk_words, min_words=s.min_words, k=s.k, ratio=s.ratio,
                            max_probe=s.max_probe, prompt_words=s.prompt_words, n_samples=s.n_samples,
                            max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                            seed=s.seed, batch_size=request.run.batch_size, chunk_size=request.run.chunk_size,
                            qa_max_new_tokens=request.qa.qa_max_new_tokens)


def run_audit(request: UnlearningRequest) -> UnlearningResult:
    """The audit of ``request`` (``--original``, ``--unlearned``, ``--texts``, ...): every input checked and both
    models loaded before anything is written, then the folder and each model's scoring run claimed (resumed when
    the same), the outputs written and the report printed. Returns the result."""
    i, r = request.inputs, request.run
    missing = [flag for flag, v in (("--original", i.original), ("--unlearned", i.unlearned),
                                    ("--texts", i.texts)) if v is None]
    if missing:
        raise UserError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required (or --from DIR to "
                        "rebuild the report of an earlier --out folder)")
    cfg = config_of(request)
    check_options(cfg)
    ds = data.load(i.texts, i.data_dir, i.text_field, None, encoding=i.encoding)
    chunks, _ = make_chunks(ds.texts, cfg.chunk_words, cfg.min_words)
    if not chunks:
        raise UserError(f"{i.texts}: no chunks: none of its {len(ds)} texts has {cfg.min_words} words "
                        "(--min-words)")
    qa, qa_files = _load_qa(request.qa, i) if request.qa.qa else (None, None)
    out = entry.check_out(request.out)
    load = dict(dtype=r.dtype, allow_download=r.allow_download)
    loaded = {"original": models.load(i.original, **load), "unlearned": models.load(i.unlearned, **load)}
    embedder = SentenceEncoder(i.embed_model, r.dtype) if i.embed_model else None
    fingerprint = audit_fingerprint(request, loaded, embedder, ds.files, qa_files=qa_files)
    # the folder is this audit's (or refused untouched); each model's scoring run is claimed on its own inside it
    inputs = [i.texts, request.qa.qa, i.data_dir, i.original, i.unlearned, i.embed_model, *ds.files,
              *(qa_files or ()), *(f for m in loaded.values() for f in (m.source, *m.files)),
              *(embedder.files if embedder else ())]
    with rundir.claim(out, fingerprint, overwrite=r.overwrite, inputs=inputs), contextlib.ExitStack() as stack:
        run_dirs, resume = _claim_runs(request, stack, out, loaded, [c.text for c in chunks], ds.files)
        res = audit_unlearning(loaded["original"], loaded["unlearned"], ds.texts, cfg, qa=qa, embedder=embedder,
                               run_dirs=run_dirs, resume=resume, progress=not r.no_progress)
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


def _load_qa(q: QARequest, inputs: UnlearningInputs) -> tuple[tuple[list[str], list[str]], dict]:
    """((questions, answers), {file: sha256}) of ``--qa`` (read from ``inputs``' --data-dir with its --encoding);
    UserError for a file without questions or a row without a question or an answer."""
    qds = data.load(q.qa, inputs.data_dir, q.qa_question_field, None, encoding=inputs.encoding,
                    extra=(q.qa_answer_field,))
    answers = qds.extra[q.qa_answer_field]
    if not qds.texts:
        raise UserError(f"{q.qa}: no questions")
    bad = [i for i, (question, a) in enumerate(zip(qds.texts, answers))
           if not (question.strip() and isinstance(a, str) and a.strip())]
    if bad:
        raise UserError(f"{q.qa}: row {bad[0] + 1} has no {q.qa_question_field!r} or no "
                        f"{q.qa_answer_field!r} text (fields: --qa-question-field, --qa-answer-field)")
    return (qds.texts, answers), qds.files


def _claim_runs(request: UnlearningRequest, stack, out: Path, loaded: dict, texts: list[str],
                data_files: dict) -> tuple[dict, dict]:
    """({side: run folder}, {side: resume?}) of each model's scoring run of the chunk ``texts``, each claimed in
    ``stack`` with the fingerprint of its texts and options."""
    i, s, r = request.inputs, request.settings, request.run
    methods = [min_k_method(s.k), "ppl"]

    def fingerprint_of(side):
        return runner.run_fingerprint(loaded[side], texts, None, methods, data_files=data_files, labeled=False,
                                      encoding=i.encoding, text_field=i.text_field,
                                      chunk_words=s.chunk_words, min_words=s.min_words,
                                      batch_size=r.batch_size, chunk_size=r.chunk_size, dtype=r.dtype)

    return claim_runs(stack, out, SIDES, fingerprint_of, r.overwrite)


# Options of `audit-unlearning` that are not in the folder's fingerprint, and why (every other one is)
NOT_IN_FINGERPRINT = ("from_dir", "out", "overwrite", "no_progress", "allow_download", "original", "unlearned",
                      "texts", "qa", "embed_model", "data_dir")  # the last six: by their files' SHA-256 instead


def audit_fingerprint(request: UnlearningRequest, loaded: dict, embedder, data_files: dict,
                      qa_files: dict | None) -> dict:
    """What makes an audit-unlearning folder (``rundir.claim``): both models' (``loaded``: {side: LoadedModel}), the
    ``embedder``'s and every data file's (``data_files``, ``qa_files``: {file: sha256}) SHA-256 and every option of
    the ``request`` that can change a result; a folder holding anything else is refused. Returns the fingerprint
    dict."""
    options = {k: v for k, v in sorted(request.options().items()) if k not in NOT_IN_FINGERPRINT}
    return {"command": "audit-unlearning", "models": {side: resolved(m.files) for side, m in loaded.items()},
            "embed_model": resolved(embedder.files) if embedder is not None else None,
            "data_files": resolved(data_files), "qa_files": resolved(qa_files), **options,
            "package_version": __version__}


def run_rebuild(request: UnlearningRequest) -> UnlearningResult:
    """`mia-jax audit-unlearning --from DIR --out OUT` (:func:`audit_options.rebuild_command`): unlearning.json adds
    ``rebuilt`` (from where, the command, the package version). Returns the rebuilt result."""
    i = request.inputs
    settings = {"--original": i.original, "--unlearned": i.unlearned, "--texts": i.texts, "--qa": request.qa.qa,
                "--embed-model": i.embed_model}
    return rebuild_command("audit-unlearning", Path(request.from_dir), request.out, settings, rebuild,
                           lambda source, res: res.meta, render_outputs, REBUILD_READS, to_markdown)
