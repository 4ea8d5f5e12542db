"""The ``mia-jax`` command: one subcommand per module of :mod:`mia_jax.commands` (``eval``: labeled data -> scores +
metrics, ``score``: unlabeled texts, ``generate``, ``freq-table``: DC-PDD's reference frequencies,
``dataset-inference``: a p-value for a whole set, online detection's ``concat`` / ``window-metrics``, the audits
``audit-unlearning`` and ``audit-books``), run under the entry guard (:func:`mia_jax.runs.entry.run`)."""
from __future__ import annotations

import argparse

from mia_jax.runs import entry

PROG = "mia-jax"
_HINT: list[str] = []  # the Ctrl-C hint of the subcommand being run


def build_parser() -> argparse.ArgumentParser:
    """The ``mia-jax`` parser: a subparser per command module of :data:`mia_jax.commands.COMMANDS`, whose ``run``
    is the parsed arguments' ``func``."""
    parser = entry.ArgumentParser(prog=PROG, description="Pretraining-data detection for LLMs in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _commands():
        p = sub.add_parser(module.NAME, help=module.HELP, description=getattr(module, "DESCRIPTION", None))
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def _commands() -> list:
    """:data:`mia_jax.commands.COMMANDS`, imported here, under the guard: it loads JAX, and a Ctrl-C meanwhile is
    held until the import is done (an interrupted jaxlib import segfaulted), then one line."""
    with entry.sigint_deferred():
        from mia_jax.commands import COMMANDS
    return COMMANDS


def _main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    func = vars(args).pop("func")  # not an option: run.json and the fingerprints read vars(args)
    _HINT[:] = [next(getattr(m, "RESUME_HINT", "") for m in _commands() if m.NAME == args.command)]
    func(args)
    return 0


def main(argv=None) -> int:
    """``mia-jax`` with the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status: 0, 2 for a
    user error (one line), 130 for Ctrl-C (:func:`mia_jax.runs.entry.run`)."""
    _HINT.clear()
    return entry.run(PROG, _main, argv, resume_hint=lambda: "".join(_HINT[:1]))


def console() -> None:
    """The ``mia-jax`` console script: :func:`main` on ``sys.argv``, then the process ends without the interpreter's
    teardown (:func:`mia_jax.runs.entry.exit_now`)."""
    entry.exit_now(main())


if __name__ == "__main__":
    console()
