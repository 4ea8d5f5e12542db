"""The ``mia-jax`` command: ``eval`` (labeled data -> scores + metrics), ``score`` (unlabeled texts), ``generate``,
``freq-table`` (DC-PDD's reference frequencies), ``dataset-inference`` (a p-value for a whole set), the audits
(``audit-books``, ``audit-unlearning``) and online detection's ``concat`` / ``window-metrics``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mia_jax import blind, dataset_inference, entry, eval_report, freq, resources, rundir
from mia_jax.audits import books, concat, unlearning
from mia_jax.errors import UserError
from mia_jax.batching import TOKENS_PER_BATCH, check_tokens_per_batch
from mia_jax.scorers import DEFAULT_K, DEFAULT_METHODS, expand_methods


PROG = "mia-jax"
RESUME = ("every finished batch is in the output folder's passes/*.jsonl: run the same command again to resume from "
          "them")
_COMMAND: list[str] = []  # the subcommand being run (its Ctrl-C message)


def _common(p: argparse.ArgumentParser, labeled: bool) -> None:
    p.add_argument("--model", default="smollm2",
                   help="a Hugging Face folder, a .gguf file, or an offline name (smollm2). Default: smollm2")
    p.add_argument("--tokenizer", type=entry.input_file, help="tokenizer.json to use instead of the model's own")
    p.add_argument("--ref-model", help="reference model for the 'ref' method (Smaller-Ref); its own tokenizer is used")
    p.add_argument("--neighbor-mlm", metavar="PATH", type=entry.input_dir,
                   help="BERT / RoBERTa masked-LM folder (config.json, *.safetensors, tokenizer.json) that proposes "
                        "the word replacements of the 'neighbor' method (default: the target model proposes them)")
    p.add_argument("--n-neighbors", type=entry.positive_int, default=10,
                   help="neighbours per text for the 'neighbor' method (default: 10; Mattern et al. use 25)")
    p.add_argument("--neighbor-seed", type=entry.nonneg_int, default=0,
                   help="seed of the neighbour generator (default: 0)")
    resources.add_options(p)
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="parameter and forward dtype; the statistics are float32 either way (default: bfloat16 on "
                        "GPU and TPU, float32 on CPU)")
    _allow_download(p)
    src = p.add_mutually_exclusive_group(required=not labeled)
    src.add_argument("--data", type=entry.input_file, help="a .jsonl / .csv / .tsv / .parquet file")
    if labeled:
        src.add_argument("--benchmark", choices=["wikimia", "wikimia-concat", "mimir"],
                         help="a benchmark (default: wikimia; wikimia-concat: Min-K%%++ section 4.4, non-member + "
                              "member WikiMIA texts of 32 / 64 / 128 words, scored per --window)")
        p.add_argument("--length", type=entry.positive_int, default=32,
                       help="WikiMIA text length: 32, 64, 128 or 256 (wikimia-concat draws 32, 64, 128)")
        p.add_argument("--domain", default="wikipedia_en", help="MIMIR domain (arxiv, github, pile_cc, ...)")
        p.add_argument("--data-dir", type=entry.input_dir, help="MIMIR ngram_7_0.2 folder (default: $MIA_JAX_MIMIR or "
                                          "../shared/data/mimir/ngram_7_0.2)")
    p.add_argument("--encoding", default="utf-8",
                   help="text encoding of --data (default: utf-8; e.g. latin-1, cp1252, utf-16)")
    p.add_argument("--text-field", default="input")
    if labeled:
        p.add_argument("--label-field", default="label")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS),
                   help="scorers; a bare min_k / max_k / min_k_pp expands to one method per --k "
                        f"(default: {' '.join(DEFAULT_METHODS)})")
    p.add_argument("--k", nargs="+", type=entry.fraction, default=list(DEFAULT_K), help="fractions for Min-K%% methods")
    p.add_argument("--tokens-per-batch", type=entry.positive_int,
                   help="token slots of one scoring step: texts are packed into rows of this budget (default: "
                        f"{TOKENS_PER_BATCH['cpu']} on CPU, {TOKENS_PER_BATCH['gpu']} on GPU and TPU)")
    p.add_argument("--batch-size", type=entry.positive_int, default=8,
                   help="texts per step of the passes that read one text per row (gradnorm, generated neighbours)")
    p.add_argument("--chunk-size", type=entry.positive_int, default=8192,
                   help="vocabulary chunk of the statistics kernel")
    p.add_argument("--compilation-cache", metavar="DIR|off",
                   help="JAX's persistent compilation cache (default: $MIA_JAX_COMPILATION_CACHE or "
                        "~/.cache/mia_jax/jax; 'off' turns it off)")
    p.add_argument("--mesh", metavar="SPEC",
                   help="shard the model and the batches over a device mesh: comma-separated axis=size over the axes "
                        "data, fsdp, model (e.g. data=4,model=2; an axis left out is 1, except data, which takes the "
                        "remaining devices; 'auto' = every device on data). Default: one device (on several "
                        "processes: auto)")
    p.add_argument("--distributed", action="store_true",
                   help="multi-host: call jax.distributed.initialize() first (also when $MIA_JAX_DISTRIBUTED=1); "
                        "the coordinator comes from $MIA_JAX_COORDINATOR, $MIA_JAX_NUM_PROCESSES, $MIA_JAX_PROCESS_ID "
                        "or JAX's cluster detection (TPU pods, SLURM, Open MPI). Run the same command on every host")
    p.add_argument("--limit", type=entry.positive_int, help="score only the first N texts")
    p.add_argument("--out", type=entry.out_dir,
                   help="output folder (default: runs/<data>-<model>); an interrupted run of the same job in it "
                        "resumes, a different one is refused")
    p.add_argument("--overwrite", action="store_true", help="empty --out and start afresh even if it holds a run")
    p.add_argument("--no-progress", action="store_true")


def _allow_download(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-download", action="store_true",
                   help="let a --model that is not a local path be fetched from the Hugging Face Hub (also: an "
                        "hf://org/name model). Default: local paths and packaged names only, no network")


def build_parser() -> argparse.ArgumentParser:
    parser = entry.ArgumentParser(prog=PROG, description="Pretraining-data detection for LLMs in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="score labeled texts and evaluate the detectors (AUROC, TPR@FPR, ROC plot)")
    _common(ev, labeled=True)
    ev.add_argument("--n-bootstrap", type=entry.nonneg_int, default=1000,
                    help="bootstrap resamples for the 95%% CIs")
    ev.add_argument("--seed", type=entry.nonneg_int, default=0,
                    help="bootstrap and blind-baseline cross-validation seed")
    ev.add_argument("--no-blind", action="store_true",
                    help="skip the model-free bag-of-words baseline that is otherwise reported beside the detectors")
    ev.add_argument("--compare", nargs=2, action="append", metavar=("A", "B"), default=[],
                    help="also report the paired bootstrap of method A minus method B on the same texts (AUROC and "
                         "TPR@5%%FPR differences with 95%% CIs and a verdict: 'A > B', 'B > A' or 'not "
                         "distinguishable'); repeatable; a bare min_k etc. names its single --k")
    sc = sub.add_parser("score", help="score unlabeled texts (no metrics)")
    _common(sc, labeled=False)
    _add_generate(sub)
    freq.add_parser(sub)
    dataset_inference.add_parser(sub)
    concat.add_parsers(sub)
    unlearning.add_parser(sub)
    books.add_parser(sub)
    return parser


def _load_data(args, labeled: bool):
    from mia_jax import data

    if labeled and args.benchmark == "mimir":
        ds = data.mimir(args.domain, args.data_dir)
    elif labeled and args.benchmark == "wikimia-concat":
        if args.window is None:
            raise UserError("--benchmark wikimia-concat is evaluated per window: add --window 32 (the paper's)")
        ds = concat.wikimia_concat()
        ds.extra = {args.member_from_field: ds.extra["member_from"]}
    elif labeled and not args.data:
        ds = data.wikimia(args.length)
    else:
        extra = (args.member_from_field,) if args.window is not None else ()
        ds = data.load_records(args.data, args.text_field, args.label_field if labeled else None,
                               encoding=args.encoding, extra=extra)
    if args.limit is not None:
        ds.texts = ds.texts[: args.limit]
        ds.labels = ds.labels[: args.limit] if ds.labels is not None else None
        ds.extra = {k: v[: args.limit] for k, v in ds.extra.items()}
    return ds


# Every option of `eval` / `score` either goes into the run's fingerprint (`_fingerprint`) or is listed here
# with the reason it cannot change a record; tests check that no option is in neither.
NOT_IN_FINGERPRINT = {
    "command": "eval and score write different records: `labeled` is in the fingerprint",
    "model": "identified by its files' SHA-256 (model_files): a name and a path to the same files agree",
    "tokenizer": "its file is among model_files",
    "ref_model": "identified by its files' SHA-256 (ref_model_files)",
    "allow_download": "only how a model is found; the files found are fingerprinted",
    "neighbor_mlm": "part of the neighbour generator's config (neighbors)",
    "n_neighbors": "part of the neighbour generator's config (neighbors)",
    "neighbor_seed": "part of the neighbour generator's config (neighbors)",
    "data": "a path: the file is fingerprinted by resolved path and SHA-256 (data_files), its texts (texts_sha256)",
    "benchmark": "chooses the data files (data_files) and texts (texts_sha256)",
    "length": "chooses the data files (data_files) and texts (texts_sha256)",
    "domain": "chooses the data files (data_files) and texts (texts_sha256)",
    "data_dir": "chooses the data files (data_files) and texts (texts_sha256)",
    "k": "expanded into the method names (methods)",
    "distributed": "how the processes start; the mesh they form is in the fingerprint",
    "n_bootstrap": "metrics only: recomputed from the records at the end of every run, resumed or not",
    "seed": "metrics and blind baseline only: recomputed from the records at the end of every run",
    "no_blind": "metrics only: the blind baseline never reads or writes a record",
    "compare": "metrics only: paired comparisons are computed from the records at the end of every run",
    "out": "the folder itself",
    "overwrite": "decides what happens to the folder, not what a record holds",
    "no_progress": "display only",
    "compilation_cache": "where compiled programs are kept: the same program either way",
    **resources.NOT_IN_FINGERPRINT,
}


def _fingerprint(args, labeled: bool, ds, loaded, ref, generator, methods, mesh, res) -> dict:
    """What makes a run: every input that can change a record (see NOT_IN_FINGERPRINT for the rest)."""
    from mia_jax import runner, sharding

    return runner.run_fingerprint(
        loaded, ds.texts, ds.labels, methods, ref=ref, neighbors=generator, data_files=ds.files, labeled=labeled,
        encoding=args.encoding, text_field=args.text_field, label_field=args.label_field if labeled else None,
        limit=args.limit, batch_size=args.batch_size, tokens_per_batch=args.tokens_per_batch,
        chunk_size=args.chunk_size, dtype=args.dtype,
        mesh=sharding.mesh_str(mesh) if mesh is not None else None, **res.fingerprint)


def _neighbor_generator(args, loaded):
    """The 'neighbor' method's generator: the --neighbor-mlm masked LM, else the target model itself."""
    from mia_jax import neighbors

    if args.neighbor_mlm:
        return neighbors.MLMNeighbors(args.neighbor_mlm, n=args.n_neighbors, seed=args.neighbor_seed,
                                      dtype=args.dtype)
    return neighbors.SelfNeighbors(loaded, n=args.n_neighbors, seed=args.neighbor_seed,
                                   batch_size=args.batch_size)


