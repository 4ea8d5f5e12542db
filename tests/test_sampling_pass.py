"""SaMIA through the runner: one sampling pass gives both methods, batched and resumable like every pass."""
import json

import numpy as np

from mia_jax.evaluation import metrics
from mia_jax import models
from mia_jax.engine import runner
from mia_jax.methods import samia
from mia_jax.cli import main
from mia_jax.data import wikimia

TEXTS = [" ".join(t.split()[:12]) for t in wikimia(32).texts[:5]] + ["one"]


def test_samia_pass_equals_the_library_call_and_resumes(tiny_llama_dir, tmp_path):
    loaded = models.load(str(tiny_llama_dir))
    opts = {"n_samples": 3, "seed": 1}
    report = {}
    recs = runner.score_dataset(loaded, TEXTS, ["samia", "samia_zlib"], out_dir=tmp_path, progress=False,
                                batch_size=2, pass_options={"samia": opts}, report=report)
    want, reasons = samia.samia_scores(loaded, TEXTS, progress=False, **opts)
    got = metrics.scores_by_method(recs, ["samia", "samia_zlib"])
    for m in ("samia", "samia_zlib"):
        np.testing.assert_allclose(got[m], want[m], rtol=1e-12, equal_nan=True)
    assert sorted(report) == ["main", "samia"]  # one sampling pass for both methods
    assert "one" in TEXTS[-1] and "samia" in recs[-1]["nan_reasons"] and reasons
    again = {}
    recs2 = runner.score_dataset(loaded, TEXTS, ["samia", "samia_zlib"], out_dir=tmp_path, progress=False,
                                 batch_size=2, pass_options={"samia": opts}, report=again, resume=True)
    assert again["samia"]["computed"] == 0 and again["samia"]["reused"] == report["samia"]["computed"]
    assert recs2 == recs


def test_eval_samia_options_are_in_the_fingerprint(tiny_llama_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps({"input": t, "label": i % 2}) for i, t in enumerate(TEXTS[:4])) + "\n")
    out = tmp_path / "run"
    argv = ["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "samia", "--samia-samples", "2",
            "--out", str(out), "--no-progress", "--no-blind", "--n-bootstrap", "10"]
    assert main(argv) == 0
    assert json.loads((out / "run.json").read_text())["method_resources"]["fingerprint"]["samia"] == {
        "n_samples": 2, "seed": 0}
    capsys.readouterr()
    assert main([*argv[:-8], "--samia-samples", "3", *argv[-6:]]) == 2  # other samples: another run
    assert "different" in capsys.readouterr().err.lower()
