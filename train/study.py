"""The contamination study as one report: every sweep's tables rebuilt from its per-example scores, and each of the
paper's claims (Shi et al. 2023, section 6) marked reproduced / not reproduced / not distinguishable with the paired
bootstrap interval behind the verdict::

    python -m train.study --lr results/contamination/lr results/contamination/gemma-lr \\
        --size results/contamination/size --news results/contamination/news \\
        --occurrence results/contamination/occurrence --traps results/contamination/traps \\
        --header results/contamination/README.md --out results/contamination.md

(the command ``python scripts/build_results.py`` runs; a ``--header`` naming ``{command}`` gets it written out).

A sweep option may name several folders (the same sweep on several models): each folder's tables get a heading with
its model, and its claims carry the model's name, so a reader sees which conclusions hold across models.

A claim "A > B" is *reproduced* when the 95% interval of A - B lies above 0, *not reproduced* when it lies below 0
(the opposite holds), *not distinguishable* when it contains 0, each from at least 2000 paired resamples and only
where the claim survives Holm's correction over all the study's claims (train/claims.py, ``comparisons.holm_adjust``:
more resamples where the Monte-Carlo interval of the adjusted p straddles 0.05, *undecided* where it still does at
the most). The report then recomputes every claim under ``--other-seeds`` (default 5) other bootstrap seeds (the run's
seed + 1, + 2, ...) and says how many verdicts keep their direction under all of them, naming those that do not.
The claims and their tests (train/claims.py; which
sweep tests which: train/ablations.py):

- Table 3: Min-K% beats each baseline (PPL, Zlib, Lowercase, Neighbor) on the average over the datasets: paired
  bootstrap of the two methods' scores under the trained model (lr 1e-4 run) on the same examples, the mean of
  the per-dataset AUROCs resampled within each dataset.
- Table 4: the higher learning rate gives a higher Min-K% AUROC on every dataset (and on average): paired bootstrap
  of the two trained models' scores on the same examples, per dataset.
- Figure 5a: outlier contaminants are easier to detect in a larger corpus: the largest background vs the smallest,
  Min-K% average AUROC, paired (the eval examples are the same in every run of the sweep).
- Figure 5b: in-distribution contaminants (2023 news) are harder to detect in a larger corpus: largest vs smallest.
- Figure 5c: members inserted more often are easier to detect: k = max vs k = 1 against the same non-members,
  every dataset pooled after per-dataset rank normalisation (``sweep_tables.group_scores``).
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from mia_jax.evaluation import comparisons, pvalue, verdict_log
from mia_jax.runs import entry, files, rundir
from mia_jax.errors import UserError
from mia_jax.evaluation.report import fmt, with_ci
from train.ablations import ABLATIONS
from train import claims
from train.claims import claims_markdown
from train.loading import load_source
from train.tables import rebuild_outputs

PROG = "python -m train.study"


def _folders(value) -> list[Path]:
    """The folders of a sweep option's value (one path, several, or none)."""
    return [Path(value)] if isinstance(value, (str, Path)) else [Path(f) for f in value or []]


def _claims(loaded: dict, outputs: dict, sweeps: dict) -> list[dict]:
    """Every claim of the study (the ablations' ``study`` functions over the loaded folders), Holm-corrected."""
    found = []
    for kind, ablation in ABLATIONS.items():
        folders = _folders(sweeps.get(kind))
        for folder in folders:
            model = loaded[(kind, folder)][1][0][1]["config"]["model"]["path"]
            found += ablation.study(loaded[(kind, folder)][1], outputs[folder],
                                    f" ({model})" if len(folders) > 1 else "")[1]
    claims.correct(found)
    return found


