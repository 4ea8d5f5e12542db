"""The decoder skeleton every causal LM family shares (in the style of flax `examples/gemma` and levanter's
Llama-derived families): embedding, the stacked-layer scan, the final norm, the unembedding, `__call__`,
`hidden_states`, `init_cache` and `decode`. A family subclasses `CausalLM` and keeps only what is its own:

- `spec`: its `weights.WeightSpec` (parameters, checkpoint names and conversions, logical axes);
- `block(p, x, ctx, xs, attend) -> x`: one decoder layer on x [B, T, D] with that layer's parameters `p` (a
  dict), calling `attend(q, k, v, scale, sliding=False)` once for its attention core (q [B, T, H, Dh], k/v
  [B, T, KV, Dh] -> [B, T, H, Dh]; `sliding`: this layer uses the config's `sliding_window`);
- `normalize(x, w, b)`: its norm, used for the final one (`norm`, `norm_b`);
- optionally `context(positions)` (per-forward constants such as RoPE tables; positions [T] or [B, T]) and
  `layer_inputs()` (per-layer values scanned with the parameters, such as sliding flags or score scales).

The same `block` serves the full forward (`attend` is causal attention over the new tokens) and `decode`
(`attend` writes k/v into the layer's KV cache slots and attends over the cache), so prefill and generation
cannot drift apart. Optional top-level parameters the skeleton knows: `pos_embed` (learned positions, row
`position + position_offset`), `project_in` / `project_out` (OPT-350m's embedding projections), `lm_head`
(None when tied to `embed`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from mia_jax.models import attention as _attention
from mia_jax.models.layers import (
    build_module, cache_masks, causal_attention, causal_mask, check_dtype, check_length, gqa_attention, init_cache,
    learned_positions, segment_positions, unembed,
)
from mia_jax.models.weights import WeightSpec, init_params


def plus(y, p: dict, name: str):
    """y + p[name] when the layer has that bias (absent where the config or checkpoint has none)."""
    return y + p[name] if name in p else y


class CausalLM(nnx.Module):
    """A causal LM. `__call__` / `hidden_states` take no attention mask (batches are right-padded, attention is
    causal, positions arange(T)) unless given `segment_ids` (packed rows: attention stays within a segment and
    positions restart at each one); `decode` runs new tokens against a KV cache with per-row positions and a key
    mask (left-padded generation)."""

    spec: WeightSpec
    position_offset = 0

    def __init__(self, config, dtype: str = "float32", rngs: nnx.Rngs | None = None):
        dt = check_dtype(dtype)
        self.config, self.dtype = config, dtype
        init_params(self, self.spec, config, dt, rngs if rngs is not None else nnx.Rngs(0))

    @classmethod
    def from_params(cls, cfg, params: dict, dtype: str = "float32", place=None):
        """A model holding `params` (nested dict; arrays or lazy tensors, e.g. from `spec.from_hf`) without
        random initialisation; `place` as in `layers.build_module`."""
        return build_module(cls, cfg, params, dtype, place)

    # ------------------------------------------------------------------ what a family provides

    def block(self, p: dict, x, ctx: Any, xs: Any, attend):
        """One decoder layer: x [B, T, D] with layer parameters ``p``, ``context``'s ``ctx`` and the layer's
        ``layer_inputs`` value ``xs``, calling ``attend`` for its attention core -> x (see the module docstring)."""
        raise NotImplementedError

    def normalize(self, x, w, b=None):
        """The family's norm of x with scale ``w`` (and bias ``b``) -> x."""
        raise NotImplementedError

    def context(self, positions) -> Any:
        """Per-forward constants for ``block`` at ``positions`` ([T] or [B, T]), e.g. RoPE tables; None by default."""
        return None

    def layer_inputs(self) -> Any:
        """Per-layer values scanned with the parameters ([num_layers, ...]), e.g. sliding flags; None by default."""
        return None

    # ------------------------------------------------------------------ shared

    def embed_tokens(self, input_ids, positions):
        """Token embeddings [B, T, D] (through project_in, plus learned positions, where the family has them)."""
        x = jnp.take(self.embed[...], input_ids, axis=0)
        if getattr(self, "project_in", None) is not None:
            x = x @ self.project_in[...]
        if getattr(self, "pos_embed", None) is not None:
            x = x + learned_positions(self.pos_embed[...], positions, self.position_offset)
        return x

    def final(self, x):
        """The final norm (and project_out) of the last layer's output."""
        if getattr(self, "norm", None) is not None:
            b = getattr(self, "norm_b", None)
            x = self.normalize(x, self.norm[...], None if b is None else b[...])
        if getattr(self, "project_out", None) is not None:
            x = x @ self.project_out[...]
        return x

    @property
    def final_norm(self):
        """The final norm's scale parameter (None when the family or config has none, e.g. post-LN OPT)."""
        return getattr(self, "norm", None)

    def _sliding_window(self):
        return getattr(self.config, "sliding_window", None)

    def hidden_states(self, input_ids, remat: bool = False, attention: str | None = None, segment_ids=None):
        """int [B, T] -> hidden states after the final norm [B, T, D] (parameter dtype). ``remat``: recompute each
        decoder layer in the backward pass (``Stacked.scan``), for training on long sequences. ``attention``: the
        implementation of the causal attention of layers without a sliding window (``attention.attention``'s
        ``implementation``; default: $MIA_JAX_ATTENTION or "auto"). ``segment_ids`` int [B, T]: packed rows (by
        convention texts 1, 2, ... and padding 0; any ids work): a token attends only to the earlier tokens of its
        own segment id, and positions restart at 0 at the first token of each run of equal consecutive ids, so each
        text's hidden states are those of the text alone."""
        t = input_ids.shape[1]
        if getattr(self, "pos_embed", None) is not None:
            check_length(t, self.config.max_position_embeddings, type(self).__name__)
        positions = jnp.arange(t) if segment_ids is None else segment_positions(segment_ids)
        window = None if self._sliding_window() is None else causal_mask(t, self._sliding_window())
        full = None if window is None else causal_mask(t, None)
        ctx = self.context(positions)

        def attend(q, k, v, scale, sliding=False):
            if window is None:
                if attention is not None:
                    return _attention.attention(q, k, v, scale=scale, causal=True, implementation=attention,
                                                segment_ids=segment_ids)
                return causal_attention(q, k, v, scale, segment_ids)
            return gqa_attention(q, k, v, jnp.where(sliding, window, full), scale, segment_ids)

        x = self.embed_tokens(input_ids, positions)
        x = self.layers.scan(lambda p, h, xs: self.block(p, h, ctx, xs, attend), x, self.layer_inputs(), remat)
        return self.final(x)

    def unembedding(self):
        """[V, D]: the lm_head weight, or the token embedding when tied."""
        return (self.embed if self.lm_head is None else self.lm_head)[...]

    def __call__(self, input_ids, segment_ids=None):
        """int [B, T] -> float32 logits [B, T, V] (padded vocabulary rows included); `segment_ids` as in
        `hidden_states`."""
        return unembed(self.hidden_states(input_ids, segment_ids=segment_ids), self.unembedding())

    def init_cache(self, batch: int, max_len: int) -> dict:
        """An empty KV cache for `decode`: k, v [L, B, max_len, KV, Dh] and the next slot, `index` (every layer,
        sliding or not, keeps max_len slots)."""
        dims = self.spec.dims(self.config)
        return init_cache(self.config.num_hidden_layers, batch, max_len, dims.get("kv_heads", dims["heads"]),
                          dims["head_dim"], self.embed[...].dtype)

    def decode(self, input_ids, cache: dict, positions, key_mask):
        """Incremental forward: input_ids [B, T] written into cache slots index..index+T-1; positions [B, T] per
        row (0 at a row's first real token, as transformers' generate derives them from the attention mask);
        key_mask [B, S] the valid (non-pad) cache slots. -> (float32 logits [B, T, V], cache advanced by T)."""
        hidden, cache = self.decode_hidden(input_ids, cache, positions, key_mask)
        return unembed(hidden, self.unembedding()), cache

    def decode_last(self, input_ids, cache: dict, positions, key_mask):
        """`decode` with the logits of the last slot only: (float32 [B, V], the cache advanced by T). A prompt's
        prefill needs no more, and its [B, T, V] logits need not fit: 160 rows of 190 tokens over Gemma 3's 262,144
        ids would be 32 GB of float32."""
        hidden, cache = self.decode_hidden(input_ids, cache, positions, key_mask)
        return unembed(hidden[:, -1:], self.unembedding())[:, 0], cache

    def decode_hidden(self, input_ids, cache: dict, positions, key_mask):
        """`decode` without the unembedding: (hidden states after the final norm [B, T, D] (parameter dtype), the
        cache advanced by T), for statistics over the vocabulary in chunks (``stats.token_stats_from_hidden``)."""
        index, t = cache["index"], input_ids.shape[1]
        full, window = cache_masks(cache, t, key_mask, self._sliding_window())
        ctx = self.context(positions)

        def body(carry, px):
            h, ck, cv, i = carry
            new = {}

            def attend(q, k, v, scale, sliding=False):
                new["k"] = jax.lax.dynamic_update_slice(ck, k[None].astype(ck.dtype), (i, 0, index, 0, 0))
                new["v"] = jax.lax.dynamic_update_slice(cv, v[None].astype(cv.dtype), (i, 0, index, 0, 0))
                mask = jnp.where(sliding, window, full)
                return gqa_attention(q, new["k"][i].astype(q.dtype), new["v"][i].astype(v.dtype), mask, scale)

            h = self.block(px[0], h, ctx, px[1], attend)
            return (h, new["k"], new["v"], i + 1), None

        carry = (self.embed_tokens(input_ids, positions), cache["k"], cache["v"], jnp.int32(0))
        (x, k, v, _), _ = jax.lax.scan(body, carry, (self.layers.arrays(), self.layer_inputs()))
        return self.final(x), {"k": k, "v": v, "index": index + t}
