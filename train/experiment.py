"""One contamination run: corpus -> base-model scores -> continued pretraining -> trained-model scores -> metrics.

Folder of a run (every step resumes from what is already there; a folder holding a run of another
config is refused)::

    run_config.json       the resolved config (compared on resume; see mia_jax.runs.rundir)
    corpus/               documents.jsonl, eval.jsonl, manifest.json (train/corpus.py)
    train/                Orbax checkpoints (with the data position), fingerprint.json, metrics.jsonl, batches.jsonl
                          (train/trainer.py), speed.jsonl (per-step wall time, tokens/s, MFU; train/speed.py);
                          data/: the packed sequences as ArrayRecord (train/grain_input.py)
    model/                the trained model in the Hugging Face layout (loads with mia_jax.models.load)
    scores/trained/       runner.score_dataset output for the trained model (with `ref` = the base model)
    examples.jsonl.gz     per-example scores (trained and base model, every method, the blind baseline), from which
                          `python -m train.tables --from DIR` rebuilds metrics.json, the tables and roc.png
    metrics.json          {"trained"|"base": {dataset: {method: metrics.evaluate(...)}}, "blind", "average",
                          "gain", "best"} (train/tables.run_results)
    table3.*, table7.*    AUROC / TPR@5%FPR [95% CI] per dataset and method (train/tables.py)
    run.json              versions, model, corpus summary, training throughput, timings

Base-model scores live in ``<cache>/base_scores/<key>/`` (shared by the runs of an ablation that score the
same texts with the same base model).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import jax

from mia_jax.runs import processes
from mia_jax import __version__, models
from mia_jax.runs import rundir
from mia_jax.engine import runner, sharding
from mia_jax.errors import UserError
from mia_jax.runs.files import write_jsonl
from mia_jax.methods.neighbors import SelfNeighbors
from mia_jax.scorers import expand_methods
from train import placement
from train.config import ExperimentConfig
from train.corpus import build_corpus
from train.data import Batches, separator_id
from train.export import save_hf
from train.grain_input import packed_records
from train.records import EXAMPLES, RUN_FILES, example_rows, write_examples
from train.run_tables import run_results, write_run
from train.tiny import write_tiny_model
from train.traps import trap_pool

# display-only keys, and the mesh: a run may resume on another mesh (the trainer restores its checkpoint onto it);
# the train keys are the trainer's (train.trainer.NOT_IN_FINGERPRINT)
NOT_COMPARED = {("train", "progress"), ("train", "checkpoint_every"), ("train", "keep_checkpoints"), ("train", "mesh"),
                ("train", "peak_tflops")}


def comparable(cfg: ExperimentConfig) -> dict:
    """The part of ``cfg`` that defines a run, as a dict: compared on resume (display-only keys and the mesh left out).
    """
    d = dataclasses.asdict(cfg)
    d.pop("ablation")
    d.pop("name")
    for section, key in NOT_COMPARED:
        d[section].pop(key)
    if d["train"]["objective"] == "lm":  # as before the field existed: older runs still resume
        d["train"].pop("objective")
    if d["train"]["sampler"] == "numpy":  # likewise train.sampler: runs made before grain resume with "numpy"
        d["train"].pop("sampler")
    if d["corpus"]["variant"] != "traps":  # likewise corpus.traps: only the traps variant reads it
        d["corpus"].pop("traps")
    return d


HINT = "use another --out, the original config, or --overwrite to start afresh"


def base_model_path(cfg: ExperimentConfig, cache: Path) -> str:
    """The base model to load: ``tiny`` is created once in ``cache/base_model`` (and checked on reuse)."""
    if cfg.model.path != "tiny":
        return cfg.model.path
    folder = cache / "base_model"
    want = dataclasses.asdict(cfg.model.tiny)
    marker = folder / "tiny_config.json"
    if marker.exists():
        if json.loads(marker.read_text()) != want:
            raise UserError(f"{folder} holds a tiny model of another model.tiny config; use another --out or "
                            "--overwrite")
        return str(folder)
    write_tiny_model(folder, cfg.model.tiny)
    return str(folder)




def model_context(path: str | Path) -> int | None:
    """The context length a Hugging Face model folder declares (config.json: max_position_embeddings, n_positions,
    also under text_config); None when it is not a folder or declares none (checked once the model is loaded)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, OSError):
        return None  # reported by the loader
    for section in (raw, raw.get("text_config") if isinstance(raw, dict) else None):
        if isinstance(section, dict):
            for key in ("max_position_embeddings", "n_positions"):
                if isinstance(section.get(key), int) and not isinstance(section.get(key), bool):
                    return section[key]
    return None


