"""scripts/detectors.py end to end on a tiny model: the stratified sample, the shots kept out, one timed group per
set of passes (exact passes per text), a rerun that reuses every group without re-timing it, and the report.
Then the guard: a rerun with another model or seed refused with the differences, a second process refused with the
first one's PID, every bad input one line and exit 2 with nothing written, and ``--from`` on damaged files."""
import gzip
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import ENV, REPO, assert_clean_error, snapshot, write_tiny_llama

from mia_jax.evaluation import metrics
from mia_jax.runs import rundir

SCRIPT = Path(__file__).parents[1] / "scripts" / "detectors.py"


@pytest.fixture(scope="module")
def det():
    spec = importlib.util.spec_from_file_location("detectors_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rc(det, argv) -> int:
    try:
        return det.main(argv)
    except SystemExit as e:  # argparse's own exit, where the guard does not turn it into a status
        return e.code


def _eval_file(path: Path) -> list[dict]:
    rows = [{"text": f"{name if i % 3 else name.title()} example {i}: the {'cat' if y else 'dog'} number "
                     f"{i * 7 % 13} sat on mat {i}.", "label": y, "dataset": name}
            for name in ("alpha", "beta") for y in (0, 1) for i in range(9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _argv(model, eval_path, out, *extra) -> list[str]:
    return ["--model", str(model), "--eval", str(eval_path), "--name", "toy", "--shots", "2", "--n-shots", "2",
            "--per-cell", "5", "--n-neighbors", "2", "--samia-samples", "2", "--skip", "pac", "polarized",
            "--n-bootstrap", "20", "--no-progress", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def finished(det, tiny_llama_dir, tmp_path_factory):
    """A finished run of every method but pac / polarized on the tiny model: (folder, its argv, the eval rows)."""
    tmp = tmp_path_factory.mktemp("detectors")
    rows = _eval_file(tmp / "eval.jsonl")
    out = tmp / "det"
    argv = _argv(tiny_llama_dir, tmp / "eval.jsonl", out)
    assert det.main(argv) == 0
    return out, argv, rows


def _copy(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished[0], tmp_path / "det"))


def test_detectors_script(det, finished, tmp_path, capsys):
    out, argv, rows = finished
    info = json.loads((out / "info.json").read_text())
    assert info["n_evaluated"] == 20 and info["n_shots_held_out"] == 8 and info["per_cell"] == 5
    with gzip.open(out / det.EXAMPLES, "rt") as fh:
        ex = [json.loads(line) for line in fh]
    assert Counter((r["dataset"], r["label"]) for r in ex) == {(d, y): 5 for d in ("alpha", "beta") for y in (0, 1)}
    assert len({r["text_sha256"] for r in ex}) == 20
    sha = [hashlib.sha256(r["text"].encode()).hexdigest() for r in rows]
    assert all(sha[r["index"]] == r["text_sha256"] for r in ex)  # the index names the file's row
    assert "pac" not in info["methods"] and {"gradnorm_l2", "con_recall", "dc_pdd", "min_k_pp@0.2"} <= set(
        info["methods"])
    cost = json.loads((out / "cost.json").read_text())
    single = cost["single-pass"]
    assert (single["forward_per_text"], single["backward_per_text"], single["texts"]) == (1, 0, 20)
    assert "dc_pdd" in single["methods"] and "con_recall" not in single["methods"]
    grad = cost["gradnorm_l1+gradnorm_l2+gradnorm_linf"]
    assert grad["backward_per_text"] == 1 and grad["forward_per_text"] >= 1
    assert cost["con_recall"]["forward_per_text"] == 3 and cost["recall"]["forward_per_text"] == 2
    assert cost["infilling"]["forward_per_text"] > 2  # the text twice, then its changed texts (extra_forwards)
    assert cost["lowercase"]["tokens"] > 0
    # the run's description and its seal
    assert (out / rundir.FINGERPRINT).exists() and not (out / rundir.LOCK).exists()
    assert set(json.loads((out / rundir.MANIFEST).read_text())["files"]) == set(det.SEALED)
    # a rerun reuses every group: the same scores, nothing re-timed
    capsys.readouterr()
    assert det.main(argv) == 0
    assert json.loads((out / "cost.json").read_text()) == cost
    with gzip.open(out / det.EXAMPLES, "rt") as fh:
        assert [json.loads(line) for line in fh] == ex
    err = capsys.readouterr().err
    assert "0 to compute" in err and f"resuming the run in {out}" in err
    # the report, from the files alone
    md = tmp_path / "report.md"
    header = tmp_path / "head.md"
    header.write_text("# Head\n")
    assert det.main(["--from", str(out), "--header", str(header), "--md", str(md), "--n-bootstrap", "20"]) == 0
    text = md.read_text()
    assert text.startswith("# Head\n") and "## toy (sample):" in text
    assert "a seeded sample of 5 per dataset and label" in text
    assert "Not run: pac, polarized, ref." in text and "Neighbor with 2 neighbours; SaMIA with 2 sampled" in text
    table = text.split("| Method |")[1].split("\n\n")[0]
    for m in info["methods"]:
        assert f"| {m}" in table
    assert "| Blind BoW (no model) |" in table and "| min_k_pp@0.2 |" in table
    baseline_row = [line for line in table.splitlines() if line.startswith("| min_k_pp@0.2 |")][0]
    lower_row = [line for line in table.splitlines() if line.startswith("| lowercase |")][0]
    n_lower = sum(r["scores"]["lowercase"] is None for r in ex)  # texts already in lower case: skipped, counted
    assert 0 < n_lower < 20 and lower_row.rstrip(" |").endswith(f"| {n_lower}")
    if getattr(metrics, "MIN_PER_CLASS", 0) > 5:  # 5 per dataset and label: every cell n/a with the reason
        assert "| n/a (alpha: fewer than" in baseline_row and "**" not in table
    else:
        assert "—" in baseline_row
    assert text.count("| alpha |") == 2 and text.count("| beta |") == 2  # dataset inference: two rows per dataset


def _synthetic_run(det, folder: Path, per_class: int, datasets=("alpha", "beta")) -> Path:
    """A sealed run folder written without a model: loss / zlib / the baseline on ``per_class`` texts of each label
    per dataset (members score higher, with noise)."""
    import numpy as np

    rng = np.random.default_rng(0)
    methods = ["loss", "zlib", det.BASELINE]
    rows = [{"index": i, "label": y, "dataset": d, "text_sha256": f"{i:064x}", "blind": float(rng.random()),
             "scores": {m: float(y + rng.standard_normal()) for m in methods}}
            for i, (d, y) in enumerate((d, y) for d in datasets for y in (0, 1) for _ in range(per_class))]
    folder.mkdir(parents=True)
    (folder / "info.json").write_text(json.dumps(
        {"name": "synthetic", "model": "m", "model_files": {}, "ref_model": None, "n_texts": len(rows) + 8,
         "n_evaluated": len(rows), "n_shots_held_out": 8, "per_cell": None, "shots_per_prefix": 2, "seed": 0,
         "methods": methods, "command": "scripts/detectors.py ..."}))
    (folder / "cost.json").write_text(json.dumps(
        {"single-pass": {"methods": methods, "seconds": 1.0, "texts": len(rows), "forward_per_text": 1,
                         "backward_per_text": 0, "tokens": 100, "tokens_per_second": 100.0}}))
    from mia_jax.runs import files

    files.write_jsonl_gz(folder / det.EXAMPLES, rows)
    rundir.seal(folder, det.SEALED)
    return folder


def test_report_cells(det, tmp_path, capsys):
    """Enough texts: intervals, the paired comparison, the baseline's dash; too few: n/a with the reason, no bold."""
    enough = _synthetic_run(det, tmp_path / "enough", 12)
    few = _synthetic_run(det, tmp_path / "few", 4)
    assert det.main(["--from", str(enough), str(few), "--n-bootstrap", "20"]) == 0
    text = capsys.readouterr().out
    first, second = text.split("## synthetic: m")[1:]
    # each section's heading names its folder (two runs of one benchmark and model are told apart)
    assert first.splitlines()[0].endswith(" (`enough`)") and second.splitlines()[0].endswith(" (`few`)")
    base = [line for line in first.splitlines() if line.startswith("| min_k_pp@0.2 |")][0]
    assert "—" in base and "[" in base
    loss = [line for line in first.splitlines() if line.startswith("| loss |")][0]
    assert ("Min-K%++" in loss or "not distinguishable" in loss) and loss.rstrip(" |").endswith("| 0")
    if getattr(metrics, "MIN_PER_CLASS", 0) > 4:
        loss = [line for line in second.splitlines() if line.startswith("| loss |")][0]
        assert "| n/a (alpha: fewer than" in loss and "(4 members, 4 non-members)" in loss
        assert "n/a (n/a" not in second and "**" not in text


def test_nan_logits_are_warned_and_reported(det, tmp_path, capsys):
    """A checkpoint whose final norm holds a NaN: every score null (rank too), the warning eval prints on stderr,
    its indices in info.json, and the same warning under the report's table (built from the files)."""
    from safetensors.numpy import load_file, save_file

    from mia_jax.scorers import MULTI_PASS

    model = tmp_path / "nan_llama"
    write_tiny_llama(model)
    tensors = load_file(str(model / "model.safetensors"))
    tensors["model.norm.weight"][3] = float("nan")
    save_file(tensors, str(model / "model.safetensors"))
    _eval_file(tmp_path / "eval.jsonl")
    argv = ["--model", str(model), "--eval", str(tmp_path / "eval.jsonl"), "--name", "toy", "--shots", "2",
            "--n-shots", "2", "--per-cell", "5", "--n-bootstrap", "20", "--no-progress", "--out",
            str(tmp_path / "det"), "--skip", *sorted(m for m in MULTI_PASS if m != det.BASELINE), "polarized"]
    assert det.main(argv) == 0
    err = capsys.readouterr().err
    assert "WARNING: the model's logits are NaN or infinite for 20 texts (the first: text 0)" in err
    info = json.loads((tmp_path / "det" / "info.json").read_text())
    assert info["nonfinite_logits"] == list(range(20))
    rows = [json.loads(line) for line in gzip.open(tmp_path / "det" / "examples.jsonl.gz", "rt")]
    assert all(v is None for r in rows for v in r["scores"].values())
    assert det.main(["--from", str(tmp_path / "det"), "--n-bootstrap", "20"]) == 0
    text = capsys.readouterr().out
    assert "logits are NaN or infinite for 20 texts" in text and "**" not in text


# ----------------------------------------------------------------------------- the run folder's guard


def test_rerun_with_another_model_is_refused(det, finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    other = tmp_path / "other_model"
    write_tiny_llama(other, seed=1)
    before = snapshot(out)
    argv = [str(other) if a == finished[1][1] else a for a in finished[1]]
    argv[argv.index("--out") + 1] = str(out)
    rc = det.main(argv)
    assert_clean_error(rc, capsys.readouterr().err, f"{out} holds a different run", "model_files",
                       str(other.resolve()), "--overwrite")
    assert snapshot(out) == before


def test_rerun_with_another_seed_is_refused(det, finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    before = snapshot(out)
    argv = [*finished[1][:-1], str(out), "--seed", "1"]
    rc = det.main(argv)
    assert_clean_error(rc, capsys.readouterr().err, "holds a different run", "seed: 0 -> 1")
    assert snapshot(out) == before


def test_a_second_process_is_refused_with_the_first_ones_pid(det, finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    before = snapshot(out)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom mia_jax.runs import rundir\n"
         "with rundir.claim(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n", str(out)],
        stdout=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        rc = det.main([*finished[1][:-1], str(out)])
    finally:
        holder.kill()
        holder.wait()
    assert_clean_error(rc, capsys.readouterr().err, f"{out} is in use by another process (PID {holder.pid})")
    after = snapshot(out)
    assert after.pop(rundir.LOCK) == f"{holder.pid}\n".encode()  # the holder's (killed: it could not remove it)
    assert after == before


# ----------------------------------------------------------------------------- bad inputs: one line, nothing written

def _bad_eval(kind: str, path: Path) -> Path:
    good = [{"text": f"t{i}", "label": i % 2, "dataset": "d"} for i in range(30)]
    lines = [json.dumps(r) for r in good]
    if kind == "json":
        lines[2] = '{"text": "t2", "label": 0,'
    elif kind == "field":
        lines[3] = json.dumps({"text": "t3", "dataset": "d"})
    elif kind == "label":
        lines[4] = json.dumps({"text": "t4", "label": 2, "dataset": "d"})
    elif kind == "empty":
        lines = []
    elif kind == "one_label":
        lines = [json.dumps(dict(r, label=1)) for r in good]
    elif kind == "few":
        lines = lines[:6]
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("kind, needles", [
    ("json", ["line 3: not valid JSON"]),
    ("field", ["line 4: no 'label' field"]),
    ("label", ["line 5: 'label' must be 0 (non-member) or 1 (member), got 2"]),
    ("empty", ["holds no texts"]),
    ("one_label", ["dataset 'd' has no non-members"]),
    ("few", ["dataset 'd' has 3 members (label 1)", "lower --shots"]),
])
def test_bad_eval_file(det, finished, tmp_path, capsys, kind, needles):
    out = _copy(finished, tmp_path)
    before = snapshot(out)
    bad = _bad_eval(kind, tmp_path / "bad.jsonl")
    argv = [str(bad) if a == finished[1][3] else a for a in finished[1]]
    argv[argv.index("--out") + 1] = str(out)
    argv[argv.index("--shots") + 1] = "3"
    rc = _rc(det, argv)
    assert_clean_error(rc, capsys.readouterr().err, *needles)
    assert snapshot(out) == before


def _with(argv, option, value):
    argv = list(argv)
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    return argv


@pytest.mark.parametrize("option, value, needle", [
    ("--eval", "missing.jsonl", "no such file"),
    ("--model", "no_such_model_dir", "no such local path"),
    ("--ref-model", "no_such_ref_dir", "no such local path"),
    ("--shots", "0", "argument --shots: must be"),
    ("--n-shots", "-1", "argument --n-shots: must be"),
    ("--per-cell", "0", "argument --per-cell: must be"),
    ("--n-neighbors", "0", "argument --n-neighbors: must be"),
    ("--samia-samples", "-2", "argument --samia-samples: must be"),
    ("--batch-size", "0", "argument --batch-size: must be"),
    ("--n-bootstrap", "0", "argument --n-bootstrap: must be"),
    ("--seed", "-1", "argument --seed: must be"),
    ("--skip", "nosuch", "--skip nosuch: not a method"),
    ("--skip", "min_k_pp@0.2", "cannot be left out"),
])
def test_bad_option(det, finished, tmp_path, capsys, monkeypatch, option, value, needle):
    monkeypatch.chdir(tmp_path)
    out = _copy(finished, tmp_path)
    before = snapshot(out)
    rc = _rc(det, _with(_with(finished[1], "--out", str(out)), option, value))
    assert_clean_error(rc, capsys.readouterr().err, needle)
    assert snapshot(out) == before


def test_bad_wikimia_length(det, tmp_path, capsys):
    rc = _rc(det, ["--wikimia", "33", "--out", str(tmp_path / "out")])
    assert_clean_error(rc, capsys.readouterr().err, "WikiMIA has lengths")
    assert not (tmp_path / "out").exists()


def test_mimir_domains_are_one_dataset_each(det):
    """``--mimir`` reads each domain's members then non-members (the bundled ngram_7_0.2 files), one group per
    domain, every file with its SHA-256; a domain given twice is read once."""
    args = det.build_parser().parse_args(["--mimir", "wikipedia_en", "pile_cc", "wikipedia_en", "--out", "x"])
    texts, labels, groups, name, data_files = det.load_eval(args)
    assert name == "mimir-ngram_7_0.2" and len(texts) == len(labels) == len(groups)
    for domain in ("wikipedia_en", "pile_cc"):
        rows = [y for y, g in zip(labels, groups) if g == f"mimir-{domain}"]
        members = REPO.parent / "shared/data/mimir/ngram_7_0.2/members" / f"{domain}.jsonl"
        nonmembers = members.parent.parent / "nonmembers" / f"{domain}.jsonl"
        n_in, n_out = (len(f.read_text().splitlines()) for f in (members, nonmembers))
        assert rows == [1] * n_in + [0] * n_out
        assert {members.resolve(), nonmembers.resolve()} <= {Path(f).resolve() for f in data_files}
    assert list(dict.fromkeys(groups)) == ["mimir-wikipedia_en", "mimir-pile_cc"]


def test_unknown_mimir_domain_is_refused(det, tmp_path, capsys):
    rc = _rc(det, ["--mimir", "wikipedia", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "invalid choice: 'wikipedia'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["file", "under_file", "dangling"])
def test_bad_out(det, finished, tmp_path, capsys, where):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = {"file": blocker, "under_file": blocker / "det", "dangling": tmp_path / "link"}[where]
    if where == "dangling":
        os.symlink(tmp_path / "gone", out)
    before = sorted(os.listdir(tmp_path))
    rc = _rc(det, _with(finished[1], "--out", str(out)))
    assert_clean_error(rc, capsys.readouterr().err, "--out")
    assert sorted(os.listdir(tmp_path)) == before and blocker.read_text() == "x"
    assert not (tmp_path / "gone").exists()


def test_no_out_or_no_data(det, finished, capsys):
    rc = _rc(det, ["--eval", finished[1][3]])
    assert_clean_error(rc, capsys.readouterr().err,
                       "give --wikimia N, --mimir DOMAIN ... or --eval FILE, and --out DIR")


# ----------------------------------------------------------------------------- --from: damaged folders

def _damage(folder: Path, name: str, how: str) -> None:
    path = folder / name
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "missing":
        path.unlink()
    elif how == "malformed":  # well-formed for its reader, wrong content; sealed again (verify alone passes)
        if name == "info.json":
            path.write_text(json.dumps({"name": "x", "methods": "loss"}))
        elif name == "cost.json":
            path.write_text(json.dumps({"single-pass": {"methods": ["loss"]}}))
        else:
            path.write_bytes(gzip.compress(b'{"label": 3}\n'))
        rundir.seal(folder, ["info.json", "cost.json", "examples.jsonl.gz"])
    elif how == "bad_json":
        path.write_bytes(gzip.compress(b"{not json\n") if name.endswith(".gz") else b"{not json")
        rundir.seal(folder, ["info.json", "cost.json", "examples.jsonl.gz"])
    elif how == "torn_gzip":  # cut mid-stream and recorded so in the manifest: the reader must report it
        path.write_bytes(data[: len(data) - 20])
        manifest = json.loads((folder / rundir.MANIFEST).read_text())
        manifest["files"][name] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                                   "bytes": path.stat().st_size, "rows": None}
        (folder / rundir.MANIFEST).write_text(json.dumps(manifest))


CASES = [(name, how) for name in ("info.json", "cost.json", "examples.jsonl.gz")
         for how in ("empty", "truncated", "missing", "malformed", "bad_json")] + [("examples.jsonl.gz", "torn_gzip")]


@pytest.mark.parametrize("name, how", CASES)
def test_from_a_damaged_folder(det, tmp_path, capsys, name, how):
    src = _synthetic_run(det, tmp_path / "src", 12)
    _damage(src, name, how)
    md = tmp_path / "report.md"
    md.write_text("earlier report\n")
    before = snapshot(tmp_path)
    rc = _rc(det, ["--from", str(src), "--md", str(md), "--n-bootstrap", "5"])
    needle = {"missing": "is missing", "malformed": "is damaged", "bad_json": "is damaged",
              "torn_gzip": "is damaged"}.get(how, "was changed or cut")
    assert_clean_error(rc, capsys.readouterr().err, f"--from {src}", name, needle)
    assert snapshot(tmp_path) == before


def test_from_without_a_manifest_and_bad_md(det, tmp_path, capsys):
    src = _synthetic_run(det, tmp_path / "src", 12)
    good = _synthetic_run(det, tmp_path / "good", 12)
    (src / rundir.MANIFEST).unlink()
    before = snapshot(tmp_path)
    # the first folder is fine, the second is not: nothing is written
    rc = _rc(det, ["--from", str(good), str(src), "--md", str(tmp_path / "report.md"), "--n-bootstrap", "5"])
    assert_clean_error(rc, capsys.readouterr().err, f"--from {src}: no manifest.json")
    for md, needle in ((tmp_path, "is a folder"), (good / "info.json" / "r.md", "--md"),
                       (good / "info.json", "holds a run"),
                       (good / "report.md", "holds a run")):  # never into a run's folder (it could replace its files)
        rc = _rc(det, ["--from", str(good), "--md", str(md), "--n-bootstrap", "5"])
        assert_clean_error(rc, capsys.readouterr().err, needle)
    rc = _rc(det, ["--from", str(tmp_path / "nowhere")])
    assert_clean_error(rc, capsys.readouterr().err, "no such folder")
    assert snapshot(tmp_path) == before
