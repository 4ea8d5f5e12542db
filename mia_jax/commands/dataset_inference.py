"""``mia-jax dataset-inference``: was this set of texts trained on? Both sets scored into resumable runs (or their
scores read from earlier runs), then the test of :mod:`mia_jax.evaluation.dataset_inference` and its report."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from mia_jax import __version__, data, models
from mia_jax.runs import entry, rundir
from mia_jax.methods import neighbors
from mia_jax.engine import runner
from mia_jax.commands import options
from mia_jax.commands.options import RESUME
from mia_jax.commands.request import CommandRequest, DType
from mia_jax.evaluation.dataset_inference import (DEFAULT_K, DEFAULT_METHODS, MULTI_PASS_OK, Result, dataset_inference,
                                       load_features, results_path, run_model)
from mia_jax.errors import UserError
from mia_jax.runs.files import sha256
from mia_jax.scorers import expand_methods, is_multi_pass, parse_method

NAME = "dataset-inference"
HELP = "was this set of texts trained on? A p-value (Maini et al. 2024)"
RESUME_HINT = RESUME


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``mia-jax dataset-inference`` on ``p``."""
    p.add_argument("--suspect", metavar="FILE", type=data.data_input,
                   help="the suspect texts (.jsonl / .csv / .tsv / .parquet, or tfds:NAME[/CONFIG][:SPLIT] built in "
                        "--data-dir; --text-field)")
    p.add_argument("--validation", metavar="FILE", type=data.data_input,
                   help="texts of the same distribution known not to be trained on (same formats)")
    p.add_argument("--suspect-scores", metavar="RESULTS",
                   help="instead of --suspect: a mia-jax run's results.jsonl (or its folder) scored by the same model")
    p.add_argument("--validation-scores", metavar="RESULTS", help="instead of --validation: the same for it")
    options.model(p, dtype="float32")
    p.add_argument("--ref-model", help="reference model of the 'ref' method, if among --methods")
    p.add_argument("--n-neighbors", type=entry.positive_int, default=10,
                   help="neighbours per text of the 'neighbor' method")
    options.text(p, "--suspect / --validation")
    options.data_dir(p)
    p.add_argument("--methods", nargs="+",
                   help=f"the per-text scores used as features (default when scoring: {' '.join(DEFAULT_METHODS)}; "
                        f"from --*-scores files: every method both files have); single-pass methods and "
                        f"{', '.join(MULTI_PASS_OK)}")
    p.add_argument("--k", nargs="+", type=entry.fraction, default=list(DEFAULT_K),
                   help=f"fractions of Min-K%%-type methods (default, the authors': {' '.join(map(str, DEFAULT_K))})")
    options.batches(p)
    p.add_argument("--seed", type=entry.nonneg_int, default=0, help="seed of the split into halves (default: 0)")
    options.run_folder(p, required=True, redo="rescore OUT/suspect and OUT/validation",
                       out_help="output folder: the scores of each set in OUT/suspect and OUT/validation (resumable "
                                "runs, as mia-jax score writes them), OUT/dataset_inference.json and .md; a folder of "
                                "another run is refused")


@dataclass(frozen=True)
class InferenceRequest(CommandRequest):
    """``mia-jax dataset-inference`` as asked: each set as texts to score (``suspect``, ``validation``) or as the
    scores of an earlier run (``*_scores``), the model and how it scores them, the test's ``seed`` and the output
    folder; every field is named after its option's destination."""
    COMMAND: ClassVar[str] = NAME
    suspect: Path | str | None
    validation: Path | str | None
    suspect_scores: str | None
    validation_scores: str | None
    model: str
    dtype: DType
    allow_download: bool
    ref_model: str | None
    n_neighbors: int
    encoding: str
    text_field: str | None
    data_dir: Path | None
    methods: tuple[str, ...] | None
    k: tuple[float, ...]
    batch_size: int
    chunk_size: int | None
    seed: int
    out: Path
    overwrite: bool
    no_progress: bool


def _methods(request: InferenceRequest) -> list[str] | None:
    if request.methods is None and request.suspect_scores and request.validation_scores:
        return None  # every method the two files share
    methods = expand_methods(list(request.methods or DEFAULT_METHODS), list(request.k))
    if request.suspect_scores and request.validation_scores:
        return methods
    bad = [m for m in methods if (m not in MULTI_PASS_OK if is_multi_pass(m) else
                                  getattr(parse_method(m)[0], "resources", ()))]
    if bad:
        raise UserError(f"dataset-inference scores single-pass methods and {', '.join(MULTI_PASS_OK)} itself, not "
                        f"{', '.join(bad)}: score both sets with `mia-jax score --methods ...` (and the options they "
                        "need) and pass the runs with --suspect-scores / --validation-scores")
    if "ref" in methods and not request.ref_model:
        raise UserError("method 'ref' needs a reference model: add --ref-model PATH_OR_NAME")
    return methods


