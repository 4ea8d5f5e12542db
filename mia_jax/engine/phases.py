"""The phases of one scoring pass (``runner.score_texts``): the arguments checked, the texts encoded and the sink
opened for resume (``start``), the plan of steps (``plan``), the records reused from an interrupted run counted
(``count_resumed``), each step launched on the device (``dispatch``) and its scores turned into records (``finish``,
``step_scores``), and the step loop with its preemption check (``run``). ``PassState`` is the state they share.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Sequence

import jax
import numpy as np

from mia_jax.runs import preemption, processes
from mia_jax.engine import sharding as shd
from mia_jax.engine import windowed
from mia_jax.batching import (TOKENS_PER_BATCH, Step, align, check_tokens_per_batch, encode, pack, packed_arrays,
                              scoring_lengths, stable_steps)
from mia_jax.runs.entry import check_interrupted
from mia_jax.engine.inflight import InFlight
from mia_jax.engine.records import Sink, make_record, skip_reason
from mia_jax.scorers import (check_ids, check_resources, pack_token_resources, parse_method,
                             requirements, token_resources)
from mia_jax.scorers.likelihood import zlib_bytes
from mia_jax.stats import TokenStats


NONFINITE = "the model's logits are not finite"  # the skip reason of such a text (counted and warned by the CLI)


def default_tokens_per_batch() -> int:
    """The token budget of one scoring step on this backend (``batching.TOKENS_PER_BATCH``)."""
    return TOKENS_PER_BATCH.get(jax.default_backend(), TOKENS_PER_BATCH["gpu"])


@dataclass
class PassState:
    """One ``score_texts`` pass: its inputs and the state its phases share (plan, resume, step loop, finish)."""
    texts: Sequence[str]
    methods: Sequence[str]
    labels: Sequence[int] | None
    mesh: object
    compute: object
    window: int | None
    resources: dict | None
    needs_text: bool  # zlib: each text's compressed length
    decode: object  # the tokenizer's decode for windowed zlib, else None
    multi: bool  # several processes, each scoring its own slice
    mine: Sequence[int]  # this process's texts
    encoded: dict  # {index: batching.Encoded}
    skips: dict  # {index: skip reason or None}
    sink: Sink
    counts: dict = field(default_factory=dict)
    shapes: set = field(default_factory=set)
    state: object = None  # the model's state (nnx.split)
    pad: int = 0
    step_fn: object = None
    res: dict = field(default_factory=dict)  # the scorers' resources as arrays
    bar: object = None
    flight: InFlight | None = None  # the steps launched and not yet finished
    token_res: dict = field(default_factory=dict)  # {per-token resource: {index: array over the text's tokens}}

    def label(self, i: int) -> int | None:
        """Text ``i``'s label, or None without labels."""
        return self.labels[i] if self.labels is not None else None


def check_arguments(loaded, methods, tokens_per_batch, compute, resources, window) -> int:
    """The arguments of ``score_texts`` checked (a ``UserError`` or ``ValueError`` if wrong); returns the token
    budget of a step."""
    if compute is None:
        for m in methods:
            parse_method(m)
        check_resources(methods, resources)
    tokens_per_batch = check_tokens_per_batch(tokens_per_batch, "tokens_per_batch") or default_tokens_per_batch()
    if window is not None:
        windowed.check_window(window, methods, loaded.max_length)
    return tokens_per_batch


def start(loaded, texts, methods, *, labels, prefixes, out_path, resume, mesh, compute, resources, window) -> PassState:
    """A pass's texts encoded (this process's slice), its sink opened for resume and the records of the texts it
    skips added to it; returns the pass."""
    needs_text = compute is None and requirements(methods).zlib_bytes
    decode = loaded.tokenizer.decode if window is not None and needs_text else None
    multi = mesh is not None and jax.process_count() > 1
    mine = processes.process_slice(len(texts)) if multi else range(len(texts))
    encoded = dict(zip(mine, encode(loaded, [texts[i] for i in mine],
                                    None if prefixes is None else [prefixes[i] for i in mine])))
    sink = Sink(out_path, len(texts), methods, mine, resume=resume, multi=multi)
    skips = {i: skip_reason(texts[i], len(encoded[i].ids) - encoded[i].n_context + bool(encoded[i].n_context))
             for i in mine}
    p = PassState(texts, methods, labels, mesh, compute, window, resources, needs_text, decode, multi, mine, encoded,
              skips, sink)
    for i, reason in skips.items():
        if reason is not None:
            sink.records[i] = make_record(i, p.label(i), encoded[i], {m: None for m in methods}, reason)
    if compute is None:  # per-token resources made from each text, e.g. Tag&Tab's keywords
        p.token_res = token_resources(methods, resources, loaded.tokenizer, {i: texts[i] for i in mine},
                                      alone=prefixes is None and window is None)
    return p