def _stability_note(claims_found: list[dict], loaded: dict, outputs: dict, sweeps: dict, other_seeds: int) -> str:
    """Every claim recomputed under ``other_seeds`` other seeds (each claim's ``other_seeds`` filled in) and the
    paragraph that reports how many verdicts kept their direction."""
    if not other_seeds:
        return ""
    others = []
    for offset in range(1, other_seeds + 1):
        with claims.other_seed(offset), verdict_log.paused():
            others.append(_claims(loaded, outputs, sweeps))
    st = claims.seed_stability(claims_found, others)
    changed = "; ".join(st["changed"]) if st["changed"] else "none"
    open_ = (f"; undecided under some seeds only, no seed stating another verdict: {'; '.join(st['undecided'])}"
             if st["undecided"] else "")
    return (f"Seeds: **{st['same']} of {st['of']} verdicts keep their direction under all {st['seeds']} other "
            f"bootstrap seeds** (each run's seed + 1 to + {st['seeds']}, every claim and its Holm correction "
            f"recomputed; \"undecided\" contradicts no verdict); verdicts that change under some seed: {changed}"
            f"{open_}.\n\n")


def _blind(outputs: dict, folder: Path) -> dict:
    """{dataset: blind baseline metrics} of a sweep folder's first run (model-free: the same in every run)."""
    first = sorted(k for k in outputs[folder] if k.endswith("/metrics.json"))[0]
    return {d: r for d, r in json.loads(outputs[folder][first])["blind"].items() if r}


def _count(n: int) -> str:
    """An integer as the reports print counts: a space between thousands from 10 000 on (1554, 65 429)."""
    return f"{n:,}".replace(",", " ") if n >= 10_000 else str(n)


# A run's numbers a header may name as {run[SWEEP/RUN][name]} (SWEEP: the sweep folder's name, RUN: the run's
# sub-folder), each read from the run's committed run.json.
RUN_FIELDS = {
    "docs": lambda r: _count(r["corpus"]["n_documents"]),
    "tokens": lambda r: _count(r["corpus"]["tokens"]["total"]),
    "background": lambda r: _count(r["corpus"]["tokens"]["background"]),
    "inserted": lambda r: _count(r["corpus"]["tokens"]["contaminant"]),
    "copies": lambda r: _count(r["corpus"]["n_inserted_segments"]),
    "contamination": lambda r: f"{100 * r['corpus']['contamination_rate']:.1f}%",
    "steps": lambda r: str(r["train"]["steps"]),
    "train_s": lambda r: f"{r['train']['seconds']:.0f}",
    "tok_s": lambda r: f"{r['train']['tokens_per_second']:.0f}",
    "first_loss": lambda r: f"{r['train']['first_loss']:.3f}",
    "final_loss": lambda r: f"{r['train']['final_loss']:.3f}",
    "score_base_s": lambda r: f"{r['timings_s']['score_base_s']:.0f}",
    "score_trained_s": lambda r: f"{r['timings_s']['score_trained_s']:.0f}",
    "texts": lambda r: str(r["scoring"]["trained"]["main"]["texts"]),
    "ref_reused": lambda r: "{reused} of {texts}".format(**r["scoring"]["trained"]["ref"]),
}


def run_fields(loaded: dict) -> dict:
    """{"SWEEP/RUN": {name: text}} of every loaded run (:data:`RUN_FIELDS`; a name whose record is missing left out)."""
    out = {}
    for (_, folder), (_, runs) in loaded.items():
        for sub, run in runs:
            got = out.setdefault(f"{Path(folder).name}/{sub}", {})
            for name, get in RUN_FIELDS.items():
                with contextlib.suppress(KeyError, TypeError):
                    got[name] = get(run)
    return out


def lower_loss(folder: Path) -> str:
    """Of an lr sweep's two runs (``train_metrics.jsonl``, the loss of each new batch): from which step the lower
    learning rate's loss stays below the higher one's (all steps but the last), the step with the widest gap and
    the final losses."""
    runs = sorted((p for p in Path(folder).iterdir() if (p / "train_metrics.jsonl").is_file()),
                  key=lambda p: -json.loads((p / "run.json").read_text())["config"]["train"]["lr"])
    hi, lo = ([json.loads(line)["loss"] for line in (p / "train_metrics.jsonl").read_text().splitlines()]
              for p in runs)
    start = len(lo) - 1
    while start > 0 and lo[start - 1] < hi[start - 1]:
        start -= 1
    gap = max(range(len(lo) - 1), key=lambda i: hi[i] - lo[i])
    return (f"at every step from {start + 1} on but the last (e.g. step {gap + 1}: {lo[gap]:.3f} vs {hi[gap]:.3f}; "
            f"final {lo[-1]:.3f} vs {hi[-1]:.3f}")


