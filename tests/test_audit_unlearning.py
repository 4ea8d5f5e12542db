"""mia_jax.audits.unlearning (Shi et al. 2023 section 7): chunking, the ratio window on hand-made scores (boundaries,
signs) against a float64 log-space reference, ROUGE-L against an LCS by hand and rouge-score, the sentence encoder
against transformers + torch, and `mia-jax audit-unlearning` end to end with two tiny models."""
import csv
import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import helpers
from helpers import (assert_clean_error, check_rebuilds_again, check_refused_into, cut_mid_row, drop_line,
                     write_tiny_llama, write_tiny_mlm)
from helpers import snapshot as folder_snapshot

from mia_jax import cli
from mia_jax.runs import rundir
from mia_jax.audits import common
from mia_jax.audits import unlearning as U
from mia_jax.audits import unlearning_probes as P
from mia_jax.audits import unlearning_rebuild, unlearning_report
from mia_jax.audits.unlearning_report import to_markdown
from mia_jax.data import wikimia
from mia_jax.errors import UserError
from mia_jax.models.sentence import SentenceEncoder

# ----------------------------------------------------------------------------- chunking


def test_chunk_words_by_hand():
    text = " ".join(f"w{i}" for i in range(10))
    assert common.chunk_words(text, 4, 2) == (["w0 w1 w2 w3", "w4 w5 w6 w7", "w8 w9"], 0)
    assert common.chunk_words(text, 4, 3) == (["w0 w1 w2 w3", "w4 w5 w6 w7"], 2)  # the 2-word tail: dropped, counted
    assert common.chunk_words(text, 5, 5) == (["w0 w1 w2 w3 w4", "w5 w6 w7 w8 w9"], 0)
    assert common.chunk_words(text, 512, 10) == ([text], 0)  # shorter than a chunk, kept whole
    assert common.chunk_words(text, 512, 32) == ([], 10)  # too short: a counted skip
    assert common.chunk_words("  \n ", 4, 1) == ([], 0)
    # verbatim: inner whitespace and line breaks stay, outer whitespace goes
    assert common.chunk_words("  a  b\nc d\n\ne f ", 3, 1) == (["a  b\nc", "d\n\ne f"], 0)
    with pytest.raises(UserError):
        common.chunk_words(text, 0, 1)


def test_make_chunks_counts():
    texts = [" ".join(["x"] * 10), "too short", " ".join(["y"] * 7)]
    chunks, counts = U.make_chunks(texts, 4, 3)
    assert [(c.source, c.position, c.word_offset, c.n_words) for c in chunks] == [
        (0, 0, 0, 4), (0, 1, 4, 4), (2, 0, 0, 4), (2, 1, 4, 3)]
    assert counts == {"texts": 3, "texts_too_short": 1, "tails_dropped": 1, "words_dropped": 4, "chunks": 4}


def test_split_prompt():
    assert P.split_prompt("a b\nc  d e", 3) == ("a b\nc", "d e")
    assert P.split_prompt("a b c", 3) == ("a b c", "")


# ----------------------------------------------------------------------------- the ratio window


def test_ratio_window_by_hand():
    # mia_jax scores (higher = member): Min-K% is a mean log-prob (negative), ppl is minus the perplexity
    orig = np.array([-2.0, -2.0, -1.0, -1.15, -1.0, -3.0, -1.0, 0.5, np.nan, -2.0, 0.0])
    unl = np.array([-2.2, -1.8, -1.15, -1.0, -1.0, -6.0, -1.14999, -1.0, -1.0, np.inf, -1.0])
    ratios, flags = U.ratio_flags(orig, unl, 1.15)
    np.testing.assert_allclose(ratios[:7], [1.1, 0.9, 1.15, 1 / 1.15, 1.0, 2.0, 1.14999], rtol=1e-15)
    # 1.15 and 1/1.15 exactly are outside the open window; a positive score (q < 0), NaN, inf or q = 0: undefined
    assert flags.tolist() == [True, True, False, False, True, False, True, False, False, False, False]
    assert np.isnan(ratios[7:]).all()
    # the ratio is q(unlearned) / q(original) on the paper's positive quantity, the same as of the raw scores
    np.testing.assert_allclose(U.score_ratio([-4.0], [-5.0]), [1.25])
    for bad in (1.0, 0.5, float("nan")):
        with pytest.raises(UserError, match="r > 1"):
            U.ratio_flags(orig, unl, bad)


