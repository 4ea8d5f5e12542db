"""The training step: loss of a micro-batch, gradient accumulation, the optimizer update.

``make_step(model, opt, compute_dtype)`` returns a pure, un-jitted ``step(params, opt_state, ids, mask) ->
(params, opt_state, metrics)``; ``train.trainer.make_train_step`` jits it (with the mesh's shardings when there is
one). ids/mask are [A, M, T]: A micro-batches of M sequences, scanned with ``lax.scan``; the gradients are summed
and divided by the step's real token count, so the update equals one big batch's.

Master weights and optimizer state are float32; ``compute_dtype="bfloat16"`` casts the parameters to bfloat16
inside the loss (gradients flow back to the float32 copy). The loss is ``train.loss.chunked_cross_entropy``: float32
log-sum-exp over vocabulary chunks, the [B, T, V] logits never formed (forward or backward). All vocabulary rows
of the unembedding take part in the softmax (the model does not know its tokenizer's size).
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from mia_jax.models.attention import ENV as ATTENTION_ENV
from mia_jax.engine.sharding import gathered_for_lookup
from train.loss import DEFAULT_CHUNK, chunked_cross_entropy


def training_attention() -> str | None:
    """The attention implementation of the training step: $MIA_JAX_ATTENTION when set; else "chunked" on CPU and
    TPU (flash-style: no [T, S] probabilities saved for the backward pass; at SmolLM2's 8 x 512-token step on CPU
    it halved the step time against "full", which "auto" picks below 512^2 scores, and lowered peak memory), and
    "auto" elsewhere (cuDNN for bfloat16 on a GPU)."""
    if os.environ.get(ATTENTION_ENV) or jax.default_backend() == "gpu":
        return None
    return "chunked"


def make_loss(model: nnx.Module, compute_dtype: str = "float32", *, remat: str = "none",
              loss_chunk: int = DEFAULT_CHUNK, mesh: Mesh | None = None):
    """A pure ``nll_sum(params, ids, mask) -> (summed next-token nll (float32), token count)`` of one micro-batch
    (ids/mask [M, T]) for ``model``'s graph; the arguments as in ``make_step``."""
    if remat not in ("none", "layer"):
        raise ValueError(f"remat must be 'none' or 'layer', got {remat!r}")
    shards = int(dict(mesh.shape).get("model", 1)) if mesh is not None else 1
    graphdef, abstract = nnx.split(model)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), abstract)
    dtype = jnp.bfloat16 if compute_dtype == "bfloat16" else jnp.float32

    def rebuild(params):
        state = jax.tree.map(lambda x: x, abstract)
        nnx.replace_by_pure_dict(state, jax.tree.map(lambda x: x.astype(dtype), params))
        return nnx.merge(graphdef, state)

    def nll_sum(params, ids, mask):
        if mesh is not None:  # the embedding gathered over fsdp for the lookup of fsdp-split rows (see sharding)
            params = gathered_for_lookup(params, mesh)
        m = rebuild(params)
        hidden = m.hidden_states(ids[:, :-1], remat=remat == "layer", attention=training_attention())
        return chunked_cross_entropy(hidden, m.unembedding(), ids[:, 1:], mask[:, 1:], chunk_size=loss_chunk,
                                     shards=shards)

    return nll_sum


def make_step(model: nnx.Module, opt: optax.GradientTransformation, compute_dtype: str = "float32", *,
              remat: str = "none", loss_chunk: int = DEFAULT_CHUNK, mesh: Mesh | None = None):
    """A pure ``(params, opt_state, ids, mask) -> (params, opt_state, metrics)`` for ``model``'s graph.

    ``remat="layer"``: each decoder layer is recomputed in the backward pass (``CausalLM.hidden_states``).
    ``loss_chunk``: vocabulary rows per chunk of the loss (``train.loss.chunked_cross_entropy``). ``mesh``: the mesh
    the jitted step runs on (its ``model`` axis size sets the loss's vocabulary shards); None: one device."""
    nll_sum = make_loss(model, compute_dtype, remat=remat, loss_chunk=loss_chunk, mesh=mesh)
    grad_fn = jax.value_and_grad(nll_sum, has_aux=True)

    def step(params, opt_state, ids, mask):
        def micro(carry, xs):
            g_acc, l_acc, n_acc = carry
            (loss, n), g = grad_fn(params, *xs)
            return (jax.tree.map(jnp.add, g_acc, g), l_acc + loss, n_acc + n), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        (g, loss, n), _ = jax.lax.scan(micro, (zeros, jnp.float32(0), jnp.int32(0)), (ids, mask))
        denom = jnp.maximum(n, 1).astype(jnp.float32)
        grads = jax.tree.map(lambda x: x / denom, g)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss / denom, "grad_norm": optax.global_norm(grads), "tokens": n}

    return step
