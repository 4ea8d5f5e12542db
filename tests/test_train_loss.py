"""train/loss.py (the vocabulary-chunked cross-entropy and its custom gradient) against float64 NumPy, and the
training step built on it (train/step.py): layer remat, and the same update as the full-logits loss it replaced."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from mia_jax import models
from train.loss import chunked_cross_entropy
from train.step import make_step


def reference(h, w, targets, mask, vocab_size):
    """float64 NumPy: (sum of masked nll, d/dh, d/dw) through the full log-softmax over the real rows."""
    h, w = np.asarray(h, np.float64), np.asarray(w, np.float64)
    logits = h @ w.T
    logits[..., vocab_size:] = -np.inf
    m = logits.max(-1, keepdims=True)
    logp = logits - (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    loss = float(np.sum(np.where(mask, nll, 0.0)))
    onehot = np.eye(w.shape[0])[targets]
    dlogits = mask[..., None] * (np.exp(logp) - onehot)
    dh = dlogits @ w
    dw = dlogits.reshape(-1, w.shape[0]).T @ h.reshape(-1, h.shape[-1])
    return loss, dh, dw


def assert_close(got, ref, rel=1e-5):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= rel * np.abs(ref).max(), (np.abs(got - ref).max(), np.abs(ref).max())


def problem(seed, b=3, t=7, d=16, rows=41, vocab=37):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((b, t, d)).astype(np.float32)
    w = (rng.standard_normal((rows, d)) * 0.7).astype(np.float32)
    w[vocab:] *= 5  # padding rows with large logits: they must not count
    targets = rng.integers(0, vocab, (b, t))
    mask = rng.random((b, t)) > 0.3
    mask[0, 0] = True
    return h, w, targets, mask


@pytest.mark.parametrize("chunk,shards", [(5, 1), (41, 1), (1000, 1), (3, 2)])
def test_value_and_gradient_match_float64(chunk, shards):
    rows = 42 if shards > 1 else 41  # 42 rows in 2 shards of 21: chunks of 3 divide, 41 / 5 does not
    h, w, targets, mask = problem(0, rows=rows)
    loss_ref, dh_ref, dw_ref = reference(h, w, targets, mask, 37)

    def f(h, w):
        return chunked_cross_entropy(h, w, targets, mask, vocab_size=37, chunk_size=chunk, shards=shards)

    (loss, n), (dh, dw) = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(h, w)
    assert int(n) == mask.sum()
    assert abs(float(loss) - loss_ref) <= 1e-5 * abs(loss_ref)
    assert_close(dh, dh_ref)
    assert_close(dw, dw_ref)
    assert np.all(np.asarray(dw)[37:] == 0)  # padding rows: no gradient
    assert np.all(np.asarray(dh)[~mask] == 0)  # masked-out tokens: no gradient


def test_no_vocab_size_means_every_row_and_no_mask_every_token():
    h, w, targets, _ = problem(1)
    every = np.ones(targets.shape, bool)
    loss_ref, dh_ref, dw_ref = reference(h, w, targets, every, w.shape[0])
    (loss, n), (dh, dw) = jax.value_and_grad(lambda h, w: chunked_cross_entropy(h, w, targets, chunk_size=8),
                                             argnums=(0, 1), has_aux=True)(h, w)
    assert int(n) == targets.size and abs(float(loss) - loss_ref) <= 1e-5 * abs(loss_ref)
    assert_close(dh, dh_ref)
    assert_close(dw, dw_ref)


U32, UBF16 = 2.0 ** -24, 2.0 ** -8  # unit roundoffs: float32 (24 significant bits), bfloat16 (8)
TINY = 2.0 ** -126  # float32's smallest normal: what underflow (or a CPU that flushes subnormals) may lose


def gamma(n: int) -> float:
    """Higham's bound on the relative error of an n-term float32 sum in any order: n u / (1 - n u)."""
    return n * U32 / (1 - n * U32)