def check_seq_len(seq_len: int, context: int | None, what: str) -> None:
    """UserError when train.seq_len exceeds the model's context (positions beyond it were never trained)."""
    if context is not None and seq_len > context:
        raise UserError(f"train.seq_len={seq_len} exceeds the context of {what} ({context} tokens); set "
                        f"train.seq_len={context} or lower")


def check_model(cfg: ExperimentConfig) -> None:
    """The base model resolvable (a packaged name, an existing folder or .gguf file) and train.seq_len within its
    context, without loading it: checked before the run folder is claimed."""
    if cfg.model.path == "tiny":
        check_seq_len(cfg.train.seq_len, cfg.model.tiny.max_position_embeddings, "the tiny model "
                      "(model.tiny.max_position_embeddings)")
        return
    path = models.resolve_model(cfg.model.path)
    check_seq_len(cfg.train.seq_len, model_context(path), f"model {cfg.model.path}")


def neighbor_generator(base, methods: list[str], cfg: ExperimentConfig):
    """The `neighbor` method's generator when it is configured: the base model proposes the word replacements
    (``neighbors.SelfNeighbors``; no offline mask-filling model is available), the same neighbours for the base and
    the trained model's scoring. None otherwise."""
    if "neighbor" not in methods:
        return None
    return SelfNeighbors(base, n=cfg.score.n_neighbors, seed=cfg.score.seed, batch_size=cfg.score.batch_size)


def _eval_key(loaded, texts: list[str], labels: list[int], methods: list[str], cfg: ExperimentConfig, mesh,
              neighbors=None) -> str:
    """The base-model scores' folder key: a hash of the run fingerprint of that scoring (everything that can change
    one of its records, as for any other run)."""
    sharded = {} if mesh is None else {"mesh": sharding.mesh_str(mesh)}
    fingerprint = runner.run_fingerprint(loaded, texts, labels, methods, batch_size=cfg.score.batch_size,
                                         dtype=loaded.dtype, neighbors=neighbors, **sharded)
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def score(loaded, texts, labels, methods, out_dir: Path, cfg: ExperimentConfig, ref=None,
          report: dict | None = None, mesh=None, neighbors=None) -> list[dict]:
    """``runner.score_dataset`` into ``out_dir``, resuming from its finished batches (the folder is keyed by
    everything that can change a record: the run's fingerprint, or ``_eval_key`` for base scores)."""
    return runner.score_dataset(loaded, texts, methods, ref=ref, neighbors=neighbors, labels=labels,
                                out_dir=out_dir, resume=True,
                                batch_size=cfg.score.batch_size, progress=cfg.train.progress, report=report,
                                mesh=mesh)


