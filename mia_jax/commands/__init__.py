"""The subcommands of ``mia-jax``, one module each, in the order ``mia-jax --help`` lists them (:data:`COMMANDS`).

A command module defines ``NAME`` (the subcommand), ``HELP`` (its one line in ``mia-jax --help``),
``add_arguments(parser)`` and ``run(args)`` (which makes the parsed ``args`` into the command's frozen request, e.g.
a :class:`mia_jax.commands.request.CommandRequest` beside it, and passes only that down); optionally
``DESCRIPTION`` (the paragraph of its own ``--help``) and ``RESUME_HINT`` (what Ctrl-C tells the user; default:
nothing). :func:`mia_jax.cli.build_parser` makes one subparser per module and :func:`mia_jax.cli.main` runs the
chosen one. The options several commands share are declared once in :mod:`mia_jax.commands.options`. To add a
command: write its module here and list it in :data:`COMMANDS`."""
from mia_jax.commands import (audit_books, audit_unlearning, concat, dataset_inference, datasets, freq_table,
                              generate, score, window_metrics)
from mia_jax.commands import eval as eval_command

COMMANDS = [eval_command, score, generate, freq_table, dataset_inference, concat, window_metrics, audit_unlearning,
            audit_books, datasets]