def count_resumed(p: PassState, steps: list[Step], todo: list[int], report: dict | None, desc: str, out_path) -> int:
    """The pass's counts started (in ``report`` when given) and a resume that reuses records said on stderr;
    returns how many texts to score are already in the sink."""
    remaining = sum(len(s.items) for s in steps if not all(i in p.sink for i in s.items))
    reused = len(todo) - remaining
    p.counts = {"texts": len(p.mine), "reused": reused, "computed": 0, "batches_computed": 0,
                "skipped": len(p.mine) - len(todo), "slots": 0, "tokens": 0, "scoring_programs": 0}
    if report is not None:
        report.update(p.counts)
        p.counts = report
    if reused and processes.is_main_process():
        print(f"{desc}: resuming from {out_path}: {reused} of {len(todo)} texts already scored, "
              f"{len(todo) - reused} to compute", file=sys.stderr, flush=True)
    return reused


def dispatch(p: PassState, step: Step) -> tuple:
    """Step ``step`` started; returns at once (step, its scored-prediction mask, its device output (on the CPU a
    worker's future) or, with ``compute``, its ids): it runs while the host writes the records of steps before."""
    encoded = p.encoded
    arrays = packed_arrays(step, {i: encoded[i].ids for i in step.items}, p.pad, targets=p.compute is None)
    seg, mask = arrays["segment_ids"], arrays["mask"]  # a scored prediction: of a token of the text, not its prefix
    zb = np.ones((step.rows, step.segments), np.float32)
    for r, row in enumerate(step.contents) if p.needs_text or any(encoded[i].n_context for i in step.items) else ():
        for s, (item, start, _) in enumerate(row):
            mask[r, start: start + max(encoded[item].n_context - 1, 0)] = False
            if p.needs_text:
                zb[r, s] = zlib_bytes(p.texts[item])
    p.shapes.add(step.shape)
    p.counts["slots"] += step.rows * step.length
    p.counts["tokens"] += int((seg > 0).sum())
    if p.compute is not None:
        return step, mask, arrays["ids"]
    if p.res:
        check_ids(p.methods, arrays["targets"], mask, p.res)  # e.g. DC-PDD: an id beyond its table is an error
    batch = {**arrays, "zlib_bytes": zb, **pack_token_resources(p.token_res, step.contents, mask.shape)}
    if p.mesh is not None:
        batch = {k: shd.global_batch(p.mesh, v) for k, v in batch.items()}
    return step, mask, p.flight.launch(p.step_fn, p.state, {**batch, "resources": p.res})


def finish(p: PassState, step: Step, mask: np.ndarray, out) -> None:
    """The records of a dispatched step made and added to the sink (unless all are there already)."""
    idx = step.items
    reasons, wins = {}, {}
    if p.compute is not None:
        if not idx or all(i in p.sink for i in idx):
            return
        got = p.compute(out[: len(idx)], mask[: len(idx)], [p.texts[i] for i in idx])
        per_text = {i: {m: float(np.asarray(v, np.float64)[r]) for m, v in got.items()} for r, i in enumerate(idx)}
    else:
        out = InFlight.result(out)
        wanted = {"scores": out["scores"], "nonfinite": out["nonfinite"]}
        if p.window is not None:
            wanted["tokens"] = tuple(out["tokens"])
        # one transfer of all of a step's arrays (each started before any is waited for); a mesh: this host's rows
        got = (jax.device_get(wanted) if p.mesh is None
               else jax.tree.map(lambda x: shd.host_local_rows(x, p.mesh), wanted))
        scores, broken = {m: np.asarray(v) for m, v in got["scores"].items()}, np.asarray(got["nonfinite"])
        tokens = TokenStats(*(np.asarray(x) for x in got["tokens"])) if p.window is not None else None
        if not idx or all(i in p.sink for i in idx):
            return  # only here to keep the processes in step
        per_text = step_scores(p, step, scores, broken, reasons)
        if tokens is not None:
            wins = windowed.step_window_scores(step, tokens, mask, p.encoded, p.texts, p.methods, p.window, p.decode,
                                               p.resources)
    p.counts["computed"] += len(idx)
    p.counts["batches_computed"] += 1
    recs = [make_record(i, p.label(i), p.encoded[i], per_text[i], reasons.get(i)) for i in idx]
    for rec in (r for r in recs if r["index"] in wins and "skip_reason" not in r):
        rec["windows"] = wins[rec["index"]]
    p.sink.add(recs)
    p.bar.update(len(idx))
    check_interrupted()  # a Ctrl-C that Python swallowed (see rundir) stops here, after the step is saved


