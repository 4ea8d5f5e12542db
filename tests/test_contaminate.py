"""train/contaminate.py end to end on the `tiny` config: tables, figures, resume, refusals, every ablation."""
import csv
import hashlib
import json
import os
import signal
from pathlib import Path

import pytest
from helpers import complete_records, interrupt_when, start, wait_for
from sklearn.metrics import roc_auc_score

from mia_jax.evaluation import comparisons, metrics
from mia_jax import models
from mia_jax.runs import rundir
from train import contaminate, tables
from train.records import EXAMPLES, RUN_FILES, read_examples, write_examples
from train.sweep_tables import occurrence_curve
from train.config import TinyModelConfig
from train.tiny import write_tiny_model

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "contamination" / "tiny.yaml")
# smaller than the tiny config itself, to keep the sweeps quick
SMALL = ["corpus.background_tokens=8000", "corpus.n_positives=10", "corpus.n_negatives=10", "score.n_bootstrap=20",
         "train.epochs=1"]


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    """The JAX compilation cache (and any model cache) goes to a temporary folder, not ~/.cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MIA_JAX_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """One tiny base model for the sweeps (the main test builds its own through model.path=tiny)."""
    return str(write_tiny_model(tmp_path_factory.mktemp("tiny_base"), TinyModelConfig()))


def run(out, *args) -> int:
    return contaminate.main(["--config", TINY, "--out", str(out), "--no-progress", *args])


# score.batch_size=4: 32 scoring batches per pass, so that the kill test can interrupt one mid-way
TINY_ARGS = ["score.n_bootstrap=50", "score.batch_size=4"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One uninterrupted run of the tiny config: checked below, and the reference of the kill test."""
    out = tmp_path_factory.mktemp("tiny") / "run"
    assert run(out, *TINY_ARGS) == 0
    return out