def seed_ref_pass(base_main: Path, ref_path: Path) -> None:
    """The `ref` method's reference is the base model, whose pass over the same eval texts (same tokenizer, batch
    plan and program) the base scoring has just made: its ``loss`` records are written as the ref pass's finished
    records, which ``runner.score_texts`` then reuses instead of computing the same numbers again (the run's
    scoring report counts them as reused). Nothing is written when the ref pass has records already, or when the
    base pass holds no ``loss``."""
    if ref_path.exists() or not base_main.exists():
        return
    recs = [json.loads(line) for line in base_main.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not recs or any("loss" not in r["scores"] for r in recs):
        return
    ref_path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(ref_path, [{k: ({"loss": v["loss"]} if k == "scores" else v) for k, v in r.items() if k != "label"}
                           for r in recs])


def run_experiment(cfg: ExperimentConfig, out: str | Path, cache: str | Path | None = None,
                   on_step=None) -> dict:
    """Run (or resume) one contamination run in ``out``; returns its metrics dict (also in metrics.json).
    The folder is claimed first (``rundir.claim``: lock, ``run_config.json`` compared before anything is
    written; a folder holding a run of another config is refused)."""
    out = Path(out)
    with rundir.claim(out, comparable(cfg), file="run_config.json", hint=HINT):
        return _run(cfg, out, Path(cache) if cache is not None else out, on_step)


def train_and_export(base, data, tcfg, sep: int, out: Path, *, on_step=None, mesh=None) -> dict:
    """Train ``base`` on the packed ``data`` (``PackedData``, or ``grain_input.RecordData`` read by grain; train config
    ``tcfg``; checkpoints in ``out/train``, resumed when the run is the same) and export the result to ``out/model``
    (Hugging Face layout); a finished run with the same fingerprint is not trained again. Returns the training
    summary (steps, tokens, losses, tokens/s)."""
    from train.trainer import apply_params, fingerprint, train  # Orbax and Optax: loaded only to train

    main = processes.is_main_process()
    batches = Batches(data, tcfg.batch_size, tcfg.grad_accum, tcfg.epochs, tcfg.shuffle, tcfg.seed, tcfg.sampler)
    run_fp = fingerprint(tcfg, model_files=base.files, data=data.digest(), separator=sep)
    done_path = out / "train" / "done.json"
    model_dir = out / "model"
    if done_path.exists() and json.loads(done_path.read_text()).get("fingerprint") == run_fp and \
            (model_dir / "config.json").exists():
        return json.loads(done_path.read_text())["train"]
    t0 = time.perf_counter()
    result = train(base.model, batches, tcfg, out / "train", run_fp, on_step=on_step, mesh=mesh)
    trained_model = apply_params(base.model, result.params)
    if main:
        save_hf(model_dir, trained_model, base.tokenizer)
    train_info = {"steps": result.steps, "tokens": int(sum(m["tokens"] for m in result.metrics)),
                  "sequences": data.n_sequences, "tokens_per_second": result.tokens_per_second,
                  "seconds": time.perf_counter() - t0, "resumed_from": result.resumed_from,
                  "first_loss": result.metrics[0]["loss"], "final_loss": result.metrics[-1]["loss"]}
    if main:
        done_path.write_text(json.dumps({"fingerprint": run_fp, "train": train_info}, indent=2) + "\n")
    del trained_model
    processes.sync("model exported")
    return train_info


def _run(cfg: ExperimentConfig, out: Path, cache: Path, on_step) -> dict:
    """One run in ``out`` (claimed): corpus, base scores, training, trained scores, tables; returns its results."""
    timings = {}
    methods = expand_methods(cfg.score.methods, cfg.score.k)
    base_methods = [m for m in methods if m != "ref"]

    t0 = time.perf_counter()
    mesh = sharding.make_mesh(cfg.train.mesh)
    # on one device the plain load and jit; on a mesh every tensor streams to its sharding (training and scoring)
    scoring_mesh = mesh if mesh.size > 1 else None
    main = processes.is_main_process()

    def load(path):
        if scoring_mesh is None:
            return models.load(path, dtype=cfg.model.dtype)
        return sharding.load_sharded(path, mesh, dtype=cfg.model.dtype)

    base = load(base_model_path(cfg, cache))
    corpus, sep, data = _corpus_and_data(cfg, base, mesh, out, main)
    texts, labels = [r["text"] for r in corpus.eval], [r["label"] for r in corpus.eval]
    timings["corpus_s"] = time.perf_counter() - t0
    _log(f"corpus: {len(corpus.documents)} documents, {corpus.manifest['tokens']['total']} tokens "
         f"({100 * corpus.manifest['contamination_rate']:.1f}% contaminant), {data.n_sequences} sequences of "
         f"{cfg.train.seq_len}")

    t0 = time.perf_counter()
    generator = neighbor_generator(base, methods, cfg)
    base_dir = cache / "base_scores" / _eval_key(base, texts, labels, base_methods, cfg, scoring_mesh, generator)
    scoring = {"base": {}, "trained": {}}  # per pass: texts reused from disk / computed here
    base_records = score(base, texts, labels, base_methods, base_dir, cfg, report=scoring["base"], mesh=scoring_mesh,
                         neighbors=generator)
    timings["score_base_s"] = time.perf_counter() - t0

    train_info = train_and_export(base, data, cfg.train, sep, out, on_step=on_step, mesh=mesh)
    _log(f"training: {train_info['steps']} steps, loss {train_info['first_loss']:.3f} -> "
         f"{train_info['final_loss']:.3f}, {train_info['tokens_per_second'] or 0:.0f} tokens/s")

    t0 = time.perf_counter()
    if "ref" in methods and main:
        seed_ref_pass(base_dir / "passes" / "main.jsonl", out / "scores" / "trained" / "passes" / "ref.jsonl")
    processes.sync("ref pass seeded")
    trained = load(str(out / "model"))
    trained_records = score(trained, texts, labels, methods, out / "scores" / "trained", cfg, ref=base,
                            report=scoring["trained"], mesh=scoring_mesh, neighbors=generator)
    timings["score_trained_s"] = time.perf_counter() - t0

    examples = example_rows(corpus.eval, trained_records, base_records, seed=cfg.score.seed)
    info = {
        "command": " ".join(sys.argv), "config": dataclasses.asdict(cfg), "package_version": __version__,
        "jax_version": jax.__version__, "device": str(jax.devices()[0]), "platform": platform.platform(),
        "base_model": {"name": base.name, "source": base.source, "files": base.files, "add_bos": base.add_bos},
        "mesh": sharding.mesh_str(mesh), "processes": jax.process_count(), "separator_token_id": sep,
        "methods": methods,
        "neighbors": {"name": generator.name, "config": generator.config} if generator is not None else None,
        "corpus": {k: corpus.manifest[k] for k in ("tokens", "contamination_rate", "n_documents",
                                                   "n_inserted_segments")},
        "train": train_info, "scoring": scoring, "timings_s": timings,
    }
    info = json.loads(json.dumps(info, default=str))
    results = _write_run(out, examples, info, cfg, methods, base_methods, main)
    return dict(results, examples=examples, config=info["config"], corpus=info["corpus"])


def _corpus_and_data(cfg: ExperimentConfig, base, mesh, out: Path, main: bool) -> tuple:
    """(corpus, separator id, packed training data) of a run on the loaded ``base`` model, after the checks of the
    model and the mesh; process 0 writes the corpus to ``out/corpus``, the packed sequences go to ``out/train/data``
    (ArrayRecord, read by grain: ``grain_input.packed_records``)."""
    check_seq_len(cfg.train.seq_len, base.max_length, f"model {cfg.model.path}")
    placement.check(base.model, mesh, cfg.train.batch_size, cfg.train.grad_accum, cfg.train.seq_len,
                    cfg.train.remat, cfg.train.loss_chunk)  # a mesh, batch or memory that cannot work: refused first
    sep = separator_id(base.tokenizer, base.eos_token_id, cfg.train.separator)
    pool = None
    if cfg.corpus.variant == "traps":  # the trap pool: sampled from the base model (train/traps.py)
        pool = trap_pool(base, cfg.corpus, sep, out / "traps", cfg.train.progress)
    corpus = build_corpus(cfg.corpus, base.tokenizer, trap_pool=pool)
    if main:
        corpus.write(out / "corpus")
    # process 0 writes the file, the others open it (or write their own copy when the folder is not shared)
    return corpus, sep, packed_records(out / "train" / "data", corpus.documents, base.tokenizer, cfg.train.seq_len,
                                       sep)


def _write_run(out: Path, examples: list[dict], info: dict, cfg: ExperimentConfig, methods: list[str],
               base_methods: list[str], main: bool) -> dict:
    """The run's results (``run_tables.run_results``); process 0 also writes its files and seals them."""
    if not main:  # on several processes every one holds every record; process 0 writes
        return run_results(examples, methods, base_methods, n_bootstrap=cfg.score.n_bootstrap, seed=cfg.score.seed)
    # the per-example scores and run.json first: every table is then what `python -m train.tables --from` rebuilds
    write_examples(out / EXAMPLES, examples)
    (out / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    results = write_run(out, examples, info)
    rundir.seal(out, list(RUN_FILES))  # the record `python -m train.tables --from` checks its inputs against
    return results


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