def run(args, labeled: bool) -> Path:
    import jax

    from mia_jax import compilation, models, runner, sharding

    sharding.initialize_distributed(args.distributed)  # before anything touches a device
    if args.out:
        rundir.check_path(args.out)
    check_tokens_per_batch(args.tokens_per_batch)
    blind_asked = blind.NAME in args.methods
    methods = expand_methods([m for m in args.methods if m != blind.NAME], args.k)  # validate before loading
    if not methods:
        raise UserError(f"give at least one model-based method besides {blind.NAME} (which is reported with any "
                        "labeled eval anyway)")
    if blind_asked and not labeled:
        raise UserError(f"{blind.NAME} needs labels: use mia-jax eval")
    compare = _comparisons(args, methods) if labeled else []
    ds = _load_data(args, labeled)
    if "ref" in methods and not args.ref_model:
        raise UserError("method 'ref' needs a reference model: add --ref-model PATH_OR_NAME")
    mesh = sharding.make_mesh(args.mesh) if args.mesh or jax.process_count() > 1 else None
    if jax.process_count() > 1 and "neighbor" in methods:
        raise UserError("the 'neighbor' method is not supported on several processes yet; run it on one host")
    compilation.enable(args.compilation_cache)
    args.dtype = args.dtype or runner.default_dtype()
    args.tokens_per_batch = args.tokens_per_batch or runner.default_tokens_per_batch()
    load = models.load if mesh is None else (lambda name, **kw: sharding.load_sharded(name, mesh, **kw))  # noqa: E731
    loaded = load(args.model, dtype=args.dtype, tokenizer_path=args.tokenizer, allow_download=args.allow_download)
    ref = (load(args.ref_model, dtype=args.dtype, allow_download=args.allow_download)
           if args.ref_model and "ref" in methods else None)
    generator = _neighbor_generator(args, loaded) if "neighbor" in methods else None
    res = resources.build(args, methods, ds.texts, loaded)
    out = rundir.check_path(args.out or f"runs/{ds.name}-{loaded.name}")
    fingerprint = _fingerprint(args, labeled, ds, loaded, ref, generator, methods, mesh, res)
    with rundir.claim(out, fingerprint, overwrite=args.overwrite) as resume:
        if resume:
            print(f"resuming the run in {out}", file=sys.stderr)
        eval_report.score_and_report(args, labeled, out, resume, ds, loaded, ref, generator, methods, mesh,
                                     blind_asked, compare, res)
    return out