def test_tiny_experiment(tiny_run, capsys):
    out = tiny_run
    for name in ("table3.md", "table3.csv", "table7.md", "table7.csv", "metrics.json", "run.json", "examples.jsonl.gz",
                 "roc.png", "corpus/manifest.json", "corpus/eval.jsonl", "train/metrics.jsonl",
                 "scores/trained/results.jsonl", "model/model.safetensors", "base_model/config.json"):
        assert (out / name).exists(), name
    table3 = (out / "table3.md").read_text()
    for text in ("BoolQ", "CommonsenseQA", "IMDB", "TruthfulQA", "Avg.", "Min-K% Prob (k=20%)", "Min-K%++",
                 "PPL", "Zlib", "Lowercase", "Ref (base model as reference)", "base model, before training",
                 "gain over the base model"):
        assert text in table3, text
    assert "TPR@5%FPR" in (out / "table7.md").read_text()
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"trained", "base", "blind", "average", "gain", "best", "family"}
    # the Holm family of each metric: every paired comparison behind the tables' verdicts (bold ties, gains, best)
    assert set(metrics["family"]) == {"auroc", "tpr_at_5pct_fpr"} and metrics["family"]["auroc"] > 4
    assert set(metrics["trained"]) == {"boolq", "commonsenseqa", "imdb", "truthfulqa"}
    r = metrics["trained"]["imdb"]["min_k@0.2"]
    eval_set = [json.loads(line) for line in (out / "corpus" / "eval.jsonl").read_text().splitlines()]
    records = [json.loads(line) for line in (out / "scores" / "trained" / "results.jsonl").read_text().splitlines()]
    imdb = [(e["label"], rec["scores"]["min_k@0.2"]) for e, rec in zip(eval_set, records) if e["dataset"] == "imdb"]
    assert r["n_members"] == r["n_nonmembers"] == 16
    assert r["auroc"] == pytest.approx(roc_auc_score([y for y, _ in imdb], [x for _, x in imdb]), abs=1e-12)
    assert "ref" in metrics["trained"]["boolq"] and "ref" not in metrics["base"]["boolq"]
    rows = list(csv.DictReader((out / "table3.csv").open()))
    assert {row["model"] for row in rows} == {"trained", "base", "none"}  # none: the blind baseline
    assert {row["dataset"] for row in rows if row["model"] == "none"} == set(metrics["trained"])
    info = json.loads((out / "run.json").read_text())
    assert info["train"]["tokens_per_second"] > 0 and info["train"]["steps"] > 1
    tokens = info["corpus"]["tokens"]
    assert info["corpus"]["contamination_rate"] == pytest.approx(tokens["contaminant"] / tokens["total"])
    manifest = json.loads((out / "corpus" / "manifest.json").read_text())
    assert manifest["tokens"]["total"] == info["corpus"]["tokens"]["total"]
    # every table of the run is rebuilt, without any model, from examples.jsonl.gz and run.json
    rebuilt = tmp_path_factory_dir(out) / "rebuilt"
    assert tables.main(["--from", str(out), "--out", str(rebuilt)]) == 0
    for name in ("table3.md", "table7.md", "table3.csv", "table7.csv", "metrics.json"):
        assert (rebuilt / name).read_bytes() == (out / name).read_bytes(), name
    assert "python -m train.tables --from" in table3
    # reference-free and oracle blocks apart, the oracle never bolded; the blind baseline per dataset
    free, oracle = table3.split("oracle reference")[0], table3.split("oracle reference")[1].split("blind baseline")[0]
    assert "Ref (base model" not in free and "Ref (base model" in oracle and "**" not in oracle
    assert "Blind BoW (no model)" in table3 and "[" in table3.split("Blind BoW (no model)")[1].splitlines()[0]
    # the base model's AUROC beside the trained one, with its own interval (metrics.json's base entry)
    lines = table3.splitlines()
    header = next(line for line in lines if line.startswith("| Method | BoolQ | BoolQ base"))
    row = next(line for line in lines if line.startswith("| Min-K% Prob (k=20%) |"))
    cell = dict(zip(header.split(" | "), row.split(" | ")))["IMDB base"].strip("* ")
    b = metrics["base"]["imdb"]["min_k@0.2"]
    assert cell == f"{b['auroc']:.3f} [{b['auroc_ci'][0]:.3f}, {b['auroc_ci'][1]:.3f}]"
    examples = read_examples(out / "examples.jsonl.gz")
    assert len(examples) == len(eval_set) and all("text" not in e for e in examples)
    assert [e["text_sha256"] for e in examples] == [hashlib.sha256(e["text"].encode()).hexdigest() for e in eval_set]
    assert [e["trained"]["min_k@0.2"] for e in examples] == [r["scores"]["min_k@0.2"] for r in records]
    blind_imdb = [(e["label"], e["blind"]) for e in examples if e["dataset"] == "imdb"]
    assert metrics["blind"]["imdb"]["auroc"] == pytest.approx(
        roc_auc_score([y for y, _ in blind_imdb], [x for _, x in blind_imdb]), abs=1e-12)
    for d, by_method in metrics["trained"].items():  # every cell carries its interval
        assert all(r["auroc_ci"] is not None and r["tpr_at_5pct_fpr_ci"] is not None for r in by_method.values())
    # a method is bold only if no paired bootstrap puts another method of its column above it
    for col, entry in metrics["best"]["trained"]["auroc"].items():
        assert entry["best"] != "ref" and all(c["auroc"]["diff"] >= 0 for c in entry["vs"].values() if c)
    # the exported model loads with the library loader
    assert models.load(str(out / "model")).config.vocab_size == 512

    # a changed config in the finished folder is refused with a clear message, and nothing in it changes
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert run(out, *TINY_ARGS, "train.lr=1e-5") == 2
    err = capsys.readouterr().err
    assert "holds a different run" in err and "train.lr: 0.003 -> 1e-05" in err and len(err.splitlines()) == 1
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()} == before


def test_oracle_ref_pass_reuses_the_base_pass(tiny_run):
    """The `ref` pass (reference = the base model) is not computed again: the base pass's losses are reused
    (counted in run.json) and equal the losses of a ref pass computed afresh with the base model."""
    import numpy as np

    from mia_jax.engine import runner

    out = tiny_run
    info = json.loads((out / "run.json").read_text())
    ref = info["scoring"]["trained"]["ref"]
    texts = [json.loads(line)["text"] for line in (out / "corpus" / "eval.jsonl").read_text().splitlines()]
    assert ref["computed"] == 0 and ref["batches_computed"] == 0 and ref["reused"] == len(texts) - ref["skipped"] > 0
    base = models.load(str(out / "base_model"), dtype=info["config"]["model"]["dtype"])
    fresh = runner.score_texts(base, texts, ["loss"], batch_size=info["config"]["score"]["batch_size"], progress=False)
    seeded = complete_records(out / "scores" / "trained" / "passes" / "ref.jsonl")
    assert [r["index"] for r in seeded] == list(range(len(texts)))
    got = np.array([r["scores"]["loss"] for r in seeded], float)
    want = np.array([r["scores"]["loss"] for r in fresh], float)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def tmp_path_factory_dir(out):
    return out.parent