def _score(request: InferenceRequest, side: str, ds, methods: list[str], models_box: dict) -> Path:
    """Score one set into OUT/<side> (a resumable run, as mia-jax score writes it); its results.jsonl."""
    r = request
    if not models_box:
        load = dict(dtype=r.dtype, allow_download=r.allow_download)
        models_box["model"] = models.load(r.model, **load)
        models_box["ref"] = models.load(r.ref_model, **load) if "ref" in methods else None
        models_box["neighbors"] = (neighbors.SelfNeighbors(models_box["model"], n=r.n_neighbors, seed=0,
                                                           batch_size=r.batch_size)
                                   if "neighbor" in methods else None)
    loaded, ref, gen = models_box["model"], models_box["ref"], models_box["neighbors"]
    out = entry.check_out(Path(r.out) / side)
    fingerprint = runner.run_fingerprint(loaded, ds.texts, None, methods, ref=ref, neighbors=gen,
                                         data_files=ds.files, labeled=False, encoding=r.encoding,
                                         text_field=r.text_field, batch_size=r.batch_size,
                                         chunk_size=r.chunk_size, dtype=r.dtype)
    with rundir.claim(out, fingerprint, overwrite=r.overwrite) as resume:
        if resume:
            print(f"resuming the {side} run in {out}", file=sys.stderr)
        runner.score_dataset(loaded, ds.texts, methods, ref=ref, neighbors=gen, out_dir=out, resume=resume,
                             batch_size=r.batch_size, chunk_size=r.chunk_size, progress=not r.no_progress)
    return out / "results.jsonl"


# Options of `dataset-inference` that are not in the folder's fingerprint, and why (every other one is)
NOT_IN_FINGERPRINT = ("out", "overwrite", "no_progress", "allow_download",  # not what is computed
                      "suspect", "validation", "suspect_scores", "validation_scores", "data_dir",  # files' SHA-256
                      "methods", "k")  # expanded into the method names


def _fingerprint(request: InferenceRequest, methods: list[str], paths: dict, datasets: dict) -> dict:
    """What makes a dataset-inference folder (``rundir.claim``): every input file's SHA-256 (texts or scores), the
    methods and every other option (the models by name here; each scoring run's own fingerprint has their files)."""
    options = {k: v for k, v in sorted(request.options().items()) if k not in NOT_IN_FINGERPRINT}
    return {"command": "dataset-inference", "methods": methods,
            "scores_files": {side: {str(p.resolve()): sha256(p)} for side, p in sorted(paths.items())},
            "data_files": {side: {str(Path(f).resolve()): h for f, h in ds.files.items()}
                           for side, ds in sorted(datasets.items())},
            **options, "package_version": __version__}


def run(args: argparse.Namespace) -> Result:
    """``mia-jax dataset-inference`` with the parsed ``args`` made into its request
    (:meth:`InferenceRequest.from_args`, the only reader of ``args``), then :func:`run_request`."""
    return run_request(InferenceRequest.from_args(args))


def run_request(request: InferenceRequest) -> Result:
    """``mia-jax dataset-inference`` as ``request`` asks: score both sets (or read their scores), run the test,
    write OUT/dataset_inference.json and .md, print the markdown and, last, ``p-value: X``; returns the test's
    result. Every input is checked before anything is written."""
    r = request
    sides = ("suspect", "validation")
    for side in sides:
        if bool(getattr(r, side)) == bool(getattr(r, f"{side}_scores")):
            raise UserError(f"give exactly one of --{side} FILE (texts to score) and --{side}-scores RESULTS")
    if r.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {r.batch_size}")
    if r.n_neighbors < 1:
        raise UserError(f"--n-neighbors must be at least 1, got {r.n_neighbors}")
    methods = _methods(r)
    paths = {side: results_path(getattr(r, f"{side}_scores")) for side in sides if getattr(r, f"{side}_scores")}
    if methods is None:  # both from files: the methods they share, in the suspect file's order
        other = load_features(paths["validation"])[0]
        methods = [m for m in load_features(paths["suspect"])[0] if m in other]
        if not methods:
            raise UserError(f"{paths['suspect']} and {paths['validation']} share no method")
    feats = {side: load_features(p, methods)[1] for side, p in paths.items()}
    datasets = {side: data.load(getattr(r, side), r.data_dir, r.text_field, None, encoding=r.encoding)
                for side in sides if side not in paths}
    out = entry.check_out(r.out)
    # the folder is this command's (or refused untouched); each set's scoring run is claimed on its own inside it
    inputs = [r.suspect, r.validation, r.suspect_scores, r.validation_scores, *paths.values(),
              r.data_dir, r.model, r.ref_model, *(f for ds in datasets.values() for f in ds.files)]
    with rundir.claim(out, _fingerprint(r, methods, paths, datasets), overwrite=r.overwrite, inputs=inputs):
        box: dict = {}
        for side, ds in datasets.items():
            paths[side] = _score(r, side, ds, methods, box)
            feats[side] = load_features(paths[side], methods)[1]
        model_s, model_v = run_model(paths["suspect"]), run_model(paths["validation"])
        if model_s and model_v and model_s != model_v:
            raise UserError(f"{paths['suspect']} and {paths['validation']} were scored by different models or "
                            f"settings ({model_s} vs {model_v}); dataset inference compares one model's scores")
        res = dataset_inference(feats["suspect"], feats["validation"], methods, seed=r.seed)
        if len(datasets) == 2:
            res.n_shared_texts = len(set(datasets["suspect"].texts) & set(datasets["validation"].texts))
            if res.n_shared_texts:
                res.notes.append(f"Warning: {res.n_shared_texts} distinct texts are in both sets; the validation set "
                                 "should be texts the model did not see.")
        if not (model_s and model_v):
            res.notes.append("Note: the model of a scores file could not be read from its run's config.json; both "
                             "sets must be scored by the same model.")
        md = res.to_markdown()
        record = {**asdict(res), "methods": methods, "inputs": {k: str(p) for k, p in paths.items()},
                  "data_files": {k: ds.files for k, ds in datasets.items()}, "model": model_s or model_v,
                  "package_version": __version__, "command": " ".join(sys.argv)}
        (out / "dataset_inference.json").write_text(json.dumps(record, indent=2) + "\n")
        (out / "dataset_inference.md").write_text(f"{md}\np-value: {res.p_value:.6g}\n")
    print(md)
    print(f"p-value: {res.p_value:.6g}")
    return res