def _comparisons(args, methods: list[str]) -> list[tuple[str, str]]:
    """The (A, B) pairs of --compare as method names of this run, checked before anything is loaded or written."""
    pairs = []
    for pair in args.compare:
        names = []
        for name in pair:
            try:
                expanded = expand_methods([name], args.k)
            except UserError:
                expanded = [name]
            if len(expanded) != 1 or expanded[0] not in methods:
                raise UserError(f"--compare {' '.join(pair)}: {name!r} is not one of this run's methods "
                                f"({', '.join(methods)})")
            names.append(expanded[0])
        if names[0] == names[1]:
            raise UserError(f"--compare {' '.join(pair)}: compares a method with itself")
        pairs.append((names[0], names[1]))
    if pairs and args.n_bootstrap < 1:
        raise UserError(f"--compare needs --n-bootstrap of at least 1, got {args.n_bootstrap}")
    return pairs


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help="generate text from prompts with a KV cache (greedy by default)")
    g.add_argument("--model", default="smollm2",
                   help="a Hugging Face folder, a .gguf file, or an offline name (smollm2). Default: smollm2")
    g.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    g.add_argument("--n", type=entry.positive_int, default=20, help="new tokens per prompt (default: 20)")
    g.add_argument("--temperature", type=entry.nonneg_float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=entry.positive_int, help="sample from the k most likely tokens")
    g.add_argument("--top-p", type=entry.fraction, help="sample from the smallest set of tokens with probability >= p")
    g.add_argument("--seed", type=entry.nonneg_int, default=0, help="sampling seed (default: 0)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="parameter dtype")
    g.add_argument("--no-stop", action="store_true", help="do not stop a prompt at the model's EOS token")
    _allow_download(g)


def generate_command(args) -> None:
    """`mia-jax generate`: print each prompt followed by its completion."""
    from mia_jax import generate, models

    loaded = models.load(args.model, dtype=args.dtype, allow_download=args.allow_download)
    gen = generate.generate_ids(loaded, generate.encode_prompts(loaded, args.prompt), max_new_tokens=args.n,
                                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                stop_at_eos=not args.no_stop)
    for i, prompt in enumerate(args.prompt):
        if gen.truncated[i]:
            print(f"mia-jax: prompt {i + 1} was cut to its last {len(gen.prompt_ids[i])} tokens to fit the "
                  f"context of {loaded.max_length}", file=sys.stderr)
        if i:
            print("---")
        print(prompt + loaded.tokenizer.decode(gen.completion_ids(i), skip_special_tokens=True))


def _main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    _COMMAND[:] = [args.command]
    if args.command == "generate":
        generate_command(args)
    elif args.command == "freq-table":
        freq.command(args)
    elif args.command == "dataset-inference":
        dataset_inference.command(args)
    elif args.command == "audit-books":
        books.command(args)
    elif args.command == "audit-unlearning":
        unlearning.command(args)
    elif args.command in ("concat", "window-metrics"):
        concat.command(args)
    else:
        run(args, labeled=args.command == "eval")
    return 0


def main(argv=None) -> int:
    """``mia-jax``: exit 0, 2 for a user error (one line), 130 for Ctrl-C (:func:`mia_jax.entry.run`)."""
    _COMMAND.clear()
    return entry.run(PROG, _main, argv,
                     resume_hint=lambda: "" if _COMMAND[:1] in ([], ["generate"]) else RESUME)


if __name__ == "__main__":
    sys.exit(main())