def error_bounds(h, w, targets, mask, vocab, out_u):
    """Worst-case bounds (float64) on |loss - ref|, and elementwise on |dh - ref| and |dw - ref|, for the chunked loss
    of inputs ``h``, ``w`` (their values as given: for bfloat16 inputs, the rounded values), derived from the
    precisions and sizes alone, so that they hold on every CPU whatever its summation order or vector width.

    Logits accumulate in float32 (bfloat16 products are exact in float32): each is off by at most
    gamma(d) * sum_i |h_i w_ji|, plus a few roundings of its size in the online log-sum-exp and in x - lse (8 u
    allowed); so each p_j = exp(x_j - lse) is off by a factor of at most exp(2 E) and 4 u for exp itself, and by
    ``TINY`` where it underflows. The
    cotangent dx = p - onehot is rounded to the inputs' dtype (``out_u``), then dh = dx @ w and dw = dx.T @ h
    accumulate in float32 over the vocabulary and the tokens and are rounded to the inputs' dtype (``out_u``)."""
    h, w = np.asarray(h, np.float64), np.asarray(w, np.float64)[:vocab]
    h2, m = h.reshape(-1, h.shape[-1]), mask.reshape(-1).astype(np.float64)
    x = h2 @ w.T
    e = gamma(h2.shape[1]) * (np.abs(h2) @ np.abs(w).T).max(1) + 8 * U32 * np.abs(x).max(1)
    z = x - x.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    p, nll = np.exp(logp), -logp[np.arange(len(x)), targets.reshape(-1)]
    loss = float(np.sum(m * (2 * e + 4 * U32 * nll)) + gamma(len(m)) * np.sum(m * nll))
    a = m[:, None] * np.abs(p - np.eye(vocab)[targets.reshape(-1)])
    dp = p * (np.expm1(2 * e)[:, None] + 4 * U32) + TINY  # a probability under float32's range is 0
    da = m[:, None] * (dp + out_u * (a + dp))
    dh = da @ np.abs(w) + gamma(vocab) * (a + da) @ np.abs(w)
    dw = da.T @ np.abs(h2) + gamma(len(m)) * (a + da).T @ np.abs(h2)
    dh = dh + out_u * (a @ np.abs(w) + dh) + vocab * TINY
    dw = dw + out_u * (a.T @ np.abs(h2) + dw) + len(m) * TINY
    return loss, dh.reshape(h.shape), dw


def assert_within(got, ref, bound):
    err = np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64))
    assert np.all(err <= bound), (err.max(), bound.ravel()[np.argmax(err - bound)])


def test_extreme_logits_and_bfloat16():
    """Logits in the thousands and bfloat16 inputs, within error bounds derived from the precisions and sizes
    (``error_bounds``), not tolerances fitted on one CPU: a bound of 1e-4 of the largest gradient held on an Intel
    Xeon with AVX-512 and failed on an AMD EPYC without (5.5e-4 against 3.0e-4). The bounds stay small enough to
    mean something: a tenth of a percent of the loss, a few percent of the largest gradient."""
    h, w, targets, mask = problem(2)
    h = h * 300  # logits in the thousands: a naive exp overflows
    loss_ref, dh_ref, dw_ref = reference(h, w, targets, mask, 37)
    (loss, _), (dh, dw) = jax.value_and_grad(
        lambda h, w: chunked_cross_entropy(h, w, targets, mask, vocab_size=37, chunk_size=6), argnums=(0, 1),
        has_aux=True)(h, w)
    bound, bh, bw = error_bounds(h, w, targets, mask, 37, U32)
    assert bound < 1e-3 * abs(loss_ref) and bh.max() < 1e-2 * np.abs(dh_ref).max()
    assert bw.max() < 1e-2 * np.abs(dw_ref).max()
    assert np.isfinite(float(loss)) and abs(float(loss) - loss_ref) <= bound
    assert_within(dh, dh_ref, bh)
    assert_within(np.asarray(dw)[:37], dw_ref[:37], bw)
    assert np.all(np.asarray(dw)[37:] == 0)
    # bfloat16 inputs: float32 loss, gradients in bfloat16, close to the float64 values of the rounded inputs
    hb, wb = jnp.asarray(h / 300, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
    hf, wf = np.asarray(hb, np.float32), np.asarray(wb, np.float32)
    loss_ref, dh_ref, dw_ref = reference(hf, wf, targets, mask, 37)
    (loss, _), (dh, dw) = jax.value_and_grad(
        lambda h, w: chunked_cross_entropy(h, w, targets, mask, vocab_size=37, chunk_size=6), argnums=(0, 1),
        has_aux=True)(hb, wb)
    assert loss.dtype == jnp.float32 and dh.dtype == dw.dtype == jnp.bfloat16
    bound, bh, bw = error_bounds(hf, wf, targets, mask, 37, UBF16)
    assert bh.max() < 2e-2 * np.abs(dh_ref).max() and bw.max() < 2e-2 * np.abs(dw_ref).max()
    assert abs(float(loss) - loss_ref) <= bound < 1e-5 * abs(loss_ref)  # matmuls accumulate in float32
    assert_within(dh, dh_ref, bh)
    assert_within(np.asarray(dw, np.float32)[:37], dw_ref[:37], bw)


# ----------------------------------------------------------------------------- the training step


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    loaded = models.load(str(tiny_llama_dir))
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), nnx.to_pure_dict(nnx.state(loaded.model)))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, loaded.model.unembedding().shape[0] - 8, (2, 2, 12)).astype(np.int32)  # [A, M, T]
    mask = np.ones(ids.shape, bool)
    mask[1, 1, 7:] = False  # a padded sequence
    return loaded.model, params, ids, mask


