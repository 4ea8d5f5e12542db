"""GradNorm (Wang et al. 2024; as in mimir's ``GradNormAttack``): minus the norm of the gradient of the text's mean
token loss with respect to the model's parameters. A model sits near a minimum on its training texts, so their
gradients are small: higher (= -norm) = member.

One forward and one backward pass per text. The per-example gradients come from a ``lax.map`` over the batch's rows
inside one jitted function (one row's gradient, one parameter-sized buffer, at a time: memory ~ 2x the parameters,
not batch x parameters as ``vmap`` would need). The norm is over all parameters together (flattened), for
p = 1, 2 and inf (``gradnorm_l1``, ``gradnorm_l2``, ``gradnorm_linf``, all three from the one pass). Where this
differs: mimir averages the per-parameter-tensor 2-norms (``mean([p.grad.norm() for p in params])``); the global
p-norm here is the paper's definition and is independent of how a family splits its tensors. The loss is over the
scored tokens only (padding masked; padded vocabulary rows have no probability), in float32.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mia_jax.engine import passes
from mia_jax.batching import real_vocab_size
from mia_jax.evaluation.metrics import scores_by_method
from mia_jax.scorers.base import register_multi_pass

NORMS = {"gradnorm_l1": 1.0, "gradnorm_l2": 2.0, "gradnorm_linf": float("inf")}


def _row_loss(graphdef, params, rest, ids, mask, vocab: int):
    model = nnx.merge(graphdef, params, rest)
    hidden = model.hidden_states(ids[None])[0, :-1].astype(jnp.float32)
    logits = hidden @ model.unembedding().astype(jnp.float32).T
    logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab, logits, -jnp.inf)
    logp = jax.nn.log_softmax(logits, axis=-1)
    lp = jnp.take_along_axis(logp, ids[1:, None], axis=-1)[:, 0]
    n = mask.sum()
    return -jnp.where(mask, lp, 0.0).sum() / jnp.maximum(n, 1)


@lru_cache(maxsize=8)
def _norms_fn(graphdef, vocab: int):
    grad = jax.grad(lambda params, rest, ids, mask: _row_loss(graphdef, params, rest, ids, mask, vocab))

    @jax.jit
    def fn(params, rest, ids, mask):
        def one(row):
            g = jax.tree.leaves(grad(params, rest, *row))
            g = [x.astype(jnp.float32) for x in g]
            return jnp.stack([sum(jnp.abs(x).sum() for x in g), jnp.sqrt(sum(jnp.square(x).sum() for x in g)),
                              jnp.max(jnp.stack([jnp.abs(x).max() for x in g]))])
        return jax.lax.map(one, (ids, mask))

    return fn


def gradient_norms(loaded, ids, mask) -> dict[str, np.ndarray]:
    """{gradnorm_l1/l2/linf: minus the p-norm [rows]} of each row's mean-loss gradient; ``ids`` int [rows, T]
    right-padded, ``mask`` bool [rows, T-1] of the scored targets (NaN for a row without one)."""
    graphdef, params, rest = nnx.split(loaded.model, nnx.Param, ...)
    out = np.asarray(_norms_fn(graphdef, real_vocab_size(loaded))(params, rest, jnp.asarray(ids, jnp.int32),
                                                                  jnp.asarray(mask, bool)), np.float64)
    empty = ~np.asarray(mask, bool).any(-1)
    out[empty] = np.nan
    return {name: -out[:, j] for j, name in enumerate(NORMS)}


@passes.register_pass("gradnorm")
def gradnorm_pass(name, loaded, texts, *, resume, **_) -> passes.Pass:
    """Each text's gradient norms (one forward + one backward), through the runner's buckets and resumable records."""
    def compute(ids, mask, batch_texts):  # the batch's filler rows (all padding) are not differentiated
        return gradient_norms(loaded, ids[: len(batch_texts)], mask[: len(batch_texts)])

    def fold(recs):
        values = scores_by_method(recs, list(NORMS))
        reasons = {i: f"{name} pass: {r['skip_reason']}" for i, r in enumerate(recs) if "skip_reason" in r}
        return np.stack([values[m] for m in NORMS], 1), reasons, {}

    return passes.Pass(loaded, list(texts), resume, fold, methods=list(NORMS), compute=compute)


def _method(column: int):
    def combine(loss: np.ndarray, norms: np.ndarray, texts: Sequence[str]):
        return np.asarray(norms, np.float64)[:, column], {}

    return combine


for _j, (_name, _p) in enumerate(NORMS.items()):
    _fn = _method(_j)
    _fn.__doc__ = f"GradNorm: minus the {_p:g}-norm of the gradient of the text's mean loss w.r.t. the parameters."
    register_multi_pass(_name, pass_kind="gradnorm")(_fn)
