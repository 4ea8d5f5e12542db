"""The four extension paths of CONTRIBUTING.md, each walked end to end with a toy registered through its registry
(a monkeypatched entry, removed after the test): a detector with an option, a model family, a benchmark and an
ablation. The first three run ``mia-jax eval`` on the tiny Llama; the ablation runs ``train/contaminate.py`` with
its training replaced by a hand-made sealed run (no model is trained)."""
import dataclasses
import json
import sys
import types

import numpy as np
import pytest
from test_contaminate import TINY, fake_run

from mia_jax import benchmarks, data
from mia_jax.methods import resources
from mia_jax.cli import main
from mia_jax.errors import UserError
from mia_jax.models import checkpoint, llama
from mia_jax.models.weights import WeightSpec
from mia_jax.scorers import REGISTRY, RESOURCES, Resource, masked_mean
from mia_jax.scorers.base import register

N_TEXTS = 6


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Six labeled WikiMIA texts (three members, three non-members) as a JSONL file."""
    ds = data.wikimia(32)
    rows = [r for y in (1, 0) for r in [{"input": t, "label": y} for t, lab in zip(ds.texts, ds.labels)
                                         if lab == y][: N_TEXTS // 2]]
    path = tmp_path_factory.mktemp("data") / "small.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def scores(out, method: str) -> list[float]:
    return [json.loads(line)["scores"][method] for line in (out / "results.jsonl").read_text().splitlines()]


def evaluate(model, out, *args) -> None:
    assert main(["eval", "--model", str(model), "--out", str(out), "--n-bootstrap", "10", "--no-blind",
                 "--no-progress", *args]) == 0


@pytest.fixture(scope="module")
def baseline(tiny_llama_dir, small, tmp_path_factory):
    """The 'loss' scores of the six texts on the tiny Llama, as every toy below is compared with."""
    out = tmp_path_factory.mktemp("baseline") / "run"
    evaluate(tiny_llama_dir, out, "--data", str(small), "--methods", "loss")
    return scores(out, "loss")


def test_detector_with_an_option(monkeypatch, tiny_llama_dir, small, baseline, tmp_path, capsys):
    """A scorer (scorers registry) reading a resource (scorers' RESOURCES) that its own option makes
    (resources.NEEDS): scored, fingerprinted, refused without its method."""
    def toy_shift(logprob, mask, *, offset):
        """Mean log-likelihood plus --toy-offset."""
        return masked_mean(logprob, mask) + offset

    def toy_options(p):
        p.add_argument("--toy-offset", type=float, help="what toy_shift adds")

    def build_toy(options, methods, texts, loaded, out):
        if "toy_shift" not in methods:
            if options.toy_offset is not None:
                raise UserError("--toy-offset is given but toy_shift is not among --methods")
            return
        out.resources["toy_offset"] = options.toy_offset or 0.0
        out.fingerprint["toy_offset"] = options.toy_offset or 0.0

    monkeypatch.setitem(REGISTRY, "toy_shift", None)  # removed after the test
    del REGISTRY["toy_shift"]  # (a name already registered is refused)
    register("toy_shift", resources={"toy_offset": "offset"})(toy_shift)
    monkeypatch.setitem(RESOURCES, "toy_offset", Resource("toy_offset", "pass --toy-offset",
                                                          lambda v: np.asarray(v, np.float32)))
    monkeypatch.setitem(resources.NEEDS, "toy", resources.Need("toy", toy_options, build_toy, ("toy_offset",),
                                                               {"toy_offset": "in the fingerprint (toy_offset)"}))
    out = tmp_path / "run"
    evaluate(tiny_llama_dir, out, "--data", str(small), "--methods", "toy_shift", "--toy-offset", "1.5")
    assert scores(out, "toy_shift") == pytest.approx([s + 1.5 for s in baseline], abs=1e-5)
    assert json.loads((out / "config.json").read_text())["toy_offset"] == 1.5
    capsys.readouterr()
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(small), "--methods", "toy_shift",
                 "--toy-offset", "2", "--out", str(out), "--no-progress"]) != 0
    assert "holds a different run" in capsys.readouterr().err
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(small), "--methods", "loss",
                 "--toy-offset", "2", "--out", str(tmp_path / "other"), "--no-progress"]) != 0
    assert "--toy-offset is given" in capsys.readouterr().err


def test_model_family(monkeypatch, tiny_llama_dir, small, baseline, tmp_path):
    """A family (one WeightSpec, a config and a model class; its ARCHITECTURES entry) loads a checkpoint of its
    model_type and scores as the network it reuses."""
    toy_spec = WeightSpec("Toy", llama.dims, prefixes=(("model.", ""),), top=llama.TOP, layers=llama.SPEC.layers)

    @dataclasses.dataclass(frozen=True)
    class ToyConfig(llama.LlamaConfig):
        model_type: str = "toy_llama"
        model_types = ("toy_llama",)
        __hash__ = llama.LlamaConfig.__hash__

    class Toy(llama.Llama):
        spec = toy_spec

    family = types.ModuleType("mia_jax.models.toy_family")
    family.ToyConfig, family.params_from_hf, family.from_params = ToyConfig, toy_spec.from_hf, Toy.from_params
    family.tensors_from_gguf, family.GGUF_TO_HF = toy_spec.tensors_from_gguf, toy_spec.gguf_to_hf()
    monkeypatch.setitem(sys.modules, family.__name__, family)  # as if mia_jax/models/toy_family.py existed
    monkeypatch.setitem(checkpoint.ARCHITECTURES, "toy_llama", checkpoint.Architecture("toy_family", "ToyConfig"))
    folder = tmp_path / "toy_model"
    folder.mkdir()
    for f in tiny_llama_dir.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="toy_llama")))
    assert isinstance(checkpoint.load(str(folder)).model, Toy)
    out = tmp_path / "run"
    evaluate(folder, out, "--data", str(small), "--methods", "loss")
    assert scores(out, "loss") == pytest.approx(baseline, abs=1e-6)


def test_benchmark(monkeypatch, tiny_llama_dir, small, baseline, tmp_path, capsys):
    """A benchmark (benchmarks.BENCHMARKS: its option, loader and notes) chosen by --benchmark."""
    def toy_options(p):
        p.add_argument("--toy-file", help="the toy benchmark's file")

    def load_toy(options):
        return data.load_records(options.toy_file or small, "input", "label", name="toy")

    monkeypatch.setitem(benchmarks.BENCHMARKS, "toy", benchmarks.Benchmark("toy", load_toy, toy_options,
                                                                          "six WikiMIA texts"))
    assert "toy_file" in benchmarks.option_dests()
    assert benchmarks.choice_help().endswith("; toy: six WikiMIA texts)")
    out = tmp_path / "run"
    evaluate(tiny_llama_dir, out, "--benchmark", "toy", "--toy-file", str(small), "--methods", "loss")
    assert scores(out, "loss") == pytest.approx(baseline, abs=1e-6)
    capsys.readouterr()
    assert main(["eval", "--help"]) == 0
    assert "{" + ",".join(benchmarks.BENCHMARKS) + "}" in capsys.readouterr().out  # the registry's names, toy last
    assert list(benchmarks.BENCHMARKS)[-1] == "toy"


def test_ablation(monkeypatch, tmp_path, capsys):
    """An ablation (train/ablations.py: plan, sub-folders, run.json fields, table) run by contaminate.py, its runs
    made by hand instead of trained, its table rebuilt by train.tables."""
    from train import ablations, contaminate, experiment, tables
    from train.tiny import write_tiny_model
    from train.config import TinyModelConfig

    def plan_toy(cfg):
        return [(f"toy_{lr:g}", ablations.with_changes(cfg, train__lr=lr)) for lr in (1e-5, 1e-4)]

    def toy_table(runs, methods):
        lines = [f"| {r['config']['train']['lr']:g} | {', '.join(r['trained'])} | {len(r['examples'])} |" for r in runs]
        text = "\n".join(["| lr | datasets | examples |", "|---|---|---|", *lines]) + "\n"
        return text, {"toy.md": text}

    monkeypatch.setitem(ablations.ABLATIONS, "toy", ablations.Ablation(
        "toy", plan_toy, "toy_*", "toy_", (("config.train.lr", (int, float)),), False, toy_table, None))
    monkeypatch.setattr(experiment, "run_experiment",
                        lambda cfg, folder, cache=None: fake_run(folder, lr=cfg.train.lr))
    model = write_tiny_model(tmp_path / "model", TinyModelConfig())
    out = tmp_path / "sweep"
    assert contaminate.main(["--config", TINY, "--out", str(out), "--no-progress", "--ablation", "toy",
                             f"model.path={model}"]) == 0
    assert json.loads((out / "config.json").read_text())["ablation"] == "toy"
    table = (out / "toy.md").read_text()
    assert table in capsys.readouterr().out and "| 1e-05 | boolq, imdb | 48 |" in table and "| 0.0001 |" in table
    rebuilt = tmp_path / "rebuilt"
    assert tables.main(["--from", str(out), "--out", str(rebuilt)]) == 0
    assert (rebuilt / "toy.md").read_text() == table
