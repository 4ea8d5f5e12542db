"""What some methods need besides the model and the texts, from the command line, one registry (:data:`NEEDS`):
for each need, its options (of ``mia-jax eval`` / ``score``, added by
``mia_jax.commands.scoring.add_method_options``), why each option is not in the run's fingerprint as given, and
its builder: the objects handed to the runner (``resources`` for single-pass scorers, ``pass_options`` for second
passes, ``score_options`` for every scoring call) and the entries of the run's fingerprint that identify them.

- ``recall``: ``recall`` / ``con_recall``: prefix shots from a labeled file disjoint from the evaluated texts
  (``--recall-shots``, ``--recall-n-shots``, ``--recall-seed``; ``methods.recall.prefix_shots``).
- ``window``: online detection, every method also scored per window (``--window`` and the report's options;
  ``mia_jax.engine.windowed``).
- ``samia``: ``samia`` / ``samia_zlib``: the sampling options (``--samia-samples``, ``--samia-seed``; the rest at
  the authors' defaults, ``mia_jax.methods.samia``).
- ``ngram_coverage``: ``ngram_coverage``: its sampling and n-gram options (``--ngram-samples``, ``--ngram-seed``,
  ``--ngram-min-n``, ``--ngram-sampling``; the rest at the authors' defaults, ``mia_jax.methods.ngram_coverage``).
- ``freq_table``: every method whose scorer reads a ``freq_table`` (``dc_pdd``): ``--freq-table``.
- ``acmia``: every method whose scorer reads ACMIA's temperature (``acmia_ac``, ``acmia_derivac``, ``acmia_normac``):
  ``--acmia-temperature`` (``scorers.acmia``).
- ``tag_tab``: ``tag_tab``'s keywords per sentence: ``--tag-tab-k`` (``scorers.tagtab``).
- ``infilling``: ``infilling``'s fraction and future tokens: ``--infilling-k``, ``--infilling-future``
  (``methods.infilling``).
- ``em_mia``: ``em_mia``'s candidate prefixes and iterations: ``--em-mia-prefixes``, ``--em-mia-iterations``,
  ``--em-mia-seed`` (``methods.em_mia``).

A new method with an option adds its entry here (:class:`Need`: options, builder, fingerprint entries); :func:`build`
runs every entry in order, each builder reading the needs' options from one frozen
:class:`~mia_jax.methods.options.MethodOptions` (:func:`method_options`), never the command line itself.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from mia_jax import data
from mia_jax.runs import entry
from mia_jax.runs.options import dests_of
from mia_jax.methods import freq
from mia_jax.engine import windowed
from mia_jax.errors import UserError
from mia_jax.runs.files import sha256
from mia_jax.scorers import acmia, parse_method, tagtab
from mia_jax.methods import em_mia, infilling, recall, sampling
from mia_jax.methods.options import MethodOptions, TextFields
from mia_jax.scorers.base import check_resources

RECALL_METHODS = ("recall", "con_recall")


@dataclass
class Resources:
    """What ``build`` makes for a run: the runner's ``resources`` and ``pass_options``, the options of every
    ``score_texts`` call, and the fingerprint entries that identify them."""
    resources: dict = field(default_factory=dict)  # runner.score_texts(resources=)
    pass_options: dict = field(default_factory=dict)  # runner.score_dataset(pass_options=)
    score_options: dict = field(default_factory=dict)  # runner.score_dataset(**) -> every score_texts call
    fingerprint: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)  # {path: SHA-256} of the files read


@dataclass(frozen=True)
class Need:
    """What some methods need besides the model and the texts. ``add_arguments(p)``: its options on ``p``;
    ``not_in_fingerprint``: {option dest: why the option, as given, is not an entry of the run's fingerprint};
    ``build(options, methods, texts, loaded, out)``: ``options`` a :class:`MethodOptions` (every need's options,
    frozen, read as ``options.<dest>``; ``options.fields``: how the evaluated data is read), checks the options
    against the run's ``methods`` (a UserError
    before anything is scored: a method whose resource is missing, an option given for no method that uses it) and
    adds what the runner is handed to ``out`` (a :class:`Resources`), with the ``fingerprint`` entries that
    identify it."""

    name: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    build: Callable[..., None]
    fingerprint: tuple[str, ...]
    not_in_fingerprint: dict[str, str]


def recall_options(p: argparse.ArgumentParser) -> None:
    """``--recall-shots``, ``--recall-n-shots`` and ``--recall-seed`` on ``p``."""
    p.add_argument("--recall-shots", metavar="FILE", type=entry.input_file,
                   help="labeled texts (JSONL / CSV; --text-field / --label-field) whose non-members (label 0) and "
                        "members (label 1) make the prefixes of 'recall' and 'con_recall'; must not share a text "
                        "with the evaluated data")
    p.add_argument("--recall-n-shots", type=entry.positive_int, default=10, help="shots per prefix (default: 10)")
    p.add_argument("--recall-seed", type=entry.nonneg_int, default=0, help="seed of the shots' draw (default: 0)")


def build_recall(options, methods: Sequence[str], texts: Sequence[str], loaded, out: Resources) -> None:
    """The prefixes of ``recall`` / ``con_recall`` (``out.pass_options["recall_prefixes"]``, their digest in the
    fingerprint) drawn from ``options.recall_shots`` against the evaluated ``texts``."""
    wants_recall = any(m in RECALL_METHODS for m in methods)
    if options.recall_shots and not wants_recall:
        raise UserError("--recall-shots is given but neither 'recall' nor 'con_recall' is among --methods")
    if not wants_recall:
        return
    if not options.recall_shots:
        raise UserError("'recall' / 'con_recall' need prefix shots: add --recall-shots FILE (labeled texts "
                        "disjoint from the evaluated ones, e.g. held-out non-members and known members)")
    fields = options.fields
    shots = data.load_records(options.recall_shots, fields.text_field, fields.label_field or "label",
                              encoding=fields.encoding)
    prefixes = recall.prefix_shots(shots.texts, shots.labels, texts, n_shots=options.recall_n_shots,
                                   seed=options.recall_seed)
    out.pass_options["recall_prefixes"] = prefixes
    out.fingerprint["recall_prefixes"] = recall.prefix_digest(prefixes)
    out.files.update(shots.files or {})


def window_options(p: argparse.ArgumentParser) -> None:
    """``--window``, ``--window-method``, ``--window-threshold`` and ``--member-from-field`` on ``p``."""
    p.add_argument("--window", type=entry.positive_int, metavar="N",
                   help="online detection: also score every N-token chunk of each text from the same forward pass "
                        "(Min-K%%++ section 4.4 uses 32); single-pass methods only")
    p.add_argument("--window-method", help="the method whose window scores flag a text's first member window "
                                           "(default: min_k_pp@<first k> when scored, else the first method)")
    p.add_argument("--window-threshold", type=float,
                   help="flag windows scoring above this (default with labels: the score at 5%% FPR on the "
                        "non-member windows; the data's --member-from-field gives window labels)")
    p.add_argument("--member-from-field", default="member_from",
                   help="field holding the character offset where a text's member part begins (window labels; "
                        "default: member_from)")


def build_window(options, methods: Sequence[str], texts: Sequence[str], loaded, out: Resources) -> None:
    """``--window``, checked against the ``methods`` and the model ``loaded``, into every scoring call and the
    fingerprint."""
    if options.window is None:
        return
    windowed.check_window(options.window, methods, loaded.max_length if loaded is not None else options.window + 1)
    out.score_options["window"] = options.window
    out.fingerprint["window"] = options.window


def samia_options(p: argparse.ArgumentParser) -> None:
    """``--samia-samples`` and ``--samia-seed`` on ``p``."""
    p.add_argument("--samia-samples", type=entry.positive_int, default=10,
                   help="sampled continuations per text for 'samia' / 'samia_zlib' (default: 10, as the authors)")
    p.add_argument("--samia-seed", type=entry.nonneg_int, default=0, help="sampling seed of 'samia' (default: 0)")


def build_samia(options, methods: Sequence[str], texts: Sequence[str], loaded, out: Resources) -> None:
    """The sampling options of ``samia`` / ``samia_zlib`` into their second pass and the fingerprint."""
    if not any(m in ("samia", "samia_zlib") for m in methods):
        return
    if options.samia_samples < 1:
        raise UserError(f"--samia-samples must be at least 1, got {options.samia_samples}")
    out.pass_options["samia"] = {"n_samples": options.samia_samples, "seed": options.samia_seed}
    out.fingerprint["samia"] = dict(out.pass_options["samia"])


def _method_options(options, method: str, methods: Sequence[str], prefix: str, names: Sequence[str],
                    flags: str) -> dict | None:
    """{name: value, None where not given} of ``method``'s options ``options.<prefix>_<name>``, or None when ``method``
    is not among ``methods``; an option given without it is a UserError ("``flags`` given but 'method' is not among
    --methods")."""
    given = {k: options.get(f"{prefix}_{k}") for k in names}
    if method in methods:
        return given
    if any(v is not None for v in given.values()):
        raise UserError(f"{flags} given but '{method}' is not among --methods")
    return None


def ngram_options(p: argparse.ArgumentParser) -> None:
    """``--ngram-samples``, ``--ngram-seed``, ``--ngram-min-n`` and ``--ngram-sampling`` on ``p``."""
    p.add_argument("--ngram-samples", type=entry.positive_int,
                   help="sampled continuations per text for 'ngram_coverage' (default: 20, the authors' example)")
    p.add_argument("--ngram-seed", type=entry.nonneg_int, help="sampling seed of 'ngram_coverage' (default: 0)")
    p.add_argument("--ngram-min-n", type=entry.positive_int,
                   help="the shortest n-gram (in words) that counts as covered for 'ngram_coverage' (default: 3, as "
                        "the authors)")
    p.add_argument("--ngram-sampling", choices=("authors", "samia"),
                   help="how 'ngram_coverage' samples: 'authors' (default: temperature 1, top-p 0.95) or 'samia' "
                        "(SaMIA's sampling with --samia-samples / --samia-seed: the same samples when 'samia' is "
                        "scored too)")


def build_ngram(options, methods: Sequence[str], texts: Sequence[str], loaded, out: Resources) -> None:
    """The options of ``ngram_coverage`` (resolved with its defaults) into its pass and the fingerprint; an option
    given without the method, or ``--ngram-samples`` / ``--ngram-seed`` with ``--ngram-sampling samia``: UserError."""
    given = _method_options(options, "ngram_coverage", methods, "ngram", ("samples", "seed", "min_n", "sampling"),
                            "--ngram-* options are")
    if given is None:
        return
    if given["sampling"] == "samia":
        if given["samples"] is not None or given["seed"] is not None:
            raise UserError("--ngram-samples / --ngram-seed do not apply with --ngram-sampling samia: the samples are "
                            "drawn as SaMIA's (set --samia-samples / --samia-seed)")
        opts = sampling.resolve("samia", {"n_samples": options.samia_samples, "seed": options.samia_seed})[0]
    else:
        opts = {k: v for k, v in (("n_samples", given["samples"]), ("seed", given["seed"])) if v is not None}
    if given["min_n"] is not None:
        opts["min_n"] = given["min_n"]
    drawn, scored = sampling.resolve("ngram_coverage", opts)
    out.pass_options["ngram_coverage"] = {**drawn, **scored}
    out.fingerprint["ngram_coverage"] = {**drawn, **scored}


def freq_options(p: argparse.ArgumentParser) -> None:
    """``--freq-table`` on ``p``."""
    p.add_argument("--freq-table", metavar="T.npz", type=entry.input_file,
                   help="token-frequency table of a reference corpus for 'dc_pdd', counted with the model's tokenizer: "
                        "make one with `mia-jax freq-table --model M --out T.npz` (default corpus: the bundled Pile "
                        "sample)")


def build_freq(options, methods: Sequence[str], texts: Sequence[str], loaded, out: Resources) -> None:
    """The token-frequency table of the methods whose scorer reads one (``out.resources["freq_table"]``), refused
    unless the model's tokenizer counted it; its content's SHA-256 in the fingerprint."""
    wants_freq = any("freq_table" in getattr(parse_method(m)[0], "resources", ()) for m in methods)
    if options.freq_table and not wants_freq:
        raise UserError("--freq-table is given but no method among --methods uses it (dc_pdd)")
    if not wants_freq:
        return
    check_resources(methods, {"freq_table": options.freq_table})  # the option is missing: say how to make one
    table = freq.for_model(options.freq_table, loaded)  # refused unless the model's tokenizer counted it
    out.resources["freq_table"] = table
    out.fingerprint["freq_table"] = table.sha256()
    out.files[str(Path(options.freq_table).resolve())] = sha256(options.freq_table)


def acmia_options(p: argparse.ArgumentParser) -> None:
    """``--acmia-temperature`` on ``p``."""
    p.add_argument("--acmia-temperature", metavar="T", type=entry.positive_float,
                   help="the temperature of 'acmia_ac', 'acmia_derivac' and 'acmia_normac' (default: "
                        f"{acmia.DEFAULT_TEMPERATURE:g}, untuned; the authors keep the best of 2^(0.1 j), j = -25..25, "
                        "on the evaluated labels)")


def build_acmia(options, methods: Sequence[str], texts: Sequence[str], loaded, out: Resources) -> None:
    """ACMIA's temperature (``out.resources["acmia_temperature"]``, its value in the fingerprint) for the methods
    whose scorer reads it; the option given for none of them is refused."""
    wants = any(acmia.RESOURCE in getattr(parse_method(m)[0], "resources", ()) for m in methods)
    if options.acmia_temperature is not None and not wants:
        raise UserError("--acmia-temperature is given but no method among --methods uses it (acmia_ac, "
                        "acmia_derivac, acmia_normac)")
    if not wants:
        return
    t = acmia.DEFAULT_TEMPERATURE if options.acmia_temperature is None else options.acmia_temperature
    acmia.temperatures(t)  # checked before anything is scored
    out.resources[acmia.RESOURCE] = t
    out.fingerprint[acmia.RESOURCE] = t


def tag_tab_options(p: argparse.ArgumentParser) -> None:
    """``--tag-tab-k`` on ``p``."""
    p.add_argument("--tag-tab-k", metavar="K", type=entry.positive_int,
                   help=f"keywords per sentence of 'tag_tab': each sentence's K rarest words by wordfreq (default: "
                        f"{tagtab.DEFAULT_K}, the authors' recommended K)")


def build_tag_tab(options, methods: Sequence[str], texts: Sequence[str], loaded, out: Resources) -> None:
    """Tag&Tab's K (``out.resources[tagtab.RESOURCE]``, its value in the fingerprint) when ``tag_tab`` is among the
    ``methods``; the option given without it is refused."""
    wants = any(tagtab.RESOURCE in getattr(parse_method(m)[0], "resources", ()) for m in methods)
    k = options.tag_tab_k
    if k is not None and not wants:
        raise UserError("--tag-tab-k is given but 'tag_tab' is not among --methods")
    if wants:
        out.resources[tagtab.RESOURCE] = out.fingerprint[tagtab.RESOURCE] = tagtab.check_k(
            tagtab.DEFAULT_K if k is None else k)


def infilling_options(p: argparse.ArgumentParser) -> None:
    """``--infilling-k`` and ``--infilling-future`` on ``p``."""
    p.add_argument("--infilling-k", metavar="K", type=entry.fraction,
                   help=f"the fraction of lowest per-token ratios 'infilling' averages (default: "
                        f"{infilling.DEFAULT_K:g}, untuned; the authors report 0.1..1.0)")
    p.add_argument("--infilling-future", metavar="L", type=entry.nonneg_int,
                   help="future tokens in each ratio of 'infilling' (default: all, the paper's Eq. 6; the authors' "
                        "code reports L = 0, 1, 3, 5, 10, 20, 30; 0 reads no changed text)")


def build_infilling(options, methods: Sequence[str], texts: Sequence[str], loaded, out: Resources) -> None:
    """The options of ``infilling`` (resolved with its defaults) into its pass and the fingerprint; an option given
    without the method is refused."""
    given = _method_options(options, "infilling", methods, "infilling", ("k", "future"),
                            "--infilling-k / --infilling-future are")
    if given is None:
        return
    opts = infilling.check_options(**{k: v for k, v in given.items() if v is not None})
    out.pass_options["infilling"] = opts
    out.fingerprint["infilling"] = dict(opts)


def em_mia_options(p: argparse.ArgumentParser) -> None:
    """``--em-mia-prefixes``, ``--em-mia-iterations`` and ``--em-mia-seed`` on ``p``."""
    p.add_argument("--em-mia-prefixes", metavar="N", type=entry.positive_int,
                   help=f"candidate prefixes per text of 'em_mia': the texts are split into blocks of at most N and "
                        f"each is read after every text of its block (N forwards per text; default: "
                        f"{em_mia.DEFAULT_PREFIXES}; the authors use every text, i.e. N >= the number of texts)")
    p.add_argument("--em-mia-iterations", metavar="T", type=entry.positive_int,
                   help=f"EM rounds of 'em_mia' (default: {em_mia.DEFAULT_ITERATIONS}, as the authors)")
    p.add_argument("--em-mia-seed", type=entry.nonneg_int, help="seed of 'em_mia''s split into blocks (default: 0)")


def build_em_mia(options, methods: Sequence[str], texts: Sequence[str], loaded, out: Resources) -> None:
    """EM-MIA's options (checked, with their defaults) into its pass and the fingerprint; an option given without
    ``em_mia`` among the ``methods`` is refused."""
    given = _method_options(options, "em_mia", methods, "em_mia", ("prefixes", "iterations", "seed"),
                            "--em-mia-* options are")
    if given is None:
        return
    defaults = {"prefixes": em_mia.DEFAULT_PREFIXES, "iterations": em_mia.DEFAULT_ITERATIONS, "seed": 0}
    v = {k: defaults[k] if x is None else x for k, x in given.items()}
    opts = em_mia.check_options(v["prefixes"], v["iterations"], v["seed"])
    out.pass_options["em_mia"] = dict(opts)
    out.fingerprint["em_mia"] = dict(opts)


_REPORT_ONLY = "report only: the flags are recomputed from the records at the end of every run"

# in the order their options are listed and their entries enter the fingerprint
NEEDS: dict[str, Need] = {n.name: n for n in (
    Need("recall", recall_options, build_recall, ("recall_prefixes",), {
        "recall_shots": "the prefixes made from it are fingerprinted by SHA-256 (recall_prefixes)",
        "recall_n_shots": "the prefixes made with it are fingerprinted by SHA-256 (recall_prefixes)",
        "recall_seed": "the prefixes drawn with it are fingerprinted by SHA-256 (recall_prefixes)"}),
    Need("window", window_options, build_window, ("window",), {
        "window": "in the fingerprint (window)",
        "window_method": _REPORT_ONLY,
        "window_threshold": _REPORT_ONLY,
        "member_from_field": "report only: window labels are recomputed from the data at the end of every run"}),
    Need("samia", samia_options, build_samia, ("samia",), {
        "samia_samples": "in the fingerprint's samia options",
        "samia_seed": "in the fingerprint's samia options"}),
    Need("ngram_coverage", ngram_options, build_ngram, ("ngram_coverage",), {
        "ngram_samples": "in the fingerprint's ngram_coverage options",
        "ngram_seed": "in the fingerprint's ngram_coverage options",
        "ngram_min_n": "in the fingerprint's ngram_coverage options",
        "ngram_sampling": "the sampling options it chooses are in the fingerprint's ngram_coverage options"}),
    Need("freq_table", freq_options, build_freq, ("freq_table",), {
        "freq_table": "a path: the table is fingerprinted by its content's SHA-256 (freq_table)"}),
    Need("acmia", acmia_options, build_acmia, (acmia.RESOURCE,), {
        "acmia_temperature": "in the fingerprint (acmia_temperature), the default too"}),
    Need("tag_tab", tag_tab_options, build_tag_tab, (tagtab.RESOURCE,), {
        "tag_tab_k": f"in the fingerprint ({tagtab.RESOURCE}), the default too"}),
    Need("infilling", infilling_options, build_infilling, ("infilling",), {
        "infilling_k": "in the fingerprint's infilling options, the default too",
        "infilling_future": "in the fingerprint's infilling options, the default too"}),
    Need("em_mia", em_mia_options, build_em_mia, ("em_mia",), {
        "em_mia_prefixes": "in the fingerprint's em_mia options, the default too",
        "em_mia_iterations": "in the fingerprint's em_mia options, the default too",
        "em_mia_seed": "in the fingerprint's em_mia options, the default too"}),
)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of every need in :data:`NEEDS` on ``p``, in the registry's order."""
    for need in NEEDS.values():
        need.add_arguments(p)


def not_in_fingerprint() -> dict[str, str]:
    """{option dest: why it is not an entry of the run's fingerprint as given} of every need's options."""
    return {dest: why for need in NEEDS.values() for dest, why in need.not_in_fingerprint.items()}


def option_dests() -> tuple[str, ...]:
    """The destinations of every need's options (what :class:`MethodOptions` holds), in the registry's order."""
    return dests_of(add_arguments)


def method_options(given, fields: TextFields) -> MethodOptions:
    """Every need's options out of the parsed command line ``given`` (``vars(namespace)``): those of
    :func:`option_dests` only; ``fields``: how the evaluated data is read."""
    return MethodOptions.of(given, option_dests(), fields=fields)


def build(options: MethodOptions, methods: Sequence[str], texts: Sequence[str], loaded=None) -> Resources:
    """The resources of this run's ``methods`` from the needs' ``options`` (every need of :data:`NEEDS`, in order)
    for the evaluated ``texts`` and the model ``loaded``; a method whose resource is missing, or an option given for
    no method that uses it, is a UserError before anything is scored."""
    if not isinstance(options, MethodOptions):
        raise TypeError(f"resources.build takes the needs' MethodOptions, not {type(options).__name__}")
    out = Resources()
    for need in NEEDS.values():
        need.build(options, methods, texts, loaded, out)
    return out
