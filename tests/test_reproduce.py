"""The WikiMIA reproduction's tables and plots from long-format results; its --from rebuild checks what it reads
(the run's manifest, one line per cell, no example twice) and writes only into a folder of its own."""
import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, check_rebuild_twice, snapshot

from mia_jax.evaluation import comparisons, metrics
from mia_jax.runs import files, rundir
from mia_jax import reproduce, reproduce_report

SCRIPT = Path(__file__).parents[1] / "scripts" / "reproduce_wikimia.py"


def load_script():
    spec = importlib.util.spec_from_file_location("reproduce_wikimia", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_results():
    rows = []
    for model in ("m1", "m2"):
        for length in (32, 64):
            for method in reproduce.methods_for(reproduce_report.PAPER_METHODS) + ["blind_bow"]:
                auroc = 0.5 + 0.01 * length / 32 + (0.1 if method == "min_k_pp@0.2" else 0) \
                    + (0.3 if method == "blind_bow" else 0) + (0.05 if model == "m2" else 0)
                rows.append(dict(model=model, length=length, setting="Ori.", method=method, auroc=auroc,
                                 tpr_at_5pct_fpr=auroc / 10))
    return rows


def test_table1_averages_lengths_and_bolds_the_best_detector():
    header, body = reproduce_report.pivot(fake_results(), "auroc", reproduce_report.PAPER_METHODS)
    assert header == ["Method", "m1 Ori.", "m2 Ori.", "Avg."]
    by_name = {row[0]: row for row in body}
    assert by_name["PPL"][1] == pytest.approx(0.515)  # mean of 0.51 (len 32) and 0.52 (len 64)
    assert by_name["Min-K%++"][2] == pytest.approx(0.665)
    assert by_name["Min-K%++"][3] == pytest.approx((0.615 + 0.665) / 2)
    md = reproduce_report.markdown(header, body)
    assert "| Min-K%++ | **0.615** | **0.665** | **0.640** |" in md
    assert "**" not in [line for line in md.splitlines() if line.startswith(f"| {reproduce_report.BLIND_ROW}")][0]


def test_reports_are_written(tmp_path):
    text = reproduce_report.write_reports(tmp_path, fake_results())
    assert "Table 1: AUROC" in text and "Table 6: TPR@5%FPR" in text and "k sweep" in text
    for name in ("table1_auroc.md", "table1_auroc.csv", "table6_tpr_at_5pct_fpr.csv", "k_sweep.csv",
                 "fig2b_auroc_by_length.png", "k_sweep.png", "results_long.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    with open(tmp_path / "k_sweep.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["k", "m1 Min-K%", "m1 Min-K%++", "m2 Min-K%", "m2 Min-K%++"] and len(rows) == 11
    assert (tmp_path / "fig2b_auroc_by_length.png").stat().st_size > 10_000


def test_script_end_to_end_on_tiny_models(tiny_llama_dir, tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    from helpers import assert_clean_error, ctrl_c_at_batch, write_tiny_llama

    ref_dir = tmp_path / "ref"
    write_tiny_llama(ref_dir, seed=3, vocab_size=400)
    script = Path(__file__).parents[1] / "scripts" / "reproduce_wikimia.py"
    spec = importlib.util.spec_from_file_location("reproduce_wikimia", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "repro"
    argv = ["--models", str(tiny_llama_dir), "--ref-models", str(ref_dir), "--lengths", "32", "64", "--limit", "24",
            "--tokens-per-batch", "64",
            "--n-neighbors", "2", "--n-bootstrap", "10", "--out", str(out)]
    with ctrl_c_at_batch(12):  # Ctrl-C in the middle of the first cell
        assert mod.main(argv) == 130
    assert "run the same command again to resume" in capsys.readouterr().err
    cell = out / "runs" / f"{tiny_llama_dir.name}-32-ori"
    kept = {p.name: len(p.read_text().splitlines()) for p in (cell / "passes").glob("*.jsonl")}
    assert any(0 < n < 24 for n in kept.values()) and not (cell / "results.jsonl").exists()
    assert mod.main(argv) == 0  # resumes the interrupted cell from its finished batches
    err = capsys.readouterr().err
    for name, n in kept.items():
        if n and n < 24:  # the pass that was cut short
            assert f"resuming from {cell / 'passes' / name}: {n} of 24 texts already scored" in err
    table = (out / "table1_auroc.md").read_text()
    for name, _ in reproduce_report.PAPER_METHODS:
        assert f"| {name} |" in table
    assert reproduce_report.BLIND_ROW in table
    assert (out / "fig2b_auroc_by_length.png").exists() and (out / "k_sweep.png").exists()
    assert (out / "examples.jsonl.gz").exists() and "[" in table.split("| PPL |")[1].splitlines()[0]
    # every table, its intervals and the plots come back from examples.jsonl.gz alone, byte for byte
    rebuilt = tmp_path / "rebuilt"
    assert mod.main(["--from", str(out), "--out", str(rebuilt)]) == 0
    for name in ("table1_auroc.md", "table1_auroc.csv", "table6_tpr_at_5pct_fpr.md", "table6_tpr_at_5pct_fpr.csv",
                 "k_sweep.csv", "results_long.json"):
        assert (rebuilt / name).read_bytes() == (out / name).read_bytes(), name
    ref_rows = [r for r in json.loads((out / "results_long.json").read_text()) if r["method"] == "ref"]
    assert ref_rows and {r["ref_unit"] for r in ref_rows} == {"byte"}  # the reference has another vocabulary
    # --from a folder that is not there: exit 2, one line, nothing written
    capsys.readouterr()
    assert mod.main(["--from", str(tmp_path / "nothing"), "--out", str(tmp_path / "r2")]) == 2
    assert_clean_error(2, capsys.readouterr().err, "nothing: no such folder")
    assert not (tmp_path / "r2").exists()
    # a cell folder holding a run of other settings is refused, not mixed
    assert mod.main(argv[:-6] + ["--n-neighbors", "3", "--n-bootstrap", "10", "--out", str(out)]) == 2
    assert "holds a different run" in capsys.readouterr().err


def test_mirrored_run_is_flagged_and_rebuilt_from_its_examples(tiny_llama_dir, tmp_path):
    """--allow-mirrored on two tiny models that are each other's reference: the Smaller-Ref cells are flagged (and
    their AUROCs sum to 1), and --from rebuilds the flagged tables from examples.jsonl.gz byte for byte."""
    import importlib.util
    from pathlib import Path

    from helpers import write_tiny_llama

    other = tmp_path / "other"
    write_tiny_llama(other, seed=5)
    script = Path(__file__).parents[1] / "scripts" / "reproduce_wikimia.py"
    spec = importlib.util.spec_from_file_location("reproduce_wikimia", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "repro"
    assert mod.main(["--models", str(tiny_llama_dir), str(other), "--ref-models", str(other), str(tiny_llama_dir),
                     "--allow-mirrored", "--lengths", "32", "--limit", "24", "--n-neighbors", "1",
                     "--n-bootstrap", "10", "--out", str(out)]) == 0
    table = (out / "table1_auroc.md").read_text()
    assert "‡" in table.split("| Smaller Ref |")[1].splitlines()[0]
    ref = [r["auroc"] for r in json.loads((out / "results_long.json").read_text()) if r["method"] == "ref"]
    assert len(ref) == 2 and ref[0] + ref[1] == pytest.approx(1.0)
    assert mod.main(["--from", str(out), "--out", str(tmp_path / "rebuilt")]) == 0
    for name in ("table1_auroc.md", "table6_tpr_at_5pct_fpr.md", "results_long.json"):
        assert (tmp_path / "rebuilt" / name).read_bytes() == (out / name).read_bytes(), name


def test_mirrored_pairs_are_found():
    assert reproduce.mirrored_pairs(["smollm2", "gemma3-270m"], ["gemma3-270m", "smollm2"]) == [
        ("smollm2", "gemma3-270m"), ("gemma3-270m", "smollm2")]
    assert reproduce.mirrored_pairs(["a", "b"], ["c", "a"]) == []
    assert reproduce.mirrored_pairs(["a"], ["a"]) == [("a", "a")]


def test_script_refuses_mirrored_pairs(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).parents[1] / "scripts" / "reproduce_wikimia.py"
    spec = importlib.util.spec_from_file_location("reproduce_wikimia", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "r"
    assert mod.main(["--models", "smollm2", "gemma3-270m", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "mirrored Smaller-Ref pairs smollm2 -> gemma3-270m, gemma3-270m -> smollm2" in err
    assert "--allow-mirrored" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_ref_per_byte_uses_totals_not_token_means():
    texts = ["abcd", "héllo wörld", "skipped"]
    main = {0: {"n_tokens": 3, "scores": {"loss": -2.0}}, 1: {"n_tokens": 5, "scores": {"loss": -1.0}},
            2: {"n_tokens": 1, "scores": {"loss": None}, "skip_reason": "x"}}
    ref = {0: {"n_tokens": 5, "scores": {"loss": -1.0}},
           1: {"n_tokens": 2, "scores": {"loss": -3.0}, "truncated": True},
           2: {"n_tokens": 4, "scores": {"loss": -1.0}}}
    got = reproduce.ref_per_byte(texts, main, ref)
    # text 0: target -2 * 2 tokens = -4, reference -1 * 4 tokens = -4: equal per byte, although -2 < -1 per token
    assert got[0] == 0.0
    assert np.isnan(got[1]) and np.isnan(got[2])  # truncated / skipped: no comparison
    main[1]["n_tokens"], ref[1] = 5, {"n_tokens": 3, "scores": {"loss": -3.0}}
    assert reproduce.ref_per_byte(texts, main, ref)[1] == pytest.approx((-4.0 + 6.0) / len("héllo wörld".encode()))


def test_tables_with_intervals_paired_bold_and_mirrored_flags(tmp_path):
    rng = np.random.default_rng(0)
    results, examples = [], {}
    for model in ("m1", "m2"):
        for length in (32, 64):
            labels = np.r_[np.ones(40, int), np.zeros(40, int)]
            scores = {m: rng.normal(size=80) for m in reproduce.methods_for(reproduce_report.PAPER_METHODS)}
            scores["min_k_pp@0.2"] = scores["min_k_pp@0.2"] + 3 * labels  # clearly best
            scores["min_k@0.2"] = scores["min_k_pp@0.2"] + 0.01 * rng.normal(size=80)  # indistinguishable from it
            scores["blind_bow"] = labels + 0.01 * rng.normal(size=80)  # perfect, but never bold
            examples[(model, length, "Ori.")] = {"labels": labels.tolist(),
                                                 "scores": {m: v.tolist() for m, v in scores.items()}}
            for m, v in scores.items():
                results.append(dict(model=model, length=length, setting="Ori.", method=m,
                                    **metrics.evaluate(labels, v, n_bootstrap=0)))
    text = reproduce_report.write_reports(tmp_path, results, examples=examples, mirrored=["m1", "m2"], n_bootstrap=100)
    table = (tmp_path / "table1_auroc.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    # both bold in both model columns (the average over models is no paired claim: never bold)
    assert rows["Min-K%++"].count("**") == 4 and rows["Min-K% Prob"].count("**") == 4
    assert "**" not in rows["PPL"] and "**" not in rows[reproduce_report.BLIND_ROW] and "**" not in rows["Smaller Ref"]
    assert rows["Smaller Ref"].count("‡") == 3 and "Mirrored Smaller-Ref pair" in table
    labels = np.array(examples[("m1", 32, "Ori.")]["labels"] + examples[("m1", 64, "Ori.")]["labels"])
    ppl = np.r_[examples[("m1", 32, "Ori.")]["scores"]["loss"], examples[("m1", 64, "Ori.")]["scores"]["loss"]]
    want = comparisons.evaluate_mean(labels, ppl, [32] * 80 + [64] * 80, n_bootstrap=100)
    assert f"{want['auroc']:.3f} [{want['auroc_ci'][0]:.3f}, {want['auroc_ci'][1]:.3f}]" in rows["PPL"]
    # Avg.: the mean over the two models with one bootstrap of the texts both scored (resampled within length)
    ppl2 = np.r_[examples[("m2", 32, "Ori.")]["scores"]["loss"], examples[("m2", 64, "Ori.")]["scores"]["loss"]]
    avg = comparisons.evaluate_mean(labels, np.stack([ppl, ppl2]), [32] * 80 + [64] * 80, n_bootstrap=100)
    assert rows["PPL"].endswith(f"| {avg['auroc']:.3f} [{avg['auroc_ci'][0]:.3f}, {avg['auroc_ci'][1]:.3f}] |")
    assert avg["auroc_ci"][0] < avg["auroc"] < avg["auroc_ci"][1]
    assert "Table 6" in text
    # the k sweep carries intervals too, and bolds nothing
    sweep = (tmp_path / "k_sweep.md").read_text()
    k02 = next(line for line in sweep.splitlines() if line.startswith("| 0.2 |"))
    mk = np.r_[examples[("m1", 32, "Ori.")]["scores"]["min_k@0.2"], examples[("m1", 64, "Ori.")]["scores"]["min_k@0.2"]]
    want = comparisons.evaluate_mean(labels, mk, [32] * 80 + [64] * 80, n_bootstrap=100)
    assert k02.split(" | ")[1] == f"{want['auroc']:.3f} [{want['auroc_ci'][0]:.3f}, {want['auroc_ci'][1]:.3f}]"
    assert "**" not in sweep


# ----------------------------------------------------------------------------- --from: what the rebuild reads


def fake_cells(n: int = 12, seed: int = 0) -> list[dict]:
    """Two cells (lengths 32, 64) of a reproduction's examples.jsonl.gz with ``n`` members and ``n`` non-members."""
    rng = np.random.default_rng(seed)
    methods = reproduce.methods_for(reproduce_report.PAPER_METHODS) + ["blind_bow"]
    labels = [1] * n + [0] * n
    return [{"model": "m", "length": length, "setting": "Ori.", "labels": list(labels), "methods": list(methods),
             "scores": {m: [float(x) for x in rng.normal(size=2 * n) + np.array(labels)] for m in methods},
             "ref_unit": "token", "ref_model": "r", "mirrored": False, "n_bootstrap": 4, "seed": 0}
            for length in (32, 64)]


def fake_source(folder: Path, cells: list[dict] | None = None) -> Path:
    """A reproduction folder as a run leaves it for its rebuilds: examples.jsonl.gz, sealed."""
    folder.mkdir(parents=True)
    files.write_jsonl_gz(folder / reproduce.EXAMPLES, cells or fake_cells())
    rundir.seal(folder, reproduce.REBUILD_READS)
    return folder


def duplicated_cell(cells):
    return cells + [cells[0]]


def duplicated_example(cells):
    c = cells[1]
    c["labels"].append(c["labels"][3])
    for m in c["methods"]:
        c["scores"][m].append(c["scores"][m][3])
    return cells


@pytest.mark.parametrize("corrupt, needles", [
    (duplicated_cell, ["cell m WikiMIA-32 Ori. appears twice (lines 1 and 3)"]),
    (duplicated_example, ["cell m WikiMIA-64 Ori.: examples 3 and 24 are the same example"]),
    ("truncate", ["examples.jsonl.gz was changed or cut after the run"]),
    ("delete", ["examples.jsonl.gz is missing"]),
    ("unsealed", ["no manifest.json"]),
])
def test_rebuild_refuses_a_source_it_cannot_trust(tmp_path, capsys, corrupt, needles):
    mod = load_script()
    src = fake_source(tmp_path / "src", corrupt(fake_cells()) if callable(corrupt) else None)
    if corrupt == "truncate":
        data = (src / reproduce.EXAMPLES).read_bytes()
        (src / reproduce.EXAMPLES).write_bytes(data[: len(data) // 2])
    elif corrupt == "delete":
        (src / reproduce.EXAMPLES).unlink()
    elif corrupt == "unsealed":
        (src / rundir.MANIFEST).unlink()
    before = snapshot(src)
    out = tmp_path / "out"
    rc = mod.main(["--from", str(src), "--out", str(out)])
    assert_clean_error(rc, capsys.readouterr().err, *needles)
    assert snapshot(src) == before and not out.exists()
    rc = mod.main(["--from", str(src), "--out", str(src)])  # in place: refused before anything is written
    assert_clean_error(rc, capsys.readouterr().err, *needles)
    assert snapshot(src) == before


def test_rebuild_into_its_own_earlier_rebuild_or_in_place(tmp_path, capsys):
    mod = load_script()
    src = fake_source(tmp_path / "src")
    out = tmp_path / "out"
    first = check_rebuild_twice(mod.main, src, out,
                                {"table1_auroc.md", "table1_auroc.csv", "k_sweep.png", "results_long.json"})
    assert mod.main(["--from", str(src), "--out", str(src)]) == 0  # in place
    for name in ("table1_auroc.md", "table6_tpr_at_5pct_fpr.csv", "k_sweep.csv", "results_long.json"):
        assert (src / name).read_bytes() == first[name], name
    rundir.verify(src, reproduce.REBUILD_READS)  # the examples it reads are untouched


def test_rebuild_refuses_an_out_holding_another_run(tmp_path, capsys):
    mod = load_script()
    src = fake_source(tmp_path / "src")
    other = fake_source(tmp_path / "other", fake_cells(seed=1))  # another reproduction (not a rebuild)
    (other / "table1_auroc.md").write_text("the other run's table\n")
    elsewhere = tmp_path / "elsewhere"  # the rebuild of another source
    assert mod.main(["--from", str(other), "--out", str(elsewhere)]) == 0
    for out, needle in ((other, "holds no run description"), (elsewhere, "holds a different run")):
        before = snapshot(out)
        capsys.readouterr()
        rc = mod.main(["--from", str(src), "--out", str(out)])
        assert_clean_error(rc, capsys.readouterr().err, str(out), needle)
        assert snapshot(out) == before


@pytest.mark.parametrize("argv, needle", [
    (["--n-bootstrap", "-5"], "argument --n-bootstrap: must be"),
    (["--lengths", "0"], "argument --lengths: must be"),
    (["--lengths", "48"], "WikiMIA has lengths 32, 64, 128, 256"),
    (["--lengths", "32", "32"], "--lengths names 32 twice"),
    (["--models", "a", "a", "--ref-models", "b", "b"], "--models names a twice"),
    (["--para-dir", "no/such/folder"], "no such folder"),
    (["--from", "no/such/folder"], "no such folder"),
])
def test_script_refuses_bad_arguments_before_writing(tmp_path, capsys, argv, needle):
    mod = load_script()
    out = tmp_path / "out"
    rc = mod.main([*argv, "--out", str(out)])
    assert_clean_error(rc, capsys.readouterr().err, needle)
    assert not out.exists()


def test_script_refuses_a_split_with_a_text_twice_before_loading_a_model(tmp_path, capsys):
    para = tmp_path / "para"
    para.mkdir()
    rows = [{"input": f"text {i % 5}", "label": i % 2} for i in range(12)]
    (para / "WikiMIA_length32_paraphrased.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    rc = load_script().main(["--models", "no-such-model", "--ref-models", "other", "--lengths", "32",
                             "--para-dir", str(para), "--out", str(out)])
    assert_clean_error(rc, capsys.readouterr().err, "wikimia-32-para: text 5 repeats text 0")
    assert not out.exists()


def test_cell_with_too_few_examples_is_na_with_its_reason_never_bold(tmp_path):
    cells = fake_cells(n=12)
    c = cells[0]  # length 32: 5 members left
    keep = list(range(5)) + list(range(12, 24))
    c["labels"] = [c["labels"][i] for i in keep]
    c["scores"] = {m: [v[i] for i in keep] for m, v in c["scores"].items()}
    c["scores"]["loss"][13] = None  # a non-finite score: counted in the note
    src = fake_source(tmp_path / "src", cells)
    text, outputs = reproduce.rebuild_outputs(src)
    table = outputs["table1_auroc.md"].decode()
    ppl = next(line for line in table.splitlines() if line.startswith("| PPL |"))
    assert "n/a" in ppl and "**" not in ppl
    assert "n/a (m Ori. 32): " in table and str(metrics.MIN_PER_CLASS) in table
    assert "NaN/inf, excluded from the metrics: m Ori. 32 loss: 1" in table


def test_a_model_without_any_auroc_is_drawn_and_tabled_as_na():
    results = fake_results()
    for r in results:
        if r["model"] == "m1":
            r.update(auroc=None, tpr_at_5pct_fpr=None, note="only 5 members (fewer than 10): no metric")
    text, outputs = reproduce_report.report_outputs(results)
    assert outputs["fig2b_auroc_by_length.png"][:4] == b"\x89PNG"
    ppl = next(line for line in text.splitlines() if line.startswith("| PPL |"))
    assert ppl.split(" | ")[1] == "n/a" and "n/a (m1 Ori. 32, m1 Ori. 64): only 5 members" in text