def pool_fields(folder: Path) -> dict:
    """The trap pool's record (``traps/traps/pool.jsonl``'s first line) as texts: drawn, dropped_short,
    dropped_retokenized, dropped_near_duplicate, kept_24 / kept_48 (per length), bins_24 / bins_48 (the perplexity
    bin edges, "low 2.3-87, mid ..., high ...")."""
    pool = next(Path(folder).glob("*/traps/pool.jsonl"))
    rec = json.loads(pool.read_text(encoding="utf-8").splitlines()[0])["record"]
    out = {"drawn": _count(rec["drawn"]), "dropped_short": str(rec["dropped"]["short"]),
           "dropped_retokenized": str(rec["dropped"]["retokenized_length"]),
           "dropped_near_duplicate": str(rec["dropped"]["near_duplicate"])}
    for length, r in rec["lengths"].items():
        e = [f"{x:.2g}" if x < 10 else _count(round(x)) for x in r["bin_edges_ppl"]]
        out[f"kept_{length}"] = str(r["kept"])
        out[f"bins_{length}"] = f"low {e[0]}-{e[1]}, mid {e[1]}-{e[2]}, high {e[2]}-{e[3]}"
    return out


def trap_split(runs: list) -> dict:
    """The traps run's split from its examples: members, non_members, per_count (members per number of
    insertions), per_stratum_count (members per stratum and count), strata."""
    rows = runs[0][1]["examples"]
    members = [r for r in rows if r["label"] == 1]
    per = {}
    for r in members:
        per[(r["stratum"], r["occurrences"])] = per.get((r["stratum"], r["occurrences"]), 0) + 1
    counts = sorted({r["occurrences"] for r in members})
    return {"members": str(len(members)), "non_members": str(len(rows) - len(members)),
            "per_count": "/".join(sorted({str(sum(v for (s, k), v in per.items() if k == c)) for c in counts})),
            "per_stratum_count": "/".join(sorted({str(v) for v in per.values()})),
            "strata": str(len({r["stratum"] for r in rows}))}


def command_line(sweeps: dict, header=None, out=None, other_seeds: int = comparisons.OTHER_SEEDS) -> str:
    """``python -m train.study`` with these options (the sweep folders of ``sweeps`` in the options' order,
    ``--other-seeds`` when not the default, ``--header``, ``--out``), wrapped as a shell command: lines of at most
    116 characters continued with a backslash."""
    words = [PROG]
    for kind in ABLATIONS:
        if kind in sweeps:
            words.append(" ".join([f"--{kind}", *(f.as_posix() for f in _folders(sweeps[kind]))]))
    if other_seeds != comparisons.OTHER_SEEDS:
        words.append(f"--other-seeds {other_seeds}")
    words += [f"--{name} {Path(v).as_posix()}" for name, v in (("header", header), ("out", out)) if v is not None]
    lines = [words[0]]
    for w in words[1:]:
        if len(lines[-1]) + 1 + len(w) > 116:
            lines.append("    " + w)
        else:
            lines[-1] += " " + w
    return " \\\n".join(lines)