def test_ratio_window_matches_a_log_space_reference():
    rng = np.random.default_rng(0)
    q_o = rng.lognormal(1.0, 1.0, 5000)
    q_u = q_o * np.exp(rng.normal(0, 0.2, 5000))
    for r in (1.05, 1.15, 2.0):
        ratios, flags = U.ratio_flags(-q_o, -q_u, r)
        log_ratio = np.log(q_u) - np.log(q_o)
        far = np.abs(np.abs(log_ratio) - np.log(r)) > 1e-12  # away from the boundary
        assert far.sum() > 4900
        np.testing.assert_array_equal(flags[far], (np.abs(log_ratio) < np.log(r))[far])
        np.testing.assert_allclose(np.log(ratios), log_ratio, atol=1e-12)
        assert 0 < flags.sum() < len(flags)


# ----------------------------------------------------------------------------- ROUGE-L


def lcs(a, b) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_rouge_l_by_hand():
    from rouge_score import rouge_scorer

    ref = "The cat sat on the mat."
    cands = ["the cat on a mat", "", "mat the on sat cat The", ref, "dog"]
    # LCS: "the cat on mat" = 4 of 5 candidate and 6 reference words
    p, r = 4 / 5, 4 / 6
    f = P.rouge_l(cands, ref)
    assert f[0] == pytest.approx(2 * p * r / (p + r), abs=1e-12) and f[1] == 0 and f[3] == 1 and f[4] == 0
    assert P.rouge_l(cands[:1], ref, "recall")[0] == pytest.approx(r, abs=1e-12)
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    np.testing.assert_allclose(f, [scorer.score(ref, c)["rougeL"].fmeasure for c in cands], atol=0)
    rng = np.random.default_rng(1)
    vocab = [f"w{i}" for i in range(6)]
    for _ in range(30):
        a, b = rng.choice(vocab, rng.integers(1, 15)).tolist(), rng.choice(vocab, rng.integers(1, 15)).tolist()
        n = lcs(a, b)
        pr, rc = n / len(a), n / len(b)
        want = 0.0 if n == 0 else 2 * pr * rc / (pr + rc)
        assert P.rouge_l([" ".join(a)], " ".join(b))[0] == pytest.approx(want, abs=1e-12)


def test_options_are_checked():
    ok = dict(chunk_words=512, min_words=32, k=0.2, ratio=1.15, max_probe=50, prompt_words=200, n_samples=20,
              max_new_tokens=None, temperature=1.0, top_k=None, batch_size=8)
    U.check_options(U.UnlearningConfig(**ok))
    for change, match in [(dict(ratio=1.0), "--ratio"), (dict(min_words=600), "--min-words"), (dict(k=0), "--k"),
                          (dict(prompt_words=512), "--prompt-words"), (dict(n_samples=0), "--n-samples"),
                          (dict(max_probe=-1), "--max-probe"), (dict(temperature=-1.0), "temperature")]:
        with pytest.raises(UserError, match=match):
            U.check_options(U.UnlearningConfig(**{**ok, **change}))


# ----------------------------------------------------------------------------- the command


def run_cli(argv) -> int:
    return cli.main(argv)


@pytest.fixture(scope="module")
def forget_set(tmp_path_factory):
    path = tmp_path_factory.mktemp("forget") / "forget.jsonl"
    texts = wikimia(64).texts[:3] + ["far too short"]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    qa = path.with_name("qa.jsonl")
    qa.write_text("".join(json.dumps(r) + "\n" for r in [
        {"question": "Who wrote the novel?", "answer": "the author"},
        {"question": "Where was the city founded?", "answer": "on the river bank"}]))
    return path, qa