def grads_of(model, params, ids, mask, remat):
    graphdef, state = nnx.split(model)

    def loss(p):
        nnx.replace_by_pure_dict(state, p)
        m = nnx.merge(graphdef, state)
        hidden = m.hidden_states(ids[:, :-1], remat=remat)
        return chunked_cross_entropy(hidden, m.unembedding(), ids[:, 1:], mask[:, 1:], chunk_size=7)[0]

    return jax.jit(jax.grad(loss))(params)


def test_layer_remat_same_gradients(tiny):
    model, params, ids, mask = tiny
    plain = grads_of(model, params, ids[0], mask[0], False)
    remat = grads_of(model, params, ids[0], mask[0], True)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(remat)):
        assert_close(b, a, rel=1e-6)
    assert max(float(np.abs(x).max()) for x in jax.tree.leaves(plain)) > 0


def old_step(model, opt):
    """The pre-chunking step: full [B, T, V] logits and log-softmax."""
    graphdef, state = nnx.split(model)

    def nll_sum(params, ids, mask):
        nnx.replace_by_pure_dict(state, params)
        m = nnx.merge(graphdef, state)
        logits = jnp.einsum("btd,vd->btv", m.hidden_states(ids[:, :-1]), m.unembedding())
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), ids[:, 1:, None], -1)[..., 0]
        return jnp.sum(jnp.where(mask[:, 1:], nll, 0.0)), jnp.sum(mask[:, 1:])

    def step(params, opt_state, ids, mask):
        grads, n = None, 0
        for a in range(ids.shape[0]):
            g, k = jax.grad(nll_sum, has_aux=True)(params, ids[a], mask[a])
            grads, n = (g if grads is None else jax.tree.map(jnp.add, grads, g)), n + k
        grads = jax.tree.map(lambda x: x / n, grads)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step


@pytest.mark.parametrize("remat", ["none", "layer"])
def test_step_equals_the_full_logits_step(tiny, remat):
    model, params, ids, mask = tiny
    opt = optax.sgd(1.0)  # the update is the gradient itself: differences are not hidden by Adam's normalisation
    new, _, metrics = jax.jit(make_step(model, opt, remat=remat, loss_chunk=5))(params, opt.init(params), ids, mask)
    ref, _ = jax.jit(old_step(model, opt))(params, opt.init(params), ids, mask)
    assert int(metrics["tokens"]) == mask[:, :, 1:].sum()
    for p0, a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new), jax.tree.leaves(ref)):
        assert_close(a - p0, b - p0)
        assert np.abs(b - p0).max() > 0