def header_fields(found: list[dict], outputs: dict, sweeps: dict, loaded: dict | None = None) -> dict:
    """The numbers a ``--header`` may name as ``{name}`` (and ``command``, filled in by :func:`compute`: the command
    that made the report): ``across_models`` (:func:`claims.across_models`),
    ``blind_range`` (the lowest-highest blind-baseline AUROC over the first lr sweep's datasets), ``news_blind`` (the
    news sweep's blind AUROC with its interval), ``run[SWEEP/RUN][name]`` (:func:`run_fields`), ``lower_loss[SWEEP]``
    (:func:`lower_loss`, lr sweeps with training logs), ``pool[name]`` and ``split[name]`` (the traps sweep:
    :func:`pool_fields`, :func:`trap_split`), ``traps_blind`` (its blind AUROC with its interval)."""
    fields = {"across_models": claims.across_models(found), "run": run_fields(loaded or {}),
              "lower_loss": {f.name: lower_loss(f) for f in _folders(sweeps.get("lr"))
                             if len(list(f.glob("*/train_metrics.jsonl"))) == 2}}
    for folder in _folders(sweeps.get("traps"))[:1]:
        fields["pool"] = pool_fields(folder)
        fields["split"] = trap_split(loaded[("traps", folder)][1])
        fields["traps_blind"] = "; ".join(with_ci(r["auroc"], r["auroc_ci"]) for r in _blind(outputs, folder).values())
    for kind, key in (("lr", "blind_range"), ("news", "news_blind")):
        folders = _folders(sweeps.get(kind))
        if folders:
            blind = _blind(outputs, folders[0])
            aurocs = [r["auroc"] for r in blind.values()]
            fields[key] = (f"{fmt(min(aurocs), 2)}-{fmt(max(aurocs), 2)}" if kind == "lr"
                           else "; ".join(with_ci(r["auroc"], r["auroc_ci"]) for r in blind.values()))
    return fields


def fill_header(header: str, fields: dict) -> str:
    """``header`` with every ``{name}`` of ``fields`` filled in (``{{`` for a brace); UserError naming an unknown
    one."""
    try:
        return header.format_map(fields)
    except KeyError as e:
        raise UserError(f"--header names {{{e.args[0]}}}, which the study does not compute; it computes: "
                        f"{', '.join(sorted(fields))}") from None
    except (ValueError, IndexError) as e:
        raise UserError(f"--header is not a template the study can fill ({e}); write a brace as {{{{ or }}}}") from None


def compute(sweeps: dict[str, Path | list[Path]], header: str = "", other_seeds: int = comparisons.OTHER_SEEDS,
            command: str = "") -> tuple[str, list[dict], dict]:
    """(the report's markdown, its claims, {sweep folder: {path: content}} of every table and figure rebuilt) from
    the sweep folders ({"lr": DIR or [DIR, ...], ...}; any subset). Every input is checked (``loading.load_source``:
    the manifest, then the fields) and every output computed; nothing is written. Where a kind names several
    folders (one per model), each gets a heading with its model and its claims the model's name. The claims are
    Holm-corrected together and recomputed under ``other_seeds`` other seeds. ``command``: what the header's
    ``{command}`` says made the report (:func:`command_line`)."""
    loaded = {}
    for kind in ABLATIONS:  # every folder read and checked before anything is computed
        for folder in _folders(sweeps.get(kind)):
            got = load_source(folder, f"--{kind}")
            if got[0] != kind:
                what = "one run's folder" if got[0] is None else f"a {got[0]} sweep"
                raise UserError(f"--{kind} {folder} is {what}; give the folder of a {kind} sweep "
                                f"(python train/contaminate.py --ablation {kind})")
            loaded[(kind, folder)] = got
    parts, outputs = [], {}
    for kind, ablation in ABLATIONS.items():
        folders = _folders(sweeps.get(kind))
        for folder in folders:
            text, outputs[folder] = rebuild_outputs(folder, loaded[(kind, folder)])
            runs = loaded[(kind, folder)][1]
            model = runs[0][1]["config"]["model"]["path"]
            tag = f" ({model})" if len(folders) > 1 else ""
            if tag:
                parts.append(f"# Model {model}: the {kind} sweep (`{folder.as_posix()}`)")
            own, _ = ablation.study(runs, outputs[folder], tag)
            parts += own
            parts.append(text)
    found = _claims(loaded, outputs, sweeps)
    seeds = _stability_note(found, loaded, outputs, sweeps, other_seeds)
    body = ("## The paper's claims\n\nEach claim as a paired bootstrap of A - B on the same examples (95% "
            "interval, at least 2000 resamples): reproduced when the interval lies above 0, not reproduced when "
            "below, not distinguishable when it contains 0 **or when the claim does not survive Holm's correction "
            "over the table's claims** (its adjusted p-value, column Holm p, at or above 0.05; the intervals shown "
            "are unadjusted). A verdict is stated only where the 99% Monte-Carlo interval of its adjusted p lies on "
            "one side of 0.05: a claim whose interval straddles it is resampled more (up to "
            f"{pvalue.MAX_RESAMPLES} resamples) and called undecided if it still does; Holm p < 1/(B+1): no "
            "resample of the B crossed 0.\n\n" + claims_markdown(found) + "\n" + seeds
            + comparisons.family_note(len([c for c in found if "p_holm" in c]), "the claims") + "\n\n"
            + "\n\n".join(parts))
    if header:
        fields = dict(header_fields(found, outputs, sweeps, loaded), command=command or command_line(sweeps))
        header = fill_header(header, fields)
    return (header + "\n\n" if header else "") + body, found, outputs