def step_scores(p: PassState, step: Step, scores: dict, broken: np.ndarray, reasons: dict) -> dict[int, dict]:
    """Each text's scores of a step from the device's [rows, segments] arrays: {index: {method: score or None}};
    a text with non-finite logits gets None scores and its reason in ``reasons``."""
    per_text = {}
    for r, row in enumerate(step.contents):
        for s, (item, _, _) in enumerate(row):
            if broken[r, s]:  # no score of a text the model could not compute is kept
                per_text[item] = {m: None for m in p.methods}
                reasons[item] = f"{NONFINITE}: NaN or infinite at {broken[r, s]} of its scored tokens"
            else:
                per_text[item] = {m: float(scores[m][r, s]) for m in p.methods}
    return per_text


def run(p: PassState, steps: list[Step], n_texts: int) -> None:
    """Every step of ``steps``, each launched while the host writes the records of those before it (``InFlight``);
    after each, the processes agree on a preemption notice (``preemption.agreed``): on one, the steps in flight
    finish, their records are kept, and ``Preempted`` says how many of the ``n_texts`` texts are saved."""
    with InFlight.for_backend(p.mesh) as p.flight:
        for step in steps:
            for done in p.flight.add(dispatch(p, step)):
                finish(p, *done)
            if preemption.agreed():  # a notice to any process: every process stops after this same step
                for done in p.flight.drain():
                    finish(p, *done)
                saved = len(p.sink.records)
                saved = int(processes.allgather_ints([saved]).sum()) if p.multi else saved
                raise preemption.Preempted(f"{saved} of {n_texts} texts")
        for done in p.flight.drain():
            finish(p, *done)


def plan_pass(p: PassState, loaded, tokens_per_batch: int, batch_size: int,
              stable: tuple[int, int] | None) -> tuple[list[int], list[Step]]:
    """(the texts this process scores, in order; the steps that score them): a scoring pass feeds each text but its
    last token, which predicts nothing (a ``compute`` pass the whole text, ``batch_size`` texts a step); with
    ``stable``, steps padded to the shapes other calls share (``batching.stable_steps``)."""
    todo = [i for i in p.mine if p.skips[i] is None]
    enc = [p.encoded[i] for i in todo]
    steps = plan(loaded, scoring_lengths(enc) if p.compute is None else [len(e.ids) for e in enc], todo,
                 tokens_per_batch, batch_size, p.mesh, p.multi, p.compute is None,
                 lambda idx: all(i in p.sink for i in idx), stable[0] if stable else None)
    if stable:
        shards = shd.local_batch_shards(p.mesh) if p.mesh is not None else 1
        steps = stable_steps(steps, tokens_per_batch, *stable, shards)
    return todo, steps


def plan(loaded, lengths, todo, tokens_per_batch, batch_size, mesh, multi, packed, done,
          row_length=None) -> list[Step]:
    """The steps of a pass over the texts ``todo`` (of these token lengths), aligned across processes; packed rows of
    ``row_length`` when given."""
    row_multiple = shd.local_batch_shards(mesh) if mesh is not None else 1
    choose = longest = None
    if row_length:  # a streamed window on any number of processes: the run's one row length
        longest, choose = row_length, (lambda costs: 0)  # the first candidate: the bucket of row_length
    elif multi:
        longest = int(processes.allgather_ints([max(lengths, default=0)]).max())

        def choose(costs):
            return int(np.argmin(processes.allgather_ints([round(c) for c in costs]).sum(axis=0)))
    local = pack(lengths, tokens_per_batch, loaded.max_length, row_multiple=row_multiple, packed=packed,
                 longest=longest, choose=choose, rows=None if packed else batch_size)
    steps = [Step(s.rows, s.length, s.segments, [[(todo[i], start, n) for i, start, n in row] for row in s.contents])
             for s in local]
    gather = processes.allgather_ints if multi else (lambda v: np.asarray(v, np.int64).reshape(1, -1))
    return align(steps, loaded.max_length, gather, done)
