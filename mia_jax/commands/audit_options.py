"""What the two audit commands (``audit-books``, ``audit-unlearning``) share: the options that load their models and
keep their scoring runs, ``--from`` and ``--out``, the claim of their scoring runs inside the audit's folder, the
resolved file hashes of their fingerprints and the ``--from`` rebuild (:func:`rebuild_command`)."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Callable

from mia_jax import __version__
from mia_jax.runs import entry, rundir
from mia_jax.audits.common import write_sealed
from mia_jax.errors import UserError


def from_option(p, command: str, dest: str, help: str) -> None:
    """``--from DIR`` (stored as ``dest``) on the parser ``p``: an earlier --out folder of ``command`` to rebuild
    (``help``: what it reads and writes)."""
    p.add_argument("--from", dest=dest, metavar="DIR",
                   type=entry.source_dir(command, example=f"results/audits/{command.removeprefix('audit-')}"),
                   help=help)


def out_option(p, outputs: str) -> None:
    """The required ``--out`` folder on the parser ``p`` (``outputs``: what it holds, for the help)."""
    p.add_argument("--out", required=True, type=entry.out_dir,
                   help=f"output folder: {outputs}. A folder of another run is refused")


def model_options(p, runs: str) -> None:
    """The options both audit commands share, on the parser ``p``: how their models are loaded and their scoring
    runs (``runs``: where they are, for the help of ``--overwrite``) kept."""
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="parameter dtype")
    p.add_argument("--batch-size", type=entry.positive_int, default=8)
    p.add_argument("--chunk-size", type=entry.positive_int,
                   help="vocabulary chunk of the statistics kernel (default: 1024 on the CPU, 8192 on accelerators)")
    p.add_argument("--allow-download", action="store_true",
                   help="let a model that is not a local path be fetched from the Hugging Face Hub")
    p.add_argument("--overwrite", action="store_true",
                   help=f"replace the run in --out (even a run of another command) and rescore {runs} afresh; a "
                        "folder that holds an input of this run, lies inside another run or holds no run is refused")
    p.add_argument("--no-progress", action="store_true")


def claim_runs(stack: contextlib.ExitStack, out: Path, names, fingerprint_of: Callable[[str], dict],
               overwrite: bool) -> tuple[dict, dict]:
    """({name: run folder}, {name: resume?}) of the scoring runs ``out/<name>`` for each of ``names``, each claimed
    in ``stack`` with ``fingerprint_of(name)`` (``overwrite``: start it afresh); a resumed one is said on stderr."""
    run_dirs, resume = {}, {}
    for name in names:
        run_dirs[name] = entry.check_out(out / name)
        fp = fingerprint_of(name)
        resume[name] = stack.enter_context(rundir.claim(run_dirs[name], fp, overwrite=overwrite))
        if resume[name]:
            print(f"resuming the {name} run in {run_dirs[name]}", file=sys.stderr)
    return run_dirs, resume


def resolved(files: dict | None) -> dict | None:
    """{absolute path: sha256} of ``files`` ({file: sha256}) for a fingerprint; None stays None."""
    return {str(Path(f).resolve()): h for f, h in files.items()} if files is not None else None


def write_rebuild(out: Path, source: Path, command: str, files: dict, reads) -> None:
    """Write a ``--from`` rebuild's ``files`` ({name: content}) into ``out`` (``rundir.rebuild_into``: new, empty,
    an earlier rebuild of ``source``, or ``source`` itself) and seal it over the files it was rebuilt from
    (``reads``)."""
    with rundir.rebuild_into(out, [source], command):
        write_sealed(out, files, reads)


def rebuild_command(command: str, source: Path, out: Path, settings: dict, rebuild: Callable, meta_of: Callable,
                    render_outputs: Callable, reads, to_markdown: Callable):
    """``mia-jax COMMAND --from SOURCE --out OUT``: refuse the ``settings`` given ({flag: value}, None when left
    out: a rebuild takes its folder's settings), ``rebuild(SOURCE)`` (which checks what it reads), then every output
    (``render_outputs(result, meta)``, ``meta`` = ``meta_of(SOURCE, result)`` plus where and how it was rebuilt)
    written into OUT (:func:`write_rebuild`: new, empty, an earlier rebuild of SOURCE, or SOURCE itself; every
    output is computed before any is written) and sealed over ``reads``; the report (``to_markdown``) printed.
    Returns the rebuilt result."""
    given = [flag for flag, value in settings.items() if value is not None]
    if given:
        raise UserError(f"--from rebuilds with the settings of the {command} run in its folder, without models or "
                        f"data: leave out {', '.join(given)}")
    out = entry.check_out(out)
    res = rebuild(source)
    meta = {**meta_of(source, res), "rebuilt": {"command": " ".join(sys.argv), "from": str(source),
                                                "package_version": __version__}}
    write_rebuild(out, source, command, render_outputs(res, meta), reads)
    print(to_markdown(res))
    print(f"wrote {out}/ (rebuilt from {source}/)", file=sys.stderr)
    return res
