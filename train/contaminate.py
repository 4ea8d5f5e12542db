"""Controlled contamination experiments (Shi et al. 2023, section 6): continued pretraining on a corpus with
inserted downstream examples, then detection of the inserted examples.

    python train/contaminate.py --config configs/contamination/tiny.yaml --out runs/contam-tiny
    python train/contaminate.py --config configs/contamination/cpu.yaml --out runs/contam-cpu train.lr=1e-5
    python train/contaminate.py --config configs/contamination/cpu.yaml --out runs/contam-cpu-lr --ablation lr

Without ``--ablation``: one run (Table 3, Table 7; Figure 5c too when ``corpus.occurrence`` is poisson or buckets).
``--ablation lr``: one run per ``ablation.lrs`` -> Table 4. ``size``: one run per ``ablation.background_tokens``
-> Figure 5a. ``news``: in-distribution news contaminants, one run per ``ablation.news_background`` -> Figure
5b. ``occurrence``: members inserted k times, k dealt evenly over ``corpus.occurrence_buckets`` -> Figure 5c. Each
run has its own sub-folder of ``--out``; re-running the same command resumes where it stopped.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
from jax.experimental.compilation_cache import compilation_cache

from mia_jax.runs import processes
from mia_jax.runs import entry, rundir
from mia_jax.engine import sharding
from mia_jax.models.checkpoint import cache_dir
from mia_jax.scorers import expand_methods
from train import experiment
from train.ablations import ABLATIONS, plan
from train.config import ExperimentConfig, load_config
from train.corpus import check_sizes
from train.placement import check_batch, memory_from_env
from train.records import RUN_FILES
from train.tables import rebuild

PROG = "python train/contaminate.py"
RESUME_HINT = ("run the same command again to resume (training from its last checkpoint, scoring from its last "
               "finished batch)")


def build_parser() -> entry.ArgumentParser:
    """The argument parser of ``python train/contaminate.py``."""
    p = entry.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=entry.input_file,
                   help="YAML config (configs/contamination/{tiny,cpu,paper}.yaml); defaults if omitted")
    p.add_argument("--out", required=True, type=entry.out_dir,
                   help="output folder (an interrupted run in it resumes)")
    p.add_argument("--ablation", choices=list(ABLATIONS), help="run a sweep instead of a single run")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run or sweep in --out (a folder of another run of this toolkit; never one "
                        "holding an input, one inside a run or a folder of anything else)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--mesh", metavar="SPEC",
                   help="train and score on a device mesh, as `mia-jax --mesh`: comma-separated axis=size over data, "
                        "fsdp, model, e.g. data=8 or fsdp=4,model=2 (same as train.mesh=...; default: every device on "
                        "data). A run may resume on another mesh")
    p.add_argument("--distributed", action="store_true",
                   help="multi-host: call jax.distributed.initialize() first (also when $MIA_JAX_DISTRIBUTED=1; see "
                        "the README's multi-host section for $MIA_JAX_COORDINATOR etc.); every host runs the same "
                        "command")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. train.lr=1e-5 corpus.n_positives=50")
    return p


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    processes.initialize_distributed(args.distributed)  # before anything touches a device
    run(args)
    return 0


def main(argv=None) -> int:
    """Runs the command with ``argv`` (default: sys.argv[1:]); returns the exit status."""
    return entry.run(PROG, _main, argv, resume_hint=RESUME_HINT)


def enable_compilation_cache() -> None:
    """JAX's persistent compilation cache ($MIA_JAX_CACHE/jax, else ~/.cache/mia_jax/jax), unless one is set
    already: the scoring passes (base, trained, lowercase, reference) and the runs of a sweep compile identical
    programs, which are then compiled once (and once across runs of the command)."""
    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        compilation_cache.reset_cache()  # take effect even if this process compiled something before


def run(args) -> Path:
    """Runs (or resumes) the run or sweep that the parsed ``args`` describe; returns its output folder."""
    cfg = load_config(args.config, args.overrides)
    if args.no_progress:
        cfg.train.progress = False
    if args.mesh:
        cfg.train.mesh = args.mesh
    methods = expand_methods(cfg.score.methods, cfg.score.k)  # validated before any work
    check_batch(sharding.make_mesh(cfg.train.mesh), cfg.train.batch_size, cfg.train.grad_accum)  # before any write
    check_before_writing(cfg, args.ablation)
    out = entry.check_out(args.out)
    # what defines the sweep: the config (less display-only keys) and, for a sweep, its ablation settings
    fingerprint = {"ablation": args.ablation, "config": experiment.comparable(cfg)}
    if args.ablation:
        fingerprint["sweep"] = dataclasses.asdict(cfg.ablation)
    inputs = [args.config, cfg.model.path, *cfg.corpus.background, cfg.corpus.data_dir, cfg.corpus.news.path]
    with rundir.claim(out, fingerprint, overwrite=args.overwrite, inputs=inputs, hint=experiment.HINT):
        enable_compilation_cache()
        return _sweep(args, cfg, methods, out)


def check_before_writing(cfg: ExperimentConfig, ablation: str | None) -> None:
    """Everything a run can be refused for without loading a model, checked before ``--out`` is claimed (a refused
    command leaves the folder as it was): the model resolvable, its context long enough for train.seq_len, the
    corpus of every run of the sweep possible with the data at hand, the environment parsed."""
    memory_from_env()
    experiment.check_model(cfg)
    for _, run_cfg in plan(cfg, ablation):
        check_sizes(run_cfg.corpus)


def _sweep(args, cfg: ExperimentConfig, methods: list[str], out: Path) -> Path:
    runs = []
    for sub, run_cfg in plan(cfg, args.ablation):
        folder = out / sub if sub else out
        if sub:
            print(f"== run {sub} ==", file=sys.stderr, flush=True)
        runs.append((sub, run_cfg, folder, experiment.run_experiment(run_cfg, folder, cache=out)))

    if args.ablation:  # the sweep's table / figure, from the runs' per-example scores (as `python -m train.tables`)
        text = ""
        if processes.is_main_process():
            # the sweep's fingerprint (its ablation: train/ablations.py) sealed with its runs' records
            rundir.seal(out, [rundir.FINGERPRINT, *(f"{sub}/{name}" for sub, *_ in runs for name in RUN_FILES)])
            text = rebuild(out)
    else:
        text = (out / "table3.md").read_text()
        if (out / "fig5c.md").exists():
            text += "\n" + (out / "fig5c.md").read_text()
    print(text)
    print(f"wrote {out}/", file=sys.stderr)
    return out


if __name__ == "__main__":
    sys.exit(main())
