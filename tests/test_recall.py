"""ReCaLL / Con-ReCaLL: the text read after a prefix of shots, only its own tokens scored; the shots refused when
they overlap the evaluated texts; a prefix pass two methods need runs once."""
import json

import jax.numpy as jnp
import numpy as np
import pytest

from mia_jax import batching, models
from mia_jax.evaluation import metrics
from mia_jax.engine import runner
from mia_jax.data import wikimia
from mia_jax.errors import UserError
from mia_jax.methods import recall as rc

DATA = wikimia(32)
TEXTS = [" ".join(t.split()[:6]) for t in DATA.texts[:6]]  # short: text + prefix fit the tiny model's 64 tokens
SHOTS = [" ".join(t.split()[:2]) for t in DATA.texts[10:30]]
SHOT_LABELS = DATA.labels[10:30]


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


def conditional_loss(loaded, prefix: str, text: str) -> float:
    """float64 reference: mean log p of the text's tokens after the prefix's, from the model's logits."""
    pre, ids = loaded.tokenizer.encode(prefix).ids, loaded.tokenizer.encode(text).ids
    if loaded.add_bos and ids[:1] == [loaded.bos_token_id]:
        ids = ids[1:]
    full = pre + ids
    logits = np.asarray(loaded.model(jnp.asarray([full], jnp.int32))[0], np.float64)
    logits = logits[:, : batching.real_vocab_size(loaded)]  # padded vocabulary rows have no probability
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return float(np.mean([logp[t - 1, full[t]] for t in range(len(pre), len(full))]))


def test_prefixed_text_scores_only_its_own_tokens(tiny):
    prefix = "The prefix, read as context. "
    recs = runner.score_texts(tiny, TEXTS, ["loss"], prefixes=[prefix] * len(TEXTS), progress=False)
    got = metrics.scores_by_method(recs, ["loss"])["loss"]
    want = [conditional_loss(tiny, prefix, t) for t in TEXTS]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert all(r["n_context"] == len(tiny.tokenizer.encode(prefix).ids) for r in recs)


def test_prefix_is_cut_from_its_start_to_fit_the_context(tiny):
    long_prefix = " ".join(DATA.texts[40:60])
    recs = runner.score_texts(tiny, TEXTS[:2], ["loss"], prefixes=[long_prefix] * 2, progress=False)
    n_text = [len(tiny.tokenizer.encode(t).ids) for t in TEXTS[:2]]
    for r, n in zip(recs, n_text):
        assert r["truncated"] and r["n_tokens"] == tiny.max_length and r["n_context"] == tiny.max_length - n


def test_recall_and_con_recall_against_their_formulas(tiny, tmp_path):
    prefixes = rc.prefix_shots(SHOTS, SHOT_LABELS, TEXTS, n_shots=3, seed=0)
    report = {}
    recs = runner.score_dataset(tiny, TEXTS, ["loss", "recall", "con_recall"], out_dir=tmp_path, progress=False,
                                pass_options={"recall_prefixes": prefixes}, report=report)
    s = metrics.scores_by_method(recs, ["loss", "recall", "con_recall"])
    ll_non = np.array([conditional_loss(tiny, prefixes["nonmember"], t) for t in TEXTS])
    ll_mem = np.array([conditional_loss(tiny, prefixes["member"], t) for t in TEXTS])
    np.testing.assert_allclose(s["recall"], ll_non / s["loss"], rtol=1e-5)
    np.testing.assert_allclose(s["con_recall"], (ll_non - ll_mem) / s["loss"], rtol=1e-4, atol=1e-6)
    # the non-member pass both methods need ran once: three passes in all
    assert sorted(report) == ["main", "prefix_member", "prefix_nonmember"]
    assert {p.name for p in (tmp_path / "passes").iterdir()} == {"main.jsonl", "prefix_nonmember.jsonl",
                                                                   "prefix_member.jsonl"}


def test_shots_are_seeded_and_per_label():
    a = rc.prefix_shots(SHOTS, SHOT_LABELS, TEXTS, n_shots=3, seed=0)
    assert a == rc.prefix_shots(SHOTS, SHOT_LABELS, TEXTS, n_shots=3, seed=0)
    assert a != rc.prefix_shots(SHOTS, SHOT_LABELS, TEXTS, n_shots=3, seed=1)
    for side, label in (("nonmember", 0), ("member", 1)):
        parts = a[side].split(rc.SEPARATOR)
        assert len(parts) == 3 and all(SHOT_LABELS[SHOTS.index(p)] == label for p in parts)


def test_shots_that_are_evaluated_texts_are_refused(tiny):
    with pytest.raises(UserError, match="disjoint from the evaluated texts"):
        rc.prefix_shots(SHOTS + [TEXTS[2].upper()], SHOT_LABELS + [0], TEXTS)


def test_missing_shots_is_a_clear_error(tiny, tmp_path):
    with pytest.raises(UserError, match="--recall-shots"):
        runner.score_dataset(tiny, TEXTS, ["recall"], out_dir=tmp_path, progress=False)
    only_nonmembers = rc.prefix_shots(SHOTS, [0] * len(SHOTS), TEXTS, n_shots=2)
    with pytest.raises(UserError, match="member \\(label 1\\) prefix"):
        runner.score_dataset(tiny, TEXTS, ["con_recall"], progress=False,
                             pass_options={"recall_prefixes": only_nonmembers})


def test_eval_with_recall_shots_on_the_command_line(tiny_llama_dir, tmp_path, capsys):
    from mia_jax.cli import main
    from mia_jax.runs.files import write_jsonl

    data, shots = tmp_path / "eval.jsonl", tmp_path / "shots.jsonl"
    write_jsonl(data, [{"input": t, "label": y} for t, y in zip(TEXTS, DATA.labels[:6])])
    write_jsonl(shots, [{"input": t, "label": y} for t, y in zip(SHOTS, SHOT_LABELS)])
    out = tmp_path / "run"
    argv = ["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "loss", "recall", "con_recall",
            "--recall-shots", str(shots), "--recall-n-shots", "3", "--out", str(out), "--n-bootstrap", "10",
            "--no-progress", "--no-blind"]
    assert main(argv) == 0
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["scores"]["recall"] is not None and r["scores"]["con_recall"] is not None for r in recs)
    meta = json.loads((out / "run.json").read_text())
    assert set(meta["method_resources"]["fingerprint"]["recall_prefixes"]) == {"member", "nonmember"}
    # other shots are another run: refused in the same folder
    capsys.readouterr()
    assert main(argv[:-6] + ["--recall-n-shots", "2", "--out", str(out), "--n-bootstrap", "10", "--no-progress",
                             "--no-blind"]) == 2
    assert "different" in capsys.readouterr().err.lower()


@pytest.mark.parametrize("extra, message", [
    ([], "add --recall-shots FILE"),
    (["--recall-shots", "SHOTS_OF_EVAL"], "disjoint from the evaluated texts"),
])
def test_recall_without_usable_shots_exits_2_with_one_line(tiny_llama_dir, tmp_path, capsys, extra, message):
    from mia_jax.cli import main
    from mia_jax.runs.files import write_jsonl

    data = tmp_path / "eval.jsonl"
    write_jsonl(data, [{"input": t, "label": y} for t, y in zip(TEXTS, DATA.labels[:6])])
    extra = [str(data) if e == "SHOTS_OF_EVAL" else e for e in extra]
    out = tmp_path / "run"
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "recall", "--out",
                 str(out), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not out.exists()
