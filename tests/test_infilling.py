"""Infilling Score: the runner's ``infill`` pass against a float64 re-statement of the authors' loop
(neginraoof/mink-plus-plus ``calculateInfillPerplexity`` + ``InfillMIA``) over the tiny model's transformers logits;
orientation; ``mia-jax eval --methods infilling`` end to end; bad options."""
import json
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.special import log_softmax

from mia_jax.evaluation import metrics
from mia_jax import models
from mia_jax.engine import runner
from mia_jax.batching import real_vocab_size
from mia_jax.cli import main
from mia_jax.data import wikimia
from mia_jax.errors import UserError
from mia_jax.methods import infilling as inf
from reference import count
from test_generate import V, make

TEXTS = [" ".join(t.split()[:n]) for t, n in zip(wikimia(32).texts[:4], (12, 6, 9, 3))] + ["x"]


def _logprobs(model, torch, ids, vocab):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :, :vocab].double()
    return torch.log_softmax(logits, -1).numpy()


def authors_infilling(tiny_dir, loaded, text, *, k=0.2, future=None):
    """Float64 infilling score of one text as the authors' loop computes it: for each position i whose next token is
    not the top-1, the text with it replaced by the top-1, the ratio of the standardised log-probabilities of that
    token and of the next ``future`` tokens (all by default) with position i's mu and sigma; 0 where it is the
    top-1; the mean of the lowest ``count(k, n)`` ratios (their ``int(n k)``, made exact as the project's)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    vocab = real_vocab_size(loaded)
    ids = loaded.tokenizer.encode(text).ids
    n = len(ids)
    logp = _logprobs(model, torch, ids, vocab)
    p = np.exp(logp)
    mu = (p * logp).sum(-1)
    sigma = np.sqrt((p * logp**2).sum(-1) - mu**2)
    length = n if future is None else future
    ratios = []
    for i in range(n - 1):
        opt = int(np.argmax(logp[i]))
        if ids[i + 1] == opt:
            ratios.append(0.0)
            continue
        alt = list(ids)
        alt[i + 1] = opt
        logp_opt = _logprobs(model, torch, alt, vocab)
        p_opt = np.exp(logp_opt[i])
        mu_opt = (p_opt * logp_opt[i]).sum()
        sigma_opt = np.sqrt((p_opt * logp_opt[i] ** 2).sum() - mu[i] ** 2)  # their typo: the original's mu
        r = (logp[i, ids[i + 1]] - mu[i]) / sigma[i] - (logp_opt[i, opt] - mu_opt) / sigma_opt
        for j in range(i, min(i + length, n - 3)):
            nxt = ids[j + 2]
            r += (logp[j + 1, nxt] - mu[i]) / sigma[i] - (logp_opt[j + 1, nxt] - mu_opt) / sigma_opt
        ratios.append(float(r))
    c = count(k, len(ratios))
    return float(np.mean(np.sort(ratios)[:c]))


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


@pytest.mark.parametrize("k, future", [(0.2, None), (0.5, 3), (1.0, 0)])
def test_infill_pass_equals_the_authors_loop_in_float64(tiny_llama_dir, loaded, tmp_path, k, future):
    report = {}
    recs = runner.score_dataset(loaded, TEXTS, ["infilling"], out_dir=tmp_path, batch_size=3, progress=False,
                                report=report, pass_options={"infilling": {"k": k, "future": future}})
    got = metrics.scores_by_method(recs, ["infilling"])["infilling"]
    assert sorted(report) == ["infill", "main"]
    for i, text in enumerate(TEXTS[:-1]):  # each text alone: padding and batch-mates change nothing
        assert got[i] == pytest.approx(authors_infilling(tiny_llama_dir, loaded, text, k=k, future=future),
                                       rel=1e-4, abs=1e-4), i
    assert np.isnan(got[-1]) and "nothing to predict" in recs[-1]["skip_reason"]  # one token
    extra = [r["scores"]["extra_forwards"] for r in map(json.loads, (tmp_path / "passes" / "infill.jsonl")
                                                        .read_text().splitlines()) if "skip_reason" not in r]
    n_pred = [len(loaded.tokenizer.encode(t).ids) - 1 for t in TEXTS[:-1]]
    assert all(0 <= e <= n for e, n in zip(extra, n_pred))
    assert (sum(extra) == 0) == (future == 0)  # L = 0 reads no changed text


def test_resumed_pass_recomputes_nothing(loaded, tmp_path):
    recs = runner.score_dataset(loaded, TEXTS, ["infilling"], out_dir=tmp_path, batch_size=2, progress=False)
    again = {}
    recs2 = runner.score_dataset(loaded, TEXTS, ["infilling"], out_dir=tmp_path, batch_size=2, progress=False,
                                 report=again, resume=True)
    assert again["infill"]["computed"] == 0 and recs2 == recs


def test_orientation_memorised_text_scores_higher(loaded):
    """A text whose every token is the model's top-1 (what a memorised text tends to) has only zero ratios: score 0;
    the same tokens shuffled have tokens far less likely than their top-1, whose lowest ratios are negative."""
    ids = [loaded.tokenizer.encode(TEXTS[0]).ids[0]]
    vocab = real_vocab_size(loaded)
    fns, state = inf._functions(loaded), nnx.split(loaded.model)[1]
    for _ in range(10):  # greedy continuation: the model's own top-1 at every position
        top = np.asarray(fns["text"](state, np.asarray([ids + [0]], np.int32))[3])[0, -1]
        ids.append(int(top) % vocab)
    greedy = np.asarray([ids])
    rng = np.random.default_rng(0)
    shuffled = np.asarray([[ids[0], *rng.permutation(ids[1:])]])
    mask = np.ones((1, len(ids) - 1), bool)
    got = {name: inf.infilling_scores(loaded, x, mask, k=0.2) for name, x in (("greedy", greedy),
                                                                                ("shuffled", shuffled))}
    assert got["greedy"]["infilling"][0] == 0.0 and got["greedy"]["extra_forwards"][0] == 0
    assert got["shuffled"]["infilling"][0] < 0.0 and got["shuffled"]["extra_forwards"][0] > 0


def test_eval_cli_gives_finite_scores(tiny_llama_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": t, "label": i % 2}) + "\n" for i, t in enumerate(TEXTS[:4])))
    out = tmp_path / "run"
    rc = main(["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "infilling", "loss",
               "--infilling-k", "0.5", "--infilling-future", "4", "--out", str(out), "--no-progress"])
    assert rc in (0, None)
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 4 and all(np.isfinite(r["scores"]["infilling"]) for r in recs)


@pytest.mark.parametrize("opts, match", [({"k": 0.0}, "infilling-k"), ({"k": 1.5}, "infilling-k"),
                                         ({"future": -1}, "infilling-future"), ({"future": 2.5}, "infilling-future")])
def test_bad_options_are_user_errors(loaded, opts, match):
    with pytest.raises(UserError, match=match):
        runner.score_dataset(loaded, TEXTS[:1], ["infilling"], progress=False, pass_options={"infilling": opts})


def test_cli_refuses_an_option_without_the_method(tiny_llama_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": t, "label": i % 2}) + "\n" for i, t in enumerate(TEXTS[:2])))
    rc = main(["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "loss", "--infilling-k", "0.5",
               "--out", str(tmp_path / "run"), "--no-progress"])
    assert rc == 2 and "'infilling' is not among --methods" in capsys.readouterr().err
    assert not (tmp_path / "run" / "results.jsonl").exists()


@pytest.mark.parametrize("family", ["llama_qwen2_mixed_window", "gemma3", "gpt2"])
@pytest.mark.parametrize("future", [None, 3])
def test_changed_texts_from_the_cache_equal_full_forwards(monkeypatch, family, future):
    """Each changed text's log-probabilities, run from its first changed slot against the original's cached keys and
    values (several windows, filler rows, sliding windows, learned positions), equal a full forward of the changed
    text at every future index the score reads."""
    model = make(family, seed=2)
    loaded = SimpleNamespace(model=model, config=model.config,
                             tokenizer=SimpleNamespace(get_vocab_size=lambda with_added_tokens=True: V))
    monkeypatch.setattr(inf, "TOKENS_PER_BATCH", {"cpu": 40, "gpu": 40, "tpu": 40})  # several chunks per window
    inf._FNS.pop(model, None)
    rng = np.random.default_rng(1)
    lengths = [30, 22]
    ids = np.zeros((2, 30), np.int64)
    for r, n in enumerate(lengths):
        ids[r, :n] = rng.integers(0, V, n)
    fns, state = inf._functions(loaded), nnx.split(model)[1]
    *_, top, k, v = fns["text"](state, jnp.asarray(ids, jnp.int32))
    top = np.asarray(top)
    todo = [(r, t) for r, n in enumerate(lengths) for t in range(n - 3) if ids[r, t + 1] != top[r, t]]
    ends = {(r, t): int(inf._future_end(t, lengths[r], future)) for r, t in todo}
    assert {s for s, _ in inf._windows(ends, 30)} == {1, 17}  # two windows of slots
    got = inf._changed_logprobs(fns, state, ids, top, (k, v), ends)
    alt = ids[[r for r, _ in todo]]
    alt[np.arange(len(todo)), [t + 1 for _, t in todo]] = [top[r, t] for r, t in todo]
    logits = np.asarray(jax.jit(lambda x: model(x))(jnp.asarray(alt, jnp.int32)), np.float64)  # one full forward
    ref = np.take_along_axis(log_softmax(logits[:, :-1], -1), alt[:, 1:, None], -1)[..., 0]
    for i, (r, t) in enumerate(todo):
        end = ends[(r, t)]
        np.testing.assert_allclose(got[(r, t)][t + 1: end + 1], ref[i, t + 1: end + 1], atol=2e-4, err_msg=str((r, t)))
