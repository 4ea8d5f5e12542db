"""Online detection (`--window`): every window's score from the one forward pass over the whole text equals the
method on a separate forward over that window's prefix + window (float64 reference), at a fraction of the tokens."""
import csv
import json
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import write_tiny_llama

from mia_jax import batching, models
from mia_jax.engine import runner
from mia_jax.errors import UserError

WINDOW = 32


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("long_llama")
    write_tiny_llama(path, seed=3, max_position_embeddings=2048)
    return models.load(str(path))


def long_text(loaded, n_tokens: int, seed: int = 0) -> str:
    """A text of at least ``n_tokens`` tokens (random vocabulary words, seeded)."""
    rng = np.random.default_rng(seed)
    words = sorted(w for w in loaded.tokenizer.get_vocab() if w.isalpha())
    text = ""
    while len(loaded.tokenizer.encode(text).ids) < n_tokens:  # a few hundred words at a time
        text += "".join(" " + words[i] for i in rng.integers(len(words), size=256))
    return text


def reference_window_scores(loaded, ids: list[int], window: int) -> list[dict]:
    """float64, the naive way: one forward over each window's prefix + window, the window's tokens scored."""
    vocab = batching.real_vocab_size(loaded)
    graphdef, state = nnx.split(loaded.model)
    forward = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))
    out, tokens_read = [], 0
    for s in range(1, len(ids), window):  # targets s .. e-1 (token 0 has no prediction)
        e = min(s + window, len(ids))
        # the prefix + window alone, right-padded to one shape (one compilation; causal: padding changes nothing)
        padded = ids[:e] + [0] * (len(ids) - e)
        logits = np.asarray(forward(state, jnp.asarray([padded], jnp.int32))[0, :e], np.float64)[:, :vocab]
        tokens_read += e
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        rows = range(s - 1, e - 1)
        lp = np.array([logp[t, ids[t + 1]] for t in rows])
        p = np.exp(logp[s - 1: e - 1])
        mu = (p * logp[s - 1: e - 1]).sum(-1)
        var = (p * (logp[s - 1: e - 1] - mu[:, None]) ** 2).sum(-1)
        z = (lp - mu) / np.sqrt(var)
        k = max(1, (len(lp) * Fraction(1, 5)).numerator // (len(lp) * Fraction(1, 5)).denominator)
        out.append({"loss": lp.mean(), "min_k@0.2": np.sort(lp)[:k].mean(), "min_k_pp@0.2": np.sort(z)[:k].mean(),
                    "n": len(lp)})
    return out, tokens_read


def test_window_scores_equal_separate_prefix_passes_at_a_twentieth_of_the_tokens(long_model):
    text = long_text(long_model, 2048)
    ids = long_model.tokenizer.encode(text).ids[:2048]  # the runner cuts the text to the model's 2048-token context
    report = {}
    methods = ["loss", "min_k@0.2", "min_k_pp@0.2"]
    (rec,) = runner.score_texts(long_model, [text], methods, window=WINDOW, progress=False, report=report)
    win = rec["windows"]
    want, naive_tokens = reference_window_scores(long_model, ids, WINDOW)
    assert len(win["n_tokens"]) == len(want) == 64 and win["n_tokens"] == [w["n"] for w in want]
    for m in methods:
        np.testing.assert_allclose(win["scores"][m], [w[m] for w in want], rtol=2e-5, atol=1e-6, err_msg=m)
    # one forward pass over the 2048 tokens, against the naive 64 passes over prefix + window
    assert report["batches_computed"] == 1 and rec["n_tokens"] == 2048
    assert naive_tokens / rec["n_tokens"] >= 20
    # the whole-text score is still there and equals the token-weighted mean of the window losses
    np.testing.assert_allclose(rec["scores"]["loss"],
                               np.average(win["scores"]["loss"], weights=win["n_tokens"]), rtol=1e-6)


def test_windows_of_short_texts_and_zlib(tiny_llama_dir):
    loaded = models.load(str(tiny_llama_dir))
    texts = ["a short text", "another text that is a little longer than the first one, to have several windows"]
    recs = runner.score_texts(loaded, texts, ["loss", "zlib"], window=8, progress=False)
    for text, rec in zip(texts, recs):
        n = len(loaded.tokenizer.encode(text).ids) - 1
        assert sum(rec["windows"]["n_tokens"]) == n and all(k <= 8 for k in rec["windows"]["n_tokens"])
    # zlib reads each window's own decoded text
    ids = loaded.tokenizer.encode(texts[1]).ids
    from mia_jax.scorers import zlib_bytes

    first = loaded.tokenizer.decode(ids[1:9])
    assert recs[1]["windows"]["scores"]["zlib"][0] == pytest.approx(
        recs[1]["windows"]["scores"]["loss"][0] / zlib_bytes(first), rel=1e-6)  # float32 scores


def test_bad_windows_are_refused(tiny_llama_dir):
    loaded = models.load(str(tiny_llama_dir))
    with pytest.raises(UserError, match="larger than the model's context"):
        runner.score_texts(loaded, ["x y"], ["loss"], window=64, progress=False)
    with pytest.raises(UserError, match="at least 1"):
        runner.score_texts(loaded, ["x y"], ["loss"], window=0, progress=False)


def test_cli_window_too_large_exits_2_with_one_line_and_writes_nothing(tiny_llama_dir, tmp_path, capsys):
    from mia_jax.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"input": f"text number {i}", "label": i % 2}) for i in range(6)) + "\n")
    out = tmp_path / "out"
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--window", "500", "--out", str(out),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "larger than the model's context" in err[0] and not out.exists()