def _write_sweeps(outputs: dict) -> None:
    """Each sweep's rebuilt tables in place, every folder locked while it is written."""
    with contextlib.ExitStack() as stack:
        for folder in outputs:
            stack.enter_context(rundir.rebuild_into(folder, [folder], "train.study"))
        for folder, outs in outputs.items():
            files.write_all(folder, outs)


def build(sweeps: dict[str, Path | list[Path]], header: str = "") -> tuple[str, list[dict]]:
    """:func:`compute`, then every sweep's tables and figures written in place; returns (markdown, claims)."""
    text, found, outputs = compute(sweeps, header)
    _write_sweeps(outputs)
    return text, found


def build_parser() -> entry.ArgumentParser:
    """The parser of ``python -m train.study``: a ``--NAME DIR...`` option per ablation, --header, --out."""
    p = entry.ArgumentParser(prog=PROG, description="The contamination study's report: every sweep's tables and the "
                             "paper's claims with verdicts, from per-example scores.")
    for kind in ABLATIONS:
        p.add_argument(f"--{kind}", nargs="+", metavar="DIR",
                       type=entry.source_dir("contamination", example=f"results/contamination/{kind}"),
                       help=f"the {kind} sweep folder (several: the same sweep on several models)")
    p.add_argument("--other-seeds", type=entry.nonneg_int, default=comparisons.OTHER_SEEDS, metavar="N",
                   help="recompute every claim under N other bootstrap seeds and report how many verdicts keep their "
                        "direction (default %(default)s; 0: not done)")
    p.add_argument("--header", type=entry.input_file, help="a markdown file to put first (set-up, commands, times)")
    p.add_argument("--out", type=entry.out_file,
                   help="write the report here (and <out>.claims.json) instead of stdout")
    return p


def _main(argv) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    sweeps = {k: getattr(args, k) for k in ABLATIONS if getattr(args, k)}
    if not sweeps:
        p.error("give at least one sweep folder")
    if args.header:
        try:
            header = args.header.read_text(encoding="utf-8-sig").strip()
        except UnicodeDecodeError:
            raise UserError(f"--header {args.header} is not UTF-8 text") from None
    else:
        header = ""
    text, found, outputs = compute(sweeps, header, args.other_seeds,
                                   command_line(sweeps, args.header, args.out, args.other_seeds))
    _write_sweeps(outputs)
    if args.out:
        files.write_all(args.out.absolute().parent, {
            args.out.name: text + "\n", args.out.with_suffix(".claims.json").name: json.dumps(found, indent=2) + "\n"})
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


def main(argv=None) -> int:
    """``python -m train.study`` (``argv``: its arguments, default sys.argv[1:]); returns the exit status."""
    return entry.run(PROG, _main, argv, resume_hint="run the same command again (each folder's tables are written "
                     "all or none)")


if __name__ == "__main__":
    sys.exit(main())
