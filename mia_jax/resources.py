"""What some methods need besides the model and the texts, from the command line (the options of
``mia_jax.commands.scoring.add_method_options``): the objects handed to the runner (``resources`` for single-pass
scorers, ``pass_options`` for second passes) and the entries of the run's fingerprint that identify them.

- ``recall`` / ``con_recall``: prefix shots from a labeled file disjoint from the evaluated texts
  (``--recall-shots``, ``--recall-n-shots``, ``--recall-seed``; ``scorers.recall.prefix_shots``).
- ``samia`` / ``samia_zlib``: the sampling options (``--samia-samples``, ``--samia-seed``; the rest at the
  authors' defaults, ``mia_jax.samia``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from mia_jax import freq
from mia_jax.errors import UserError
from mia_jax.files import sha256
from mia_jax.scorers import parse_method
from mia_jax.scorers.base import check_resources

RECALL_METHODS = ("recall", "con_recall")


@dataclass
class Resources:
    resources: dict = field(default_factory=dict)  # runner.score_texts(resources=)
    pass_options: dict = field(default_factory=dict)  # runner.score_dataset(pass_options=)
    score_options: dict = field(default_factory=dict)  # runner.score_dataset(**) -> every score_texts call
    fingerprint: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)  # {path: SHA-256} of the files read


def build(args, methods: Sequence[str], texts: Sequence[str], loaded=None) -> Resources:
    """The resources of this run's ``methods`` from ``args``; a method whose resource is missing, or an option
    given for no method that uses it, is a UserError before anything is scored."""
    from mia_jax import data
    from mia_jax.scorers import recall

    out = Resources()
    wants_recall = any(m in RECALL_METHODS for m in methods)
    if args.recall_shots and not wants_recall:
        raise UserError("--recall-shots is given but neither 'recall' nor 'con_recall' is among --methods")
    if wants_recall:
        if not args.recall_shots:
            raise UserError("'recall' / 'con_recall' need prefix shots: add --recall-shots FILE (labeled texts "
                            "disjoint from the evaluated ones, e.g. held-out non-members and known members)")
        shots = data.load_records(args.recall_shots, args.text_field, getattr(args, "label_field", None) or "label",
                                  encoding=args.encoding)
        prefixes = recall.prefix_shots(shots.texts, shots.labels, texts, n_shots=args.recall_n_shots,
                                       seed=args.recall_seed)
        out.pass_options["recall_prefixes"] = prefixes
        out.fingerprint["recall_prefixes"] = recall.prefix_digest(prefixes)
        out.files.update(shots.files or {})
    if getattr(args, "window", None) is not None:
        from mia_jax.audits import windowed

        windowed.check_window(args.window, methods, loaded.max_length if loaded is not None else args.window + 1)
        out.score_options["window"] = args.window
        out.fingerprint["window"] = args.window
    if any(m in ("samia", "samia_zlib") for m in methods):
        if args.samia_samples < 1:
            raise UserError(f"--samia-samples must be at least 1, got {args.samia_samples}")
        out.pass_options["samia"] = {"n_samples": args.samia_samples, "seed": args.samia_seed}
        out.fingerprint["samia"] = dict(out.pass_options["samia"])
    wants_freq = any("freq_table" in getattr(parse_method(m)[0], "resources", ()) for m in methods)
    if args.freq_table and not wants_freq:
        raise UserError("--freq-table is given but no method among --methods uses it (dc_pdd)")
    if wants_freq:
        check_resources(methods, {"freq_table": args.freq_table})  # the option is missing: say how to make one
        table = freq.for_model(args.freq_table, loaded)  # refused unless the model's tokenizer counted it
        out.resources["freq_table"] = table
        out.fingerprint["freq_table"] = table.sha256()
        out.files[str(Path(args.freq_table).resolve())] = sha256(args.freq_table)
    return out