ARGS = ["--chunk-words", "16", "--min-words", "6", "--prompt-words", "6", "--n-samples", "3", "--max-probe", "2",
        "--max-new-tokens", "8", "--no-progress"]


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def snapshot(folder):
    return {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in sorted(folder.rglob("*")) if f.is_file()}


def check_rebuild(out, again, capsys):
    """`--from out --out again` writes the same report, chunks.csv and probes.jsonl, and leaves `out` alone."""
    before = snapshot(out)
    capsys.readouterr()
    assert run_cli(["audit-unlearning", "--from", str(out), "--out", str(again), "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith("## Unlearning audit")
    assert snapshot(out) == before
    for name in ("unlearning.md", "chunks.csv", "probes.jsonl"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name
    assert (again / "ratios.png").is_file()
    old, new = json.loads((out / "unlearning.json").read_text()), json.loads((again / "unlearning.json").read_text())
    assert new.pop("rebuilt")["from"] == str(out)
    assert new == old
    return unlearning_rebuild.rebuild(again)


def test_command_two_models(tiny_llama_dir, forget_set, tmp_path, capsys):
    other = tmp_path / "unlearned"
    write_tiny_llama(other, seed=1)
    texts, qa = forget_set
    out = tmp_path / "audit"
    argv = ["audit-unlearning", "--original", str(tiny_llama_dir), "--unlearned", str(other), "--texts", str(texts),
            "--out", str(out), "--qa", str(qa), *ARGS]
    assert run_cli(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("## Unlearning audit")
    for name in ("unlearning.md", "unlearning.json", "chunks.csv", "ratios.png", "probes.jsonl",
                 "original/results.jsonl", "unlearned/results.jsonl"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "unlearning.json").read_text())
    rows = read_csv(out / "chunks.csv")
    c = saved["counts"]
    assert len(rows) == c["chunks"] == 12 and c["texts"] == 4 and c["texts_too_short"] == 1  # 3 x 64 words / 16
    assert [int(r["source_text"]) for r in rows] == [0] * 4 + [1] * 4 + [2] * 4
    nll = {side: np.array([float(r[f"min_k_nll_{side}"]) for r in rows]) for side in U.SIDES}
    assert (nll["original"] > 0).all() and not np.allclose(nll["original"], nll["unlearned"])
    ratio = np.array([float(r["min_k_ratio"]) for r in rows])
    np.testing.assert_allclose(ratio, nll["unlearned"] / nll["original"], rtol=1e-12)
    flagged = (ratio > 1 / 1.15) & (ratio < 1.15)
    assert [r["min_k_flagged"] == "True" for r in rows] == flagged.tolist()
    assert c["flagged_min_k"] == flagged.sum() == len(saved["flagged_min_k"])
    assert c["flagged_ppl"] == sum(r["ppl_flagged"] == "True" for r in rows)
    # the runs' own records hold the same scores (mia_jax orientation: minus the NLL)
    recs = [json.loads(line) for line in (out / "original" / "results.jsonl").read_text().splitlines()]
    np.testing.assert_allclose([-r["scores"]["min_k@0.2"] for r in recs], nll["original"], rtol=1e-12)
    assert c["probed"] == min(2, flagged.sum()) == len(saved["probes"])
    for p in saved["probes"]:
        assert 0 <= p["rougeL_original"]["mean"] <= p["rougeL_original"]["max"] <= 1
    assert saved["qa"]["n"] == 2 and len(saved["qa"]["questions"]) == 2
    assert saved["config"]["same_tokenizer"]  # the same tokenizer, another seed's weights
    # the QA ratios come from the per-question NLLs kept in unlearning.json
    q = saved["qa"]["questions"]
    np.testing.assert_allclose([x["ratio"] for x in q], [x["min_k_nll_unlearned"] / x["min_k_nll_original"]
                                                         for x in q], rtol=1e-15)
    # rebuilt without the models: the same files
    back = check_rebuild(out, tmp_path / "rebuilt", capsys)
    np.testing.assert_array_equal(-back.scores["original"]["min_k"], nll["original"])
    assert back.meta["models"] == saved["models"] and [c.text for c in back.chunks] == [""] * 12


def test_same_model_flags_every_chunk(tiny_llama_dir, forget_set, tmp_path, capsys):
    texts, _ = forget_set
    out = tmp_path / "same"
    write_tiny_mlm(tmp_path / "encoder")  # a BertForMaskedLM folder: its encoder serves as a sentence encoder
    argv = ["audit-unlearning", "--original", str(tiny_llama_dir), "--unlearned", str(tiny_llama_dir),
            "--texts", str(texts), "--out", str(out), "--embed-model", str(tmp_path / "encoder"), *ARGS]
    assert run_cli(argv) == 0
    saved = json.loads((out / "unlearning.json").read_text())
    rows = read_csv(out / "chunks.csv")
    assert all(float(r["min_k_ratio"]) == 1.0 and float(r["ppl_ratio"]) == 1.0 for r in rows)
    assert saved["counts"]["flagged_min_k"] == saved["counts"]["flagged_ppl"] == 12
    # the two models draw with the same keys: the same samples, the same ROUGE-L
    probes = [json.loads(line) for line in (out / "probes.jsonl").read_text().splitlines()]
    assert len(probes) == 2
    for p in probes:
        assert p["samples"]["original"] == p["samples"]["unlearned"] and len(p["samples"]["original"]) == 3
        assert p["rougeL_original"] == p["rougeL_unlearned"]
        assert p["rougeL_original"]["max"] == pytest.approx(max(P.rouge_l(p["samples"]["original"],
                                                                          p["reference"])))
        enc = SentenceEncoder(tmp_path / "encoder")
        cos = enc.embed(p["samples"]["original"]).astype(np.float64) @ enc.embed([p["reference"]])[0]
        assert p["embed_original"] == p["embed_unlearned"]
        assert p["embed_original"]["max"] == pytest.approx(cos.max(), abs=1e-5)
        assert p["embed_original"]["mean"] == pytest.approx(cos.mean(), abs=1e-5)
        # the per-sample values behind the summaries
        np.testing.assert_array_equal(p["rougeL_per_sample"]["original"],
                                      P.rouge_l(p["samples"]["original"], p["reference"]))
        np.testing.assert_allclose(p["embed_per_sample"]["original"], cos, atol=1e-5)
        assert p["embed_original"]["max"] == max(p["embed_per_sample"]["original"])
    md = (out / "unlearning.md").read_text()
    assert "Story completion on 2 flagged chunks" in md and "Cos max orig" in md
    check_rebuild(out, tmp_path / "rebuilt", capsys)
    # again: both runs resume, same outputs
    capsys.readouterr()
    assert run_cli(argv) == 0
    assert "resuming the original run" in capsys.readouterr().err
    assert read_csv(out / "chunks.csv") == rows


def test_different_tokenizers_are_noted(tiny_llama_dir, forget_set, tmp_path, capsys):
    other = tmp_path / "other_vocab"
    write_tiny_llama(other, seed=2, vocab_size=288)
    texts, _ = forget_set
    out = tmp_path / "tok"
    assert run_cli(["audit-unlearning", "--original", str(tiny_llama_dir), "--unlearned", str(other), "--texts",
                    str(texts), "--out", str(out), *ARGS, "--max-probe", "0"]) == 0
    assert "tokenize differently" in capsys.readouterr().out
    saved = json.loads((out / "unlearning.json").read_text())
    assert not saved["config"]["same_tokenizer"] and saved["counts"]["probed"] == 0
    assert np.isfinite([float(r["min_k_ratio"]) for r in read_csv(out / "chunks.csv")]).all()


def test_bad_input_writes_nothing(tiny_llama_dir, forget_set, tmp_path, capsys):
    texts, qa = forget_set
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"text": "only five words in here"}) + "\n")
    bad_qa = tmp_path / "bad_qa.jsonl"
    bad_qa.write_text(json.dumps({"question": "why?"}) + "\n")
    m = str(tiny_llama_dir)
    out = tmp_path / "o"
    base = ["audit-unlearning", "--original", m, "--unlearned", m, "--out", str(out)]
    cases = [
        (["--texts", str(tmp_path / "missing.jsonl")], "no such file"),
        (["--texts", str(texts), "--ratio", "1.0"], "--ratio must be a number above 1"),
        (["--texts", str(texts), "--ratio", "0.87"], "--ratio must be a number above 1"),
        (["--texts", str(short)], "no chunks"),
        (["--texts", str(texts), "--qa", str(bad_qa)], "has no 'question' or no 'answer'"),
        (["--texts", str(texts), "--unlearned", str(tmp_path / "nope")], "nope"),
        (["--texts", str(texts), "--embed-model", str(tmp_path / "nope")], "not a sentence-transformers folder"),
    ]
    for extra, message in cases:
        assert run_cli([*base, *extra, "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (extra, err)
    assert not out.exists()


# ----------------------------------------------------------------------------- rebuild (--from), without models


def hand_result():
    """An audit result from hand-made scores (NaN and -inf among them), probes and QA values, via ``analyse``."""
    rng = np.random.default_rng(3)
    chunks = [U.Chunk(0, j, 4 * j, 4, f"chunk {j}") for j in range(5)]
    so = {"min_k": -rng.lognormal(size=5), "ppl": -rng.lognormal(2, size=5)}  # full-precision floats
    so["min_k"][3] = np.nan
    so["ppl"][4] = -np.inf
    factor = np.array([1.0, 1.1, 1.2, 1.0, 0.8])
    scores = {"original": so, "unlearned": {name: x * factor for name, x in so.items()}}
    counts = {"texts": 1, "texts_too_short": 0, "tails_dropped": 0, "words_dropped": 0, "chunks": 5,
              "truncated_original": 0, "truncated_unlearned": 0, "flagged_without_continuation": 0, "probed": 1}
    config = dict(chunk_words=4, min_words=2, k=0.2, ratio=1.15, max_probe=2, prompt_words=2, n_samples=3,
                  max_new_tokens=None, temperature=1.0, top_k=None, seed=0, same_tokenizer=True)
    probes = [{"chunk": 1, "prompt": "a b", "reference": "c d",
               "samples": {"original": ["c d", "c", "x"], "unlearned": ["y", "c x", "z"]},
               "rougeL_per_sample": {"original": [1.0, 2 / 3, 0.0], "unlearned": [0.0, 0.5, 0.0]},
               "embed_per_sample": {"original": [0.9, 0.7, 0.1], "unlearned": [0.2, 0.3, 0.1]}}]
    qa = [{"question": f"q{i}", "answer": f"a{i}", "min_k_nll_original": o, "min_k_nll_unlearned": u,
           "answer_original": "x", "answer_unlearned": "y", "recall_original": ro, "recall_unlearned": ru}
          for i, (o, u, ro, ru) in enumerate([(2.0, 2.1, 0.5, 0.25), (2.0, 3.0, 1.0, 0.0), (None, 1.0, 0.0, 0.0)])]
    methods = {"min_k": "min_k@0.2", "ppl": "ppl"}
    return U.analyse(chunks, methods, scores, counts, config, ["Note: by hand."], probes, qa)


def test_analyse_by_hand():
    res = hand_result()
    assert res.flags["min_k"].tolist() == [True, True, False, False, False]  # ratios 1, 1.1, 1.2, NaN, 0.8
    assert res.flags["ppl"].tolist() == [True, True, False, True, False]  # 1, 1.1, 1.2, 1, undefined (inf)
    c = res.counts
    assert (c["scored_min_k"], c["flagged_min_k"], c["undefined_min_k"]) == (4, 2, 1)
    assert (c["scored_ppl"], c["flagged_ppl"], c["undefined_ppl"]) == (4, 3, 1)
    assert c["probed"] == 1 and list(c)[:5] == ["texts", "texts_too_short", "tails_dropped", "words_dropped", "chunks"]
    p = res.probes[0]
    assert p["rougeL_original"] == {"max": 1.0, "mean": pytest.approx(5 / 9, abs=1e-15)}
    assert p["embed_unlearned"] == {"max": 0.3, "mean": pytest.approx(0.2, abs=1e-15)}
    q = res.qa
    assert q["n"] == 3 and q["n_flagged"] == 1 and [x["flagged"] for x in q["questions"]] == [True, False, False]
    assert q["questions"][0]["ratio"] == pytest.approx(1.05, abs=1e-15) and q["questions"][2]["ratio"] is None
    assert q["flagged"] == {"n": 1, "original": 0.5, "unlearned": 0.25}
    assert q["other"] == {"n": 2, "original": 0.5, "unlearned": 0.0}
    md = to_markdown(res)
    assert "| 1 | 0 | 5-8 |" in md and "Cos max orig" in md and "Note: by hand." in md


def test_chunks_csv_round_trips_floats(tmp_path):
    from mia_jax.evaluation.report import write_csv

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.lognormal(0, 5, 200), [0.1 + 0.2, 1 / 3, 5e-324, 1.7976931348623157e308, 1e-300]])
    write_csv(tmp_path / "x.csv", ["x"], [[common.finite_or_none(v)] for v in x])
    back = np.array([float(r["x"]) for r in read_csv(tmp_path / "x.csv")])
    np.testing.assert_array_equal(back, x)  # exactly: written with repr


