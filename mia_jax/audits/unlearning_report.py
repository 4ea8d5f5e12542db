"""The unlearning audit's outputs (:mod:`mia_jax.audits.unlearning`): unlearning.md (the report, also printed),
unlearning.json, chunks.csv (per chunk: its place, q under both models, ratios, flags), ratios.png and probes.jsonl
(every sample of every probe and its per-sample values); written all or none and sealed (the record a ``--from``
rebuild checks its inputs against)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from mia_jax.audits.common import finite_or_none, label_axes, write_sealed
from mia_jax.audits.unlearning import SIDES, UnlearningResult
from mia_jax.evaluation.report import csv_bytes, figure_bytes, fmt, markdown, pyplot

REBUILD_READS = ("unlearning.json", "chunks.csv", "probes.jsonl")  # what --from reads (sealed in manifest.json)
CHUNKS_COLUMNS = ["chunk", "source_text", "chunk_in_text", "word_offset", "n_words", "min_k_nll_original",
                  "min_k_nll_unlearned", "ppl_original", "ppl_unlearned", "min_k_ratio", "min_k_flagged", "ppl_ratio",
                  "ppl_flagged", "probed", "rougeL_max_original", "rougeL_max_unlearned", "rougeL_mean_original",
                  "rougeL_mean_unlearned"]


def to_markdown(res: UnlearningResult) -> str:
    """unlearning.md of ``res`` (also printed): the chunks, the flag counts per method, the notes, the story-completion
    table and the QA summary. Returns the markdown (no final newline)."""
    c, r = res.counts, res.config["ratio"]
    head = (f"## Unlearning audit (Shi et al. 2023, section 7)\n\n"
            f"{c['texts']} texts -> {c['chunks']} chunks of up to {res.config['chunk_words']} words "
            f"({c['texts_too_short']} texts under {res.config['min_words']} words and {c['tails_dropped']} "
            f"trailing pieces under {res.config['min_words']} words dropped). A chunk is flagged *likely still "
            f"known* when q(unlearned) / q(original) is in (1/{r:g}, {r:g}) = ({1 / r:.4f}, {r:.4f}); q: the "
            f"Min-K% (k = {res.config['k']:g}) average negative log-likelihood, or the perplexity.\n\n")
    counts = markdown(["Method", "Chunks scored", "Flagged", "Ratio undefined"], [
        [f"{name} ({res.methods[name]})", str(c[f"scored_{name}"]), str(c[f"flagged_{name}"]),
         str(c[f"undefined_{name}"])] for name in ("min_k", "ppl")])
    notes = "".join(f"\n{n}\n" for n in res.notes)
    body = ""
    if res.probes:
        embed = "embed_original" in res.probes[0]
        hdr = ["Chunk", "Text", "Words", "Min-K% NLL orig", "unl", "Ratio", "PPL ratio", "ROUGE-L max orig", "unl",
               "ROUGE-L mean orig", "unl"] + (["Cos max orig", "unl", "Cos mean orig", "unl"] if embed else [])
        rows = []
        for p in res.probes:
            i = p["chunk"]
            ch = res.chunks[i]
            row = [str(i), str(ch.source), f"{ch.word_offset + 1}-{ch.word_offset + ch.n_words}",
                   fmt(-res.scores["original"]["min_k"][i]), fmt(-res.scores["unlearned"]["min_k"][i]),
                   fmt(res.ratios["min_k"][i]), fmt(res.ratios["ppl"][i]),
                   fmt(p["rougeL_original"]["max"]), fmt(p["rougeL_unlearned"]["max"]),
                   fmt(p["rougeL_original"]["mean"]), fmt(p["rougeL_unlearned"]["mean"])]
            if embed:
                row += [fmt(p["embed_original"]["max"]), fmt(p["embed_unlearned"]["max"]),
                        fmt(p["embed_original"]["mean"]), fmt(p["embed_unlearned"]["mean"])]
            rows.append(row)
        body += (f"\n### Story completion on {len(res.probes)} flagged chunks\n\nPrompt: the first "
                 f"{res.config['prompt_words']} words; {res.config['n_samples']} sampled continuations per "
                 f"model, compared with the true continuation (ROUGE-L F"
                 f"{'; Cos: cosine similarity of sentence embeddings' if embed else ''}; max and mean over "
                 f"samples).\n\n"
                 + markdown(hdr, rows))
    if res.qa:
        q = res.qa
        body += (f"\n### QA probes ({q['n']} questions, {q['n_flagged']} flagged by Min-K%)\n\nMean ROUGE-L "
                 f"recall of the gold answer (greedy answers):\n\n" + markdown(
                     ["Questions", "n", "Original", "Unlearned"],
                     [[g, str(q[g]["n"]), fmt(q[g]["original"]), fmt(q[g]["unlearned"])]
                      for g in ("flagged", "other", "all")]))
    return head + counts + notes + body


def render_outputs(res: UnlearningResult, meta: dict) -> dict[str, bytes]:
    """{name: bytes} of unlearning.md, chunks.csv, ratios.png, unlearning.json and probes.jsonl (with every sample
    and its per-sample values) of ``res`` (unlearning.json: the entries of ``meta`` (command, models, ...) first):
    what ``unlearning_rebuild.rebuild`` reads back."""
    files = {"unlearning.md": (to_markdown(res) + "\n").encode("utf-8")}
    probed = {p["chunk"]: p for p in res.probes}
    s, rows = res.scores, []
    for i, c in enumerate(res.chunks):
        p = probed.get(i, {})
        rows.append([i, c.source, c.position, c.word_offset, c.n_words,
                     *(finite_or_none(-s[side][name][i]) for name in ("min_k", "ppl") for side in SIDES),
                     finite_or_none(res.ratios["min_k"][i]), bool(res.flags["min_k"][i]),
                     finite_or_none(res.ratios["ppl"][i]), bool(res.flags["ppl"][i]), i in probed,
                     *(p.get(f"rougeL_{side}", {}).get(a) for a in ("max", "mean") for side in SIDES)])
    files["chunks.csv"] = csv_bytes(CHUNKS_COLUMNS, rows)
    files["ratios.png"] = ratios_png(res)
    record = {**meta, "config": res.config, "methods": res.methods, "counts": res.counts, "notes": res.notes,
              "flagged_min_k": [int(i) for i in np.flatnonzero(res.flags["min_k"])],
              "flagged_ppl": [int(i) for i in np.flatnonzero(res.flags["ppl"])],
              "probes": [{k: v for k, v in p.items() if k != "samples" and not k.endswith("_per_sample")}
                         for p in res.probes],
              "qa": res.qa}
    files["unlearning.json"] = (json.dumps(record, indent=2, default=str) + "\n").encode("utf-8")
    files["probes.jsonl"] = "".join(json.dumps(p) + "\n" for p in res.probes).encode("utf-8")
    return files


def ratios_png(res: UnlearningResult) -> bytes:
    """ratios.png of ``res``: the histogram of each method's log ratio over the chunks, with the window. Returns the
    PNG bytes."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    r = res.config["ratio"]
    logs = {name: np.log(res.ratios[name][np.isfinite(res.ratios[name])]) for name in ("min_k", "ppl")}
    edges = np.histogram_bin_edges(np.concatenate([*logs.values(), [-math.log(r), math.log(r)]]), bins=40)
    for (name, x), color in zip(logs.items(), ("C0", "C1")):
        if x.size:
            ax.hist(x, bins=edges, alpha=0.6, color=color,
                    label=f"{res.methods[name]} ({res.counts[f'flagged_{name}']} of {x.size} flagged)")
    ax.axvspan(-math.log(r), math.log(r), color="grey", alpha=0.2, label=f"window (1/{r:g}, {r:g})")
    ax.yaxis.get_major_locator().set_params(integer=True)
    label_axes(ax, "log( q(unlearned) / q(original) )", "chunks",
               "Forget-set chunks: score ratio, unlearned vs original", 8)
    return figure_bytes(fig)


def write_outputs(res: UnlearningResult, out: Path, meta: dict) -> None:
    """``render_outputs`` of ``res`` and ``meta`` into the folder ``out``, all or none, then sealed
    (``common.write_sealed``)."""
    write_sealed(out, render_outputs(res, meta), REBUILD_READS)