def test_eval_window_labels_metrics_and_first_flag(tiny_llama_dir, tmp_path, capsys):
    """A non-member + member concatenation: windows wholly in the member part are label 1, wholly before it 0,
    straddling ones left out; window metrics and each text's first flagged window are written."""
    from mia_jax.cli import main
    from mia_jax.data import wikimia

    ds = wikimia(32)
    members = [t for t, y in zip(ds.texts, ds.labels) if y == 1][:6]
    others = [t for t, y in zip(ds.texts, ds.labels) if y == 0][:6]
    rows = [{"input": a[:40] + " " + b[:40], "label": 1, "member_from": len(a[:40]) + 1}  # fits 64 tokens
            for a, b in zip(others, members)]
    data = tmp_path / "concat.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "loss", "min_k_pp",
                 "--window", "8", "--out", str(out), "--no-progress", "--no-blind", "--n-bootstrap", "10"]) == 0
    printed = capsys.readouterr()
    assert "Window-level detection" in printed.out and "windows of 8 tokens" in printed.err
    meta = json.loads((out / "run.json").read_text())["windows"]
    assert meta["method"] == "min_k_pp@0.2" and len(meta["first_flagged"]) == len(rows)
    lines = list(csv.reader(open(out / "windows.csv", newline="", encoding="utf-8")))
    assert lines[0] == ["text", "window", "n_tokens", "label", "loss", "min_k_pp@0.2", "window_text"]
    loaded = models.load(str(tiny_llama_dir))
    for r, (row, rec) in enumerate(zip(rows, map(json.loads, (out / "results.jsonl").read_text().splitlines()))):
        begins = [s for s, _ in loaded.tokenizer.encode(row["input"]).offsets][1:]
        cut = [line for line in lines[1:] if line[0] == str(r)]
        pos = 0
        for c in cut:
            n = int(c[2])
            sides = {b >= row["member_from"] for b in begins[pos: pos + n]}
            assert c[3] == ("" if len(sides) == 2 else str(int(sides.pop())))
            pos += n
        flag = meta["first_flagged"][r]
        scores = rec["windows"]["scores"]["min_k_pp@0.2"]
        assert flag is None or (scores[flag] > meta["threshold"] and all(s <= meta["threshold"] for s in scores[:flag]))