def test_rebuild_by_hand(tmp_path, capsys):
    res = hand_result()
    out = tmp_path / "a"
    out.mkdir()
    unlearning_report.write_outputs(res, out, {"command": "by hand"})
    back = unlearning_rebuild.rebuild(out)
    assert to_markdown(back) == to_markdown(res) and back.meta == {"command": "by hand"}
    assert back.counts == res.counts and back.probes == res.probes and back.qa == res.qa
    for side in U.SIDES:
        for name in ("min_k", "ppl"):
            want = np.where(np.isfinite(res.scores[side][name]), res.scores[side][name], np.nan)  # inf: an empty cell
            np.testing.assert_array_equal(back.scores[side][name], want)
    for name in ("min_k", "ppl"):
        np.testing.assert_array_equal(back.ratios[name], res.ratios[name])
        np.testing.assert_array_equal(back.flags[name], res.flags[name])
    check_rebuild(out, tmp_path / "b", capsys)
    # the analysis is redone, not copied: the unlearned model twice as unsure flags nothing
    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    rows = read_csv(out / "chunks.csv")
    for r in rows:
        for col in ("min_k_nll_unlearned", "ppl_unlearned"):
            r[col] = repr(2 * float(r[col])) if r[col] else ""
    with open(edited / "chunks.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    rundir.seal(edited, list(unlearning_report.REBUILD_READS))  # as if the run had written it so
    again = unlearning_rebuild.rebuild(edited)
    assert not again.flags["min_k"].any() and again.counts["flagged_ppl"] == 0
    np.testing.assert_allclose(again.ratios["min_k"], 2 * res.ratios["min_k"], rtol=1e-15)


def test_rebuild_bad_input_exits_2(tmp_path, capsys):
    good = tmp_path / "good"
    good.mkdir()
    unlearning_report.write_outputs(hand_result(), good, {})

    def broken(name, edit):
        """A copy of ``good`` edited, and sealed again when every file is there (as if the run had written it so:
        the strict reading is tested, not only the manifest)."""
        folder = tmp_path / name
        shutil.copytree(good, folder)
        edit(folder)
        if all((folder / f).is_file() for f in unlearning_report.REBUILD_READS):
            rundir.seal(folder, list(unlearning_report.REBUILD_READS))
        return str(folder)

    no_csv = broken("no_csv", lambda f: (f / "chunks.csv").unlink())
    old_probes = broken("old_probes", lambda f: (f / "probes.jsonl").write_text(json.dumps(
        {k: v for k, v in json.loads((f / "probes.jsonl").read_text()).items() if not k.endswith("_per_sample")})
        + "\n"))
    short_csv = broken("short_csv", lambda f: (f / "chunks.csv").write_text(
        "".join((f / "chunks.csv").read_text().splitlines(keepends=True)[:-1])))
    bad_cell = broken("bad_cell", lambda f: (f / "chunks.csv").write_text(
        (f / "chunks.csv").read_text().replace("\n0,0,0,0,4,", "\n0,0,0,0,four,", 1)))
    m = str(tmp_path / "model")
    out = tmp_path / "o"
    cases = [
        (["--from", no_csv], "chunks.csv is missing"),
        (["--from", str(tmp_path / "missing")], "no such folder"),
        (["--from", old_probes], "no rougeL_per_sample"),
        (["--from", short_csv], "has 4 chunks"),
        (["--from", bad_cell], "chunks.csv line 2: n_words is 'four', not a whole number"),
        (["--from", str(good), "--original", m], "leave out --original"),
        (["--from", str(good), "--texts", str(good / "chunks.csv"), "--qa", str(good / "chunks.csv")],
         "leave out --texts, --qa"),
        (["--original", m, "--unlearned", m], "--texts is required (or --from DIR"),
        ([], "--original, --unlearned, --texts are required"),
    ]
    for extra, message in cases:
        before = {d: snapshot(tmp_path / d) for d in ("good", "no_csv", "old_probes", "short_csv", "bad_cell")}
        assert run_cli(["audit-unlearning", *extra, "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (extra, err)
        assert not out.exists()
        assert {d: snapshot(tmp_path / d) for d in before} == before
    inside = good / "rebuilt"
    assert run_cli(["audit-unlearning", "--from", str(good), "--out", str(inside)]) == 2
    assert "inside a --from folder" in capsys.readouterr().err and not inside.exists()


# ----------------------------------------------------------------------------- --from: what it reads is checked

COMMITTED = Path(__file__).resolve().parents[1] / "results" / "audits" / "unlearning"


rebuild_cli = functools.partial(helpers.rebuild_cli, "audit-unlearning")  # the fixture `sealed`: conftest.py


@pytest.mark.parametrize("name, edit, needle", [
    ("probes.jsonl", drop_line, "marks 7 chunks probed"),  # the case: one probe fewer than marked
    ("probes.jsonl", lambda p: p.write_bytes(b""), "holds 0 probes"),
    ("chunks.csv", lambda p: p.write_text(p.read_text().replace(",True,", ",yes,", 1)), "not True or False"),
    ("chunks.csv", cut_mid_row, "chunks.csv line "),
    ("chunks.csv", lambda p: drop_line(p, 3), "expected 2 (rows in chunk order, none missing)"),
    ("probes.jsonl", cut_mid_row, "not valid JSON"),
])
def test_from_reads_strictly(sealed, name, edit, needle, tmp_path, capsys):
    """A damaged file that its manifest records as written (a run that wrote it so) is still refused: every cell,
    and the files against each other."""
    edit(sealed / name)
    rundir.seal(sealed, list(unlearning_report.REBUILD_READS))
    rc, err = rebuild_cli(sealed, tmp_path / "out", capsys)
    assert_clean_error(rc, err, needle)
    assert not (tmp_path / "out").exists()


def test_from_into_another_runs_folder_is_refused(sealed, tmp_path, capsys):
    check_refused_into("audit-unlearning", sealed, COMMITTED.parent / "books", tmp_path / "other", capsys)
    # the rebuild of another source is another run too
    first = tmp_path / "first"
    assert rebuild_cli(sealed, first, capsys)[0] == 0
    second = tmp_path / "second"
    shutil.copytree(sealed, second)
    before = folder_snapshot(first)
    rc, err = rebuild_cli(second, first, capsys)
    assert_clean_error(rc, err, "holds a different run")
    assert folder_snapshot(first) == before


def test_from_committed_folder_reproduces_it(sealed, tmp_path, capsys):
    """The committed audit rebuilds from its folder byte for byte (a byte-order mark is read); the rebuild again
    into its own earlier output, and in place."""
    for name in ("chunks.csv", "probes.jsonl", "unlearning.json"):
        (sealed / name).write_bytes(b"\xef\xbb\xbf" + (sealed / name).read_bytes())
    rundir.seal(sealed, list(unlearning_report.REBUILD_READS))
    out = tmp_path / "out"
    rc, err = rebuild_cli(sealed, out, capsys)
    assert rc == 0, err
    for name in ("chunks.csv", "probes.jsonl", "unlearning.md", "ratios.png"):
        assert (out / name).read_bytes() == (COMMITTED / name).read_bytes(), name
    new, old = (json.loads((d / "unlearning.json").read_text()) for d in (out, COMMITTED))
    old.pop("rebuilt")  # the committed folder is itself a rebuild
    assert new.pop("rebuilt")["from"] == str(sealed) and new == old
    check_rebuilds_again("audit-unlearning", sealed, out, "unlearning.json", capsys)
    unlearning_rebuild.rebuild(out)  # sealed again: verifies


def test_audit_into_another_runs_folder_is_refused(tiny_llama_dir, forget_set, tmp_path, capsys):
    """--out holding another run (a books audit) is refused untouched, one line and exit 2."""
    texts, _ = forget_set
    other = tmp_path / "other"
    shutil.copytree(COMMITTED.parent / "books", other)
    before = folder_snapshot(other)
    m = str(tiny_llama_dir)
    capsys.readouterr()
    rc = run_cli(["audit-unlearning", "--original", m, "--unlearned", m, "--texts", str(texts), "--out", str(other),
                  *ARGS])
    assert_clean_error(rc, capsys.readouterr().err, str(other), "refusing to write into it")
    assert folder_snapshot(other) == before


# ----------------------------------------------------------------------------- the sentence encoder


@pytest.mark.parity
def test_sentence_encoder_matches_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from helpers import hf_config, tiny_mlm_tokenizer

    tok = tiny_mlm_tokenizer("bert")
    cfg = hf_config("bert", tok.get_vocab_size())
    torch.manual_seed(0)
    ref = transformers.BertModel(transformers.BertConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    ref = ref.eval()
    with torch.no_grad():
        for _, p in ref.named_parameters():
            p.copy_(p + 0.1 * torch.randn_like(p) if p.ndim == 1 else 0.08 * torch.randn_like(p))
    ref.save_pretrained(tmp_path, safe_serialization=True)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24}))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True,
                                                                     "pooling_mode_cls_token": False}))
    texts = ["The cat sat on the mat.", "A much longer sentence about the history of the city, its people, its "
             "rivers and its many bridges, longer than the maximum sequence length.", ""]
    enc = SentenceEncoder(tmp_path)
    got = enc.embed(texts, batch_size=2)
    ids = [e.ids for e in enc.tokenizer.encode_batch(texts)]
    assert max(map(len, ids)) == 24  # truncated to max_seq_length, [SEP] kept
    want = []
    with torch.no_grad():
        for row in ids:  # one text at a time: no padding in the reference
            h = ref(input_ids=torch.tensor([row])).last_hidden_state[0].double()
            v = h.mean(0)
            want.append((v / v.norm()).numpy())
    np.testing.assert_allclose(got, np.array(want), atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(UserError, match="only mean pooling"):
        SentenceEncoder(tmp_path)