def test_killed_then_interrupted_mid_scoring_resumes(tiny_run, tmp_path):
    """A real run killed (SIGKILL) while the base model scores, rerun and interrupted (SIGINT) while the trained
    model scores, then rerun to the end: finished batches are reused (counted), the files match ``tiny_run``."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    out = tmp_path / "run"
    n = len((tiny_run / "corpus" / "eval.jsonl").read_text().splitlines())
    cmd = [str(REPO / "train" / "contaminate.py"), "--config", TINY, "--out", str(out), "--no-progress", *TINY_ARGS]

    def base_main():
        return next((out / "base_scores").glob("*/passes/main.jsonl"), out / "base_scores" / "not-yet")

    # 1. SIGKILL while the base model scores the eval set (before training)
    proc = start(cmd, env=env)
    wait_for(proc, lambda: base_main().exists())
    interrupt_when(proc, base_main(), 8, signal.SIGKILL)
    done_base = len(complete_records(base_main()))
    assert 8 <= done_base < n and not (out / "train" / "done.json").exists()

    # 2. the same command resumes the base scores, trains, and is interrupted (Ctrl-C) scoring the trained model
    proc = start(cmd, env=env)
    err = interrupt_when(proc, out / "scores" / "trained" / "passes" / "main.jsonl", 8, signal.SIGINT)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert f"resuming from {base_main()}: {done_base} of {n} texts already scored" in err
    assert "interrupted; run the same command again to resume" in err
    done_trained = len(complete_records(out / "scores" / "trained" / "passes" / "main.jsonl"))
    assert 8 <= done_trained < n and (out / "train" / "done.json").exists()

    # 3. once more to the end: nothing finished is computed again, and every file matches the uninterrupted run
    assert contaminate.main(cmd[1:]) == 0
    scoring = json.loads((out / "run.json").read_text())["scoring"]
    assert scoring["base"]["main"]["reused"] == n and scoring["base"]["main"]["computed"] == 0
    assert scoring["trained"]["main"]["reused"] == done_trained
    assert scoring["trained"]["main"]["computed"] == n - done_trained
    for name in ("table3.md", "table7.md", "metrics.json", "examples.jsonl.gz", "scores/trained/results.jsonl",
                 "scores/trained/passes/lowercase.jsonl", "scores/trained/passes/ref.jsonl", "model/model.safetensors"):
        assert (out / name).read_bytes() == (tiny_run / name).read_bytes(), name
    assert base_main().read_bytes() == next((tiny_run / "base_scores").glob("*/passes/main.jsonl")).read_bytes()


SWEEP_ARGS = {"lr": ["ablation.lrs=[1e-4,3e-3]"], "occurrence": [],
              "size": ["ablation.background_tokens=[4000,8000]"],
              "news": ["ablation.news_background=[10,30]", "corpus.news.n_positives=10", "corpus.news.n_negatives=10"]}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, tiny_model):
    """Each of the four ablations run once (on first use) and shared by the tests below."""
    done = {}

    def get(kind: str) -> Path:
        if kind not in done:
            out = tmp_path_factory.mktemp(kind) / kind
            assert run(out, "--ablation", kind, f"model.path={tiny_model}", *SMALL, *SWEEP_ARGS[kind]) == 0
            done[kind] = out
        return done[kind]

    return get


def test_ablation_lr(tmp_path, sweeps):
    out = sweeps("lr")
    table4 = (out / "table4.md").read_text()
    assert "Learning rate" in table4 and "| 0.0001 |" in table4 and "| 0.003 |" in table4
    rows = list(csv.DictReader((out / "table4.csv").open()))
    assert {float(r["lr"]) for r in rows} == {1e-4, 3e-3} and len(rows) == 2 * (4 + 1) * 3  # 4 datasets + avg
    assert all(float(r["auroc_ci_lo"]) <= float(r["auroc"]) <= float(r["auroc_ci_hi"]) for r in rows)
    for sub in ("lr_0.0001", "lr_0.003"):
        assert (out / sub / "table3.md").exists()
    # both runs scored the same texts with the same base model: the base scores are computed once
    assert len(list((out / "base_scores").iterdir())) == 1
    # the learning rates compared by the paired bootstrap on the same examples; the sweep rebuilt without a model
    assert "lr 0.003 vs 0.0001, Min-K% Prob (k=20%) (paired bootstrap, same examples)" in table4
    assert table4.count("lr 0.003") >= 5 and "[0." in table4
    rebuilt = tmp_path / "rebuilt"
    assert tables.main(["--from", str(out), "--out", str(rebuilt)]) == 0
    for name in ("table4.md", "table4.csv", "lr_0.0001/table3.md", "lr_0.003/metrics.json"):
        assert (rebuilt / name).read_bytes() == (out / name).read_bytes(), name


def test_ablation_occurrence(tmp_path, sweeps):
    out = sweeps("occurrence")
    rows = list(csv.DictReader((out / "fig5c.csv").open()))
    assert rows and {"dataset", "occurrences", "n_members", "min_k@0.2"} <= set(rows[0])
    assert any(r["dataset"] == "all" for r in rows) and (out / "fig5c.png").exists()
    occ = json.loads((out / "occurrence" / "corpus" / "manifest.json").read_text())["datasets"]["imdb"]["occurrences"]
    assert sorted(set(occ)) == [1, 2, 4]  # occurrence buckets dealt evenly: each filled, not a Poisson draw
    counts = [occ.count(k) for k in (1, 2, 4)]
    assert max(counts) - min(counts) <= 1, counts
    rebuilt = tmp_path / "rebuilt"
    assert tables.main(["--from", str(out), "--out", str(rebuilt)]) == 0
    assert (rebuilt / "fig5c.md").read_bytes() == (out / "fig5c.md").read_bytes()
    assert "[" in (out / "fig5c.md").read_text()


@pytest.mark.parametrize("ablation, figure", [("size", "fig5a"), ("news", "fig5b")])
def test_ablation_size_and_news(tmp_path, sweeps, ablation, figure):
    out = sweeps(ablation)
    rows = list(csv.DictReader((out / f"{figure}.csv").open()))
    rates = sorted({float(r["contamination_pct"]) for r in rows})
    assert len(rates) == 2 and (out / f"{figure}.png").exists() and (out / f"{figure}.md").exists()
    if ablation == "news":
        assert {r["dataset"] for r in rows} == {"news"}
    rebuilt = tmp_path / "rebuilt"
    assert tables.main(["--from", str(out), "--out", str(rebuilt)]) == 0
    assert (rebuilt / f"{figure}.md").read_bytes() == (out / f"{figure}.md").read_bytes()
    md = (out / f"{figure}.md").read_text()
    assert "contamination rate" in md and "paired bootstrap" in md


def test_study_report_marks_each_claim_with_its_paired_interval(tmp_path, sweeps):
    from train import study

    folders = {k: sweeps(k) for k in ("lr", "size", "news", "occurrence")}
    out = tmp_path / "contamination.md"
    argv = [a for k, f in folders.items() for a in (f"--{k}", str(f))]
    assert study.main([*argv, "--out", str(out)]) == 0
    text = out.read_text()
    claims = json.loads(out.with_suffix(".claims.json").read_text())
    names = [c["claim"] for c in claims]
    assert sum(n.startswith("Table 3: Min-K% > ") for n in names) == 3  # PPL, Zlib, Lowercase (no neighbor here)
    assert sum(n.startswith("Table 4: lr 0.003 > lr 0.0001") for n in names) == 5  # average + 4 datasets
    assert any(n.startswith("Figure 5a") for n in names) and any(n.startswith("Figure 5b") for n in names)
    assert any(n.startswith("Figure 5c: Min-K% AUROC, k = 4 > k = 1") for n in names)
    for c in claims:  # the interval's sign, kept where Holm's correction over the claims allows; A - B
        lo, hi = c["ci"]
        want = "reproduced" if lo > 0 else "not reproduced" if hi < 0 else "not distinguishable"
        assert c["verdict_unadjusted"] == want and c["diff"] == pytest.approx(c["auroc_a"] - c["auroc_b"], abs=1e-12)
        lo, hi = c["p_holm_interval"]  # the Monte-Carlo interval of the adjusted p, on one side of 0.05 or undecided
        assert lo <= c["p_holm"] <= hi
        assert c["verdict"] == ("not distinguishable" if lo >= 0.05 else want if hi < 0.05 else "undecided")
        assert f"**{c['verdict']}**" in text
    # one claim recomputed from the committed per-example scores by hand: lr 0.003 vs 0.0001 on IMDB
    hi, lo = (read_examples(folders["lr"] / sub / EXAMPLES) for sub in ("lr_0.003", "lr_0.0001"))
    imdb = [i for i, r in enumerate(hi) if r["dataset"] == "imdb"]
    vec = lambda rows: [rows[i]["trained"]["min_k@0.2"] for i in imdb]  # noqa: E731
    got = next(c for c in claims if c["claim"].endswith("Min-K%, IMDB"))
    assert got["n_bootstrap"] >= comparisons.verdict_resamples(20)  # a verdict: >= 2000 resamples, more near 0.05
    comp = metrics.paired_bootstrap([hi[i]["label"] for i in imdb], vec(hi), vec(lo), seed=0,
                                    n_bootstrap=got["n_bootstrap"])
    assert got["ci"] == comp["auroc"]["ci"] and got["auroc_a"] == comp["auroc"]["a"]
    # each side's AUROC with its own interval from the same resamples, in the claims table
    assert got["auroc_a_ci"] == comp["auroc"]["a_ci"] and got["auroc_b_ci"] == comp["auroc"]["b_ci"]
    row = next(line for line in text.splitlines() if line.startswith(f"| {got['claim']} |"))
    assert f"| {got['auroc_b']:.3f} [{got['auroc_b_ci'][0]:.3f}, {got['auroc_b_ci'][1]:.3f}] |" in row
    # rebuilt from the same per-example scores: the same report
    assert study.main([*argv, "--out", str(tmp_path / "again.md")]) == 0
    assert (tmp_path / "again.md").read_text() == text


def test_study_report_with_one_sweep_on_two_models(tmp_path, sweeps):
    """`--lr A B`: the same sweep on two models gets a heading per model, and each model's claims carry its name
    (here B is A's per-example scores relabelled as another model: its verdicts must equal A's)."""
    import shutil

    from train import study

    a = sweeps("lr")
    b = tmp_path / "other-lr"
    shutil.copytree(a, b)
    for info in b.glob("lr_*/run.json"):
        run_info = json.loads(info.read_text())
        run_info["config"]["model"]["path"] = "other-model"
        info.write_text(json.dumps(run_info))
        rundir.seal(info.parent, list(RUN_FILES))
    rundir.seal(b, [f"{s}/{n}" for s in ("lr_0.0001", "lr_0.003") for n in RUN_FILES])
    out = tmp_path / "two.md"
    assert study.main(["--lr", str(a), str(b), "--out", str(out)]) == 0
    text = out.read_text()
    claims = {c["claim"]: c for c in json.loads(out.with_suffix(".claims.json").read_text())}
    model_a = json.loads((a / "lr_0.0001" / "run.json").read_text())["config"]["model"]["path"]
    assert f"# Model {model_a}: the lr sweep" in text and "# Model other-model: the lr sweep" in text
    mine = [n for n in claims if n.startswith(f"Table 4 ({model_a}): lr 0.003 > lr 0.0001")]
    assert len(mine) == 5 and len(claims) == 2 * (3 + 5)  # per model: 3 Table 3 claims, average + 4 datasets
    for name in mine:
        other = claims[name.replace(f"({model_a})", "(other-model)")]
        assert (other["ci"], other["verdict"]) == (claims[name]["ci"], claims[name]["verdict"])


def test_bad_config(tmp_path, capsys):
    assert run(tmp_path / "x", "train.nope=1") == 2
    assert "unknown key 'train.nope'" in capsys.readouterr().err
    assert run(tmp_path / "y", "corpus.n_positives=1000") == 2
    assert "requested but only" in capsys.readouterr().err


def test_pooled_occurrence_auroc_rank_normalises_each_dataset():
    """Two datasets that each separate members perfectly but on different score scales: pooled raw, the scales mix
    (AUROC < 1); pooled after per-dataset rank normalisation, 1.0 as in each dataset."""
    eval_set, records = [], []
    for dataset, shift in (("a", 0.0), ("b", 100.0)):
        for label, score in [(1, 2.0 + i / 10) for i in range(10)] + [(0, i / 10) for i in range(10)]:
            eval_set.append({"dataset": dataset, "label": label, "occurrences": 1 if label else 0})
            records.append({"scores": {"loss": score + shift}})
    rows = {(g, k): r["loss"]["auroc"] for g, k, _, r in occurrence_curve(records, eval_set, ["loss"])}
    assert rows[("a", 1)] == rows[("b", 1)] == rows[("all", 1)] == 1.0
    raw = metrics.auroc([e["label"] for e in eval_set], [r["scores"]["loss"] for r in records])
    assert raw < 0.8


# ----------------------------------------------------------------------------- rebuilds and refusals, without a model


def fake_run(folder: Path, n: int = 12, datasets=("boolq", "imdb"), lr: float = 1e-4, seed: int = 0,
             nan: int = 0, single_class: str | None = None, occurrence: str = "fixed") -> Path:
    """A sealed run folder as a contamination run writes it (run.json + examples.jsonl.gz), with random scores that
    separate members a little: ``n`` members and non-members per dataset, ``nan`` null scores of min_k."""
    import numpy as np

    rng = np.random.default_rng(seed)
    methods = ["loss", "ppl", "min_k@0.2", "ref"]
    rows = []
    for d in datasets:
        for label in (1, 0):
            for i in range(n):
                lab = 1 if d == single_class else label
                sc = {m: float(rng.normal(0.8 * lab)) for m in methods}
                rows.append({"dataset": d, "label": lab, "id": f"{d}{label}{i}", "occurrences": (1 + i % 2) * lab,
                             "text_sha256": hashlib.sha256(f"{d}{label}{i}".encode()).hexdigest(),
                             "blind": float(rng.normal()), "n_tokens": 10, "trained": sc,
                             "base": {m: v - 0.5 * lab for m, v in sc.items() if m != "ref"}})
    for r in rows[:nan]:
        r["trained"]["min_k@0.2"] = None
    folder.mkdir(parents=True, exist_ok=True)
    write_examples(folder / EXAMPLES, rows)
    info = {"methods": methods, "config": {"score": {"n_bootstrap": 20, "seed": 0}, "train": {"lr": lr},
                                           "model": {"path": "tiny"}, "corpus": {"occurrence": occurrence}},
            "corpus": {"tokens": {"total": 1000, "background": 800}, "contamination_rate": 0.2}}
    (folder / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    rundir.seal(folder, list(RUN_FILES))
    return folder


def fake_sweep(folder: Path, **kw) -> Path:
    for lr in (1e-5, 1e-4):
        fake_run(folder / f"lr_{lr:g}", lr=lr, **kw)
    rundir.seal(folder, [f"lr_{lr:g}/{n}" for lr in (1e-5, 1e-4) for n in RUN_FILES])
    return folder


def test_rebuild_out_rules(tmp_path, capsys):
    """--out: a new folder, then the same rebuild into it again; an eval run's folder (or any other) refused
    untouched; in place rewrites the tables."""
    from helpers import assert_clean_error, check_rebuild_twice, snapshot

    src = fake_sweep(tmp_path / "sweep")
    out = tmp_path / "out"
    first = check_rebuild_twice(tables.main, src, out,
                                {"table4.md", "table4.csv", "lr_0.0001/table3.md", "lr_1e-05/roc.png"})
    other = tmp_path / "eval-run"  # a finished run of another kind
    other.mkdir()
    (other / "config.json").write_text('{"command": "eval"}\n')
    (other / "roc.png").write_bytes(b"not ours")
    before = snapshot(other)
    capsys.readouterr()
    assert_clean_error(tables.main(["--from", str(src), "--out", str(other)]), capsys.readouterr().err, str(other))
    assert snapshot(other) == before
    other_src = fake_sweep(tmp_path / "sweep2", seed=1)  # a rebuild of another source: refused too
    assert_clean_error(tables.main(["--from", str(other_src), "--out", str(out)]), capsys.readouterr().err)
    assert snapshot(out) == first
    assert tables.main(["--from", str(src)]) == 0  # in place
    assert (src / "table4.md").read_bytes() == (out / "table4.md").read_bytes()


def test_rebuild_in_place_refused_before_any_write(tmp_path, capsys):
    """A dataset with one class only: refused with one line before anything is written (no metrics.json
    rewritten, no stale tables beside new ones)."""
    from helpers import assert_clean_error, snapshot

    run = fake_run(tmp_path / "run", single_class="imdb")
    for name in ("metrics.json", "table3.md", "table3.csv", "table7.md", "roc.png"):
        (run / name).write_text("earlier\n")
    before = snapshot(run)
    capsys.readouterr()
    assert_clean_error(tables.main(["--from", str(run)]), capsys.readouterr().err, "imdb", "one class")
    assert snapshot(run) == before


def _corrupt(run: Path, how: str) -> None:
    ex = run / EXAMPLES
    reseal = True
    if how == "truncated":
        ex.write_bytes(ex.read_bytes()[:-40])
        reseal = False
    elif how == "changed":
        (run / "run.json").write_text((run / "run.json").read_text().replace('"tiny"', '"other"'))
        reseal = False
    elif how == "cut-gzip":
        ex.write_bytes(ex.read_bytes()[:-40])
    elif how == "not-gzip":
        ex.write_text('{"dataset": "boolq"}\n')
    elif how == "empty":
        ex.write_bytes(b"")
    elif how == "garbage-gzip":
        import gzip

        ex.write_bytes(gzip.compress(b"not json\n"))
    elif how == "no-field":
        import gzip

        rows = read_examples(ex)
        del rows[3]["label"]
        ex.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    elif how == "bad-run-json":
        (run / "run.json").write_text("{not json")
    elif how == "run-json-schema":
        (run / "run.json").write_text('{"methods": []}')
    elif how == "no-manifest":
        (run / "manifest.json").unlink()
        reseal = False
    if reseal:  # as if the run had written the bad file (rundir.seal cannot count the rows of some of them)
        from mia_jax.runs.files import sha256

        (run / "manifest.json").write_text(json.dumps({"files": {n: {"sha256": sha256(run / n), "bytes": (
            run / n).stat().st_size, "rows": None} for n in RUN_FILES}}))


@pytest.mark.parametrize("how, needle", [
    ("truncated", "examples.jsonl.gz was changed or cut"), ("changed", "run.json was changed"),
    ("cut-gzip", "a cut or damaged gzip"), ("not-gzip", "a cut or damaged gzip"), ("empty", "holds no example"),
    ("garbage-gzip", "line 1"), ("no-field", "line 4: no 'label' field"), ("bad-run-json", "run.json is not valid"),
    ("run-json-schema", "methods"), ("no-manifest", "no manifest.json"),
])
def test_rebuild_bad_inputs_are_one_line(tmp_path, capsys, how, needle):
    from helpers import assert_clean_error, snapshot

    from train import study

    run = fake_run(tmp_path / "run")
    assert tables.main(["--from", str(run)]) == 0
    _corrupt(run, how)
    before = snapshot(run)
    capsys.readouterr()
    assert_clean_error(tables.main(["--from", str(run)]), capsys.readouterr().err, needle)
    assert snapshot(run) == before
    sweep = fake_sweep(tmp_path / "sweep")
    _corrupt(sweep / "lr_0.0001", how)
    if how not in ("truncated", "changed", "no-manifest"):  # the sweep's own record of its runs' files
        from mia_jax.runs.files import sha256

        names = [f"lr_{lr}/{n}" for lr in ("1e-05", "0.0001") for n in RUN_FILES]
        (sweep / "manifest.json").write_text(json.dumps({"files": {n: {"sha256": sha256(sweep / n), "bytes": (
            sweep / n).stat().st_size, "rows": None} for n in names}}))
    if how == "no-manifest":  # the sweep's own record covers its runs' files
        (sweep / "manifest.json").unlink()
    before = snapshot(sweep)
    out = tmp_path / "report.md"
    assert_clean_error(study.main(["--lr", str(sweep), "--out", str(out)]), capsys.readouterr().err)
    assert snapshot(sweep) == before and not out.exists()


def test_rebuild_bad_folders(tmp_path, capsys):
    from helpers import assert_clean_error

    from train import study

    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    for bad, needle in (("missing", "no such folder"), ("empty", "is empty"), ("file", "is a file"),
                        ("other", "neither a run folder")):
        assert_clean_error(tables.main(["--from", str(tmp_path / bad)]), capsys.readouterr().err, needle)
        assert_clean_error(study.main(["--lr", str(tmp_path / bad)]), capsys.readouterr().err)
    size = fake_run(tmp_path / "size" / "size_800")
    rundir.seal(size.parent, [f"size_800/{n}" for n in RUN_FILES])
    assert_clean_error(study.main(["--lr", str(size.parent)]), capsys.readouterr().err, "a size sweep")
    assert_clean_error(study.main(["--lr", str(size)]), capsys.readouterr().err, "one run's folder")


def test_too_few_examples_are_na_with_the_reason_never_bold(tmp_path, capsys):
    """8 members and 8 non-members per dataset (fewer than metrics.MIN_PER_CLASS): every cell, gain, comparison
    and claim n/a with the reason, nothing bold; NaN scores counted in the table."""
    from train import study

    sweep = fake_sweep(tmp_path / "few", n=8)
    assert tables.main(["--from", str(sweep)]) == 0
    table3 = (sweep / "lr_0.0001" / "table3.md").read_text()
    assert "**" not in table3 and "1.000" not in table3
    assert "n/a (fewer than 10 examples per class (8 members, 8 non-members))" in table3
    assert "trained model, average over datasets: n/a (" in table3
    table4 = (sweep / "table4.md").read_text()
    assert "**" not in table4 and "- IMDB: n/a (fewer than 10" in table4
    out = tmp_path / "report.md"
    assert study.main(["--lr", str(sweep), "--out", str(out)]) == 0
    claims = json.loads(out.with_suffix(".claims.json").read_text())
    assert claims and all(c["verdict"] == "n/a" and "fewer than 10" in c["note"] for c in claims)
    assert "**n/a" not in out.read_text() and "| n/a (" in out.read_text()
    # enough examples, some NaN scores: counted in the markdown table
    run = fake_run(tmp_path / "nan", n=12, nan=3)
    assert tables.main(["--from", str(run)]) == 0
    table3 = (run / "table3.md").read_text()
    header = next(line for line in table3.splitlines() if line.startswith("| Method |"))
    row = next(line for line in table3.splitlines() if line.startswith("| Min-K% Prob (k=20%) |"))
    assert header.endswith("| n (NaN) |") and row.endswith("| 45 (3) |")


CONTAM_REFUSALS = [
    (["model.path=/no/such/model"], {}, "no such local path"),
    (["corpus.n_positives=100000"], {}, "requested but only"),
    ([], {"MIA_JAX_DEVICE_MEMORY_GIB": "abc"}, "MIA_JAX_DEVICE_MEMORY_GIB"),
    (["corpus.n_positives=1", "corpus.n_negatives=1"], {}, "at least 10 members"),
    (["train.lr=abc"], {}, "expected a float"),
    (["train.steps=-1"], {}, "unknown key 'train.steps'"),
    (["train.epochs=-1"], {}, "train.epochs must be at least 1"),
    (["train.seq_len=4096"], {}, "exceeds the context"),
    (["--ablation", "lr", "ablation.lrs=[1e-4,-1]"], {}, "ablation.lrs"),
]


@pytest.mark.parametrize("args, env, needle", CONTAM_REFUSALS)
def test_contaminate_refused_before_claiming(tmp_path, capsys, monkeypatch, args, env, needle):
    """Refused with one line before --out is claimed: a new folder is not made, an existing one is unchanged (so the
    corrected command is not refused as 'a different run')."""
    from helpers import assert_clean_error, snapshot

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "run"
    assert_clean_error(run(out, *args), capsys.readouterr().err, needle)
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("x")
    before = snapshot(out)
    assert_clean_error(run(out, *args), capsys.readouterr().err, needle)
    assert snapshot(out) == before
