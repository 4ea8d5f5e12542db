"""ReCaLL (Xie et al. 2024) and Con-ReCaLL (Wang et al. 2025): the text's likelihood after a prefix of shots.

``recall`` = LL(x | P_non) / LL(x), where LL is the mean token log-likelihood of the text (negative), P_non a
prefix made of known *non-member* texts. Conditioning on non-member context lowers a member's likelihood more
than a non-member's, so the ratio (> 1 when the prefix hurts) is higher for members: higher = member, as the
authors' evaluation reads it (``roc_curve(labels, recall)``, ruoyuxie/recall ``src/run.py`` / ``src/eval.py``).

``con_recall`` = (LL(x | P_non) - LL(x | P_mem)) / LL(x), P_mem a prefix of known *member* texts (Con-ReCaLL's
contrast with gamma = 1, as in its published attack code, WangCheng0116/CON-RECALL): the member prefix raises a
member's likelihood, the non-member prefix lowers it. Higher = member.

Passes: ``recall`` 2 forwards per text (the main pass and ``prefix_nonmember``), ``con_recall`` 3
(``prefix_member`` too); with both, the non-member pass runs once. The shots come from a labeled set that must
be disjoint from the evaluated texts (``prefix_shots`` refuses an overlap). Where this follows and where it
differs from the published code:

- The text and the prefix are tokenized apart and joined (as both codes do); the text's BOS, if the tokenizer
  adds one, is dropped after the prefix (the published code keeps it in the middle of the sequence).
- The shots are joined with a blank line (ReCaLL joins them with no separator, Con-ReCaLL with a space).
- When prefix + text exceed the context, the prefix loses tokens from its start (the published code drops whole
  shots from the front to fit the *mean* text length); a text that alone fills the context is read without
  prefix (its records say ``truncated``).
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from mia_jax.engine import passes
from mia_jax.errors import UserError
from mia_jax.scorers.base import register_multi_pass

SEPARATOR = "\n\n"


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def prefix_shots(shots: Sequence[str], labels: Sequence[int], texts: Sequence[str], *, n_shots: int = 10,
                 seed: int = 0) -> dict[str, str]:
    """The two prefixes, {"nonmember": ..., "member": ...} (a side with no shot is absent), each ``n_shots``
    texts of that label drawn without replacement (seeded) from the labeled ``shots`` and joined with a blank
    line. A shot that is also an evaluated text (after case and whitespace normalisation) is refused: its
    membership would leak into its own score."""
    if n_shots < 1:
        raise UserError(f"--recall-shots needs at least 1 shot per prefix, got n_shots={n_shots}")
    evaluated = {_norm(t) for t in texts}
    overlap = [i for i, s in enumerate(shots) if _norm(s) in evaluated]
    if overlap:
        raise UserError(f"the prefix shots must be disjoint from the evaluated texts: shot {overlap[0]} (of "
                        f"{len(overlap)} shared) is also an evaluated text; use shots from another labeled set")
    rng = np.random.default_rng(seed)
    out = {}
    for side, label in (("nonmember", 0), ("member", 1)):
        pool = [s for s, y in zip(shots, labels) if int(y) == label and s.strip()]
        if pool:
            pick = rng.permutation(len(pool))[: min(n_shots, len(pool))]
            out[side] = SEPARATOR.join(pool[i] for i in sorted(pick))
    return out


def prefix_digest(prefixes: dict[str, str] | None) -> dict[str, str] | None:
    """The prefixes by SHA-256 (for a run's fingerprint)."""
    if not prefixes:
        return None
    return {k: hashlib.sha256(v.encode("utf-8")).hexdigest() for k, v in sorted(prefixes.items())}


def no_room_for_prefix(name: str, recs: Sequence[dict], values: np.ndarray, reasons: dict[int, str]) -> None:
    """In place: NaN (with its reason) for each record of a prefixed pass whose text filled the model's context
    alone and so was read without its prefix (``n_context`` 0)."""
    for i, r in enumerate(recs):
        if "skip_reason" not in r and not r.get("n_context"):
            values[i] = np.nan
            reasons[i] = f"{name}: the text fills the model's context alone, no room for the prefix"


def _prefix_pass(side: str):
    def make(name, loaded, texts, *, resume, method="loss", recall_prefixes=None, **_):
        prefix = (recall_prefixes or {}).get(side)
        if not prefix:
            label = "non-member (label 0)" if side == "nonmember" else "member (label 1)"
            raise UserError(f"{name} needs {label} prefix shots: pass a labeled JSONL disjoint from the evaluated "
                            "texts with --recall-shots FILE")
        made = passes.same_texts(loaded, list(texts), name, resume, method, prefixes=[prefix] * len(texts))
        fold = made.fold

        def fold_without_room(recs):
            values, reasons, counts = fold(recs)
            no_room_for_prefix(name, recs, values, reasons)
            return values, reasons, counts

        made.fold = fold_without_room
        return made

    make.__doc__ = f"The target model on every text read after the {side} prefix (its tokens not scored)."
    return make


passes.register_pass("prefix_nonmember")(_prefix_pass("nonmember"))
passes.register_pass("prefix_member")(_prefix_pass("member"))


@register_multi_pass("recall", pass_kind="prefix_nonmember")
def recall(loss: np.ndarray, loss_nonmember: np.ndarray, texts: Sequence[str]):
    """ReCaLL: LL(x | non-member prefix) / LL(x), mean token log-likelihoods (Xie et al. 2024)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(loss_nonmember, np.float64) / np.asarray(loss, np.float64), {}


@register_multi_pass("con_recall", pass_kind=("prefix_nonmember", "prefix_member"))
def con_recall(loss: np.ndarray, loss_nonmember: np.ndarray, loss_member: np.ndarray, texts: Sequence[str]):
    """Con-ReCaLL: (LL(x | non-member prefix) - LL(x | member prefix)) / LL(x) (Wang et al. 2025, gamma = 1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(loss_nonmember, np.float64) - np.asarray(loss_member, np.float64)) / np.asarray(
            loss, np.float64), {}
