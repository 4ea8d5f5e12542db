"""The toys of tests/test_extension_paths.py: for each extension path of CONTRIBUTING.md, the edit of every file the
path names (keyed by the path as CONTRIBUTING.md writes it, ``<module>`` and the like filled from ``names``), applied
to a copy of the tree, and the tests of the suite that iterate the registries, run there (node ids: each names the
toy where the test is parametrized by the registry, so a toy left out of it is an error, not a pass)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


def append(text: str) -> Callable[[Path], None]:
    """An edit adding ``text`` at the end of the file."""
    return lambda path: path.write_text(path.read_text() + "\n\n" + text)


def create(text: str) -> Callable[[Path], None]:
    """An edit writing a new file."""
    def edit(path: Path) -> None:
        assert not path.exists(), f"{path} exists already"
        path.write_text(text)
    return edit


def insert_after(pattern: str, text: str, then: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    """An edit inserting ``text`` after the first line matching ``pattern`` (a dict literal's opening line: the entry
    is in the dict when the module's parametrize reads it), then ``then``."""
    def edit(path: Path) -> None:
        source = path.read_text()
        found = re.search(pattern + r".*\n", source, re.M)
        assert found, f"{path}: no line matches {pattern!r}"
        path.write_text(source[:found.end()] + text + source[found.end():])
        if then:
            then(path)
    return edit


def importing(line: str) -> Callable[[Path], None]:
    """An edit adding an import line before the file's first ``from mia_jax`` import."""
    def edit(path: Path) -> None:
        source = path.read_text()
        at = source.index("\nfrom mia_jax") + 1
        path.write_text(source[:at] + line + "\n" + source[at:])
    return edit


def both(*edits: Callable[[Path], None]) -> Callable[[Path], None]:
    """The edits one after the other, on the same file."""
    def edit(path: Path) -> None:
        for e in edits:
            e(path)
    return edit


def in_copy(code: str) -> Callable[[Path], None]:
    """An 'edit' that makes a folder by running ``code`` (with ``path`` bound to it) in the copy."""
    def edit(path: Path) -> None:
        root = next(p for p in path.parents if (p / "mia_jax").is_dir())
        run_in(root, [sys.executable, "-c", f"from pathlib import Path\npath = Path({str(path)!r})\n{code}"])
    return edit


def run_in(root: Path, argv: list[str], timeout: float = 240) -> str:
    """``argv`` run in the copy ``root`` (its packages first on the path); its output, failing the test on an error."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"PYTHONPATH": str(root),
                                                                        "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(argv[:4])}... exited {done.returncode}:\n{out[-6000:]}"
    return out


@dataclass
class Walk:
    """One extension path: the CONTRIBUTING.md section (its heading's start), the placeholders' values, the edit of
    each file it names and the tests run in the copy afterwards."""

    section: str
    names: dict[str, str]
    edits: dict[str, Callable[[Path], None]]
    tests: list[str]


# a labeled file and `mia-jax eval` on it, for the toys' own tests (names prefixed: they join existing modules)
EVAL = '''
def toy_labeled(folder):
    import json
    texts = ["the cat sat on the mat", "a dog ran in the park", "the sun is hot today", "we like green tea"]
    path = folder / "toy.jsonl"
    path.write_text("".join(json.dumps({"input": t, "label": i % 2}) + "\\n" for i, t in enumerate(texts)))
    return path


def toy_eval(model, out, *args):
    """Each text's scores from `mia-jax eval` on ``model``."""
    import json
    from mia_jax.cli import main
    assert main(["eval", "--model", str(model), "--out", str(out), "--n-bootstrap", "10", "--no-blind",
                 "--no-progress", *args]) == 0
    return [json.loads(line)["scores"] for line in (out / "results.jsonl").read_text().splitlines()]


def toy_help_lists(name, capsys):
    from mia_jax.cli import main
    capsys.readouterr()
    assert main(["eval", "--help"]) == 0
    assert name in capsys.readouterr().out
'''

DEVICE_SCORES = ["tests/test_device_scores.py::test_every_registered_scorer_has_a_reference_and_is_the_public_function",
                 "tests/test_device_scores.py::test_float32_formulas_equal_the_float64_reference[0]",
                 "tests/test_device_scores.py::test_float64_under_x64_equals_the_reference_to_rounding[3]",
                 "tests/test_scorers.py::test_every_scorer_is_oriented_higher_is_member"]
DOCTESTS = "tests/test_device_scores.py::test_every_registered_scorer_has_a_doctest_example_that_pytest_runs"

# ------------------------------------------------------------------ a scorer in an existing module (camia)

TOY_LOSS = '''
@register("toy_loss")
def toy_loss(logprob, mask) -> jax.Array:
    """Toy of the extension path: the mean log-likelihood of the scored tokens, as ``loss``.

    >>> toy_loss(jnp.array([[-1.0, -3.0, 9.0]]), jnp.array([[True, True, False]])).tolist()
    [-2.0]
    """
    return masked_mean(logprob, mask)
'''

TOY_LOSS_TEST = EVAL + '''

def test_toy_loss_is_the_loss(tiny_llama_dir, tmp_path, capsys):
    toy_help_lists("toy_loss", capsys)
    got = toy_eval(tiny_llama_dir, tmp_path / "run", "--data", str(toy_labeled(tmp_path)), "--methods", "loss",
                   "toy_loss")
    assert [s["toy_loss"] for s in got] == pytest.approx([s["loss"] for s in got], abs=1e-6)
'''

SCORER = Walk("A scorer in an existing scorer module", {"<module>": "camia"}, {
    "mia_jax/scorers/<module>.py": append(TOY_LOSS),
    "mia_jax/scorers/__init__.py": append('from mia_jax.scorers.camia import toy_loss  # noqa: E402\n'
                                          '__all__.append("toy_loss")\n'),
    "tests/reference.py": append('REFERENCES["toy_loss"] = lambda r, k, e: mean(r["logprob"])\n'),
    "tests/test_<module>.py": append(TOY_LOSS_TEST),
}, [*DEVICE_SCORES, DOCTESTS, "mia_jax/scorers/camia.py",
    "tests/test_camia.py::test_toy_loss_is_the_loss"])

# ------------------------------------------------------------------ a scorer in a new module, with an option

TOY_MODULE = '''"""Toy scorers of the extension path: a new module, a resource and its option."""
from __future__ import annotations

import jax
import numpy as np

from mia_jax.scorers.base import RESOURCES, Resource, register
from mia_jax.scorers.reduce import masked_mean

RESOURCE = "toy_offset"


@register("toy_shift", resources={RESOURCE: "offset"})
def toy_shift(logprob, mask, *, offset) -> jax.Array:
    """Toy: the mean log-likelihood plus --toy-offset.

    >>> import jax.numpy as jnp
    >>> toy_shift(jnp.array([[-1.0, -3.0]]), jnp.array([[True, True]]), offset=jnp.float32(0.5)).tolist()
    [-1.5]
    """
    return masked_mean(logprob, mask) + offset


RESOURCES[RESOURCE] = Resource(RESOURCE, "give it with --toy-offset", lambda v: np.asarray(v, np.float32), default=0.0)
'''

TOY_NEED = '''
def toy_options(p: argparse.ArgumentParser) -> None:
    """``--toy-offset`` on ``p``."""
    p.add_argument("--toy-offset", type=entry.nonneg_float, help="what toy_shift adds (default 0)")


def build_toy(options, methods, texts, loaded, out: Resources) -> None:
    """The offset of toy_shift (refused without it)."""
    if "toy_shift" not in methods:
        if options.toy_offset is not None:
            raise UserError("--toy-offset is given but toy_shift is not among --methods")
        return
    out.resources["toy_offset"] = out.fingerprint["toy_offset"] = options.toy_offset or 0.0


NEEDS["toy"] = Need("toy", toy_options, build_toy, ("toy_offset",), {"toy_offset": "in the fingerprint (toy_offset)"})
'''

TOY_MODULE_TEST = '''import json

import pytest

from mia_jax.cli import main
from mia_jax.scorers import toy_shift  # noqa: F401 (the public name)
''' + EVAL + '''

def test_toy_shift_adds_its_option(tiny_llama_dir, tmp_path, capsys):
    toy_help_lists("toy_shift", capsys)
    data = toy_labeled(tmp_path)
    got = toy_eval(tiny_llama_dir, tmp_path / "run", "--data", str(data), "--methods", "loss", "toy_shift",
                   "--toy-offset", "1.5")
    assert [s["toy_shift"] for s in got] == pytest.approx([s["loss"] + 1.5 for s in got], abs=1e-5)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["toy_offset"] == 1.5
    capsys.readouterr()
    assert main(["eval", "--model", str(tiny_llama_dir), "--data", str(data), "--methods", "loss", "--toy-offset",
                 "2", "--out", str(tmp_path / "other"), "--no-progress"]) == 2
    assert "--toy-offset is given" in capsys.readouterr().err
'''

MODULE = Walk("A scorer in a new scorer module", {"<module>": "toyfam"}, {
    "mia_jax/scorers/<module>.py": create(TOY_MODULE),
    "mia_jax/scorers/__init__.py": append('from mia_jax.scorers import toyfam  # noqa: E402,F401 (registers)\n'
                                          'from mia_jax.scorers.toyfam import toy_shift  # noqa: E402\n'
                                          '__all__.append("toy_shift")\n'),
    "tests/reference.py": append('REFERENCES["toy_shift"] = lambda r, k, e: mean(r["logprob"]) + 0.0  # the default\n'),
    "tests/test_<module>.py": create(TOY_MODULE_TEST),
    "mia_jax/methods/resources.py": append(TOY_NEED),
}, [*DEVICE_SCORES, DOCTESTS, "mia_jax/scorers/toyfam.py",
    "tests/test_cli.py::test_every_option_is_fingerprinted_or_explained",
    "tests/test_entry_fuzz.py::test_bad_option_values[mia-jax eval --toy-offset]",
    "tests/test_toyfam.py::test_toy_shift_adds_its_option"])

# ------------------------------------------------------------------ a benchmark

TOY_READER = '''
def toy(path) -> data.Dataset:
    """Toy benchmark of the extension path: a labeled JSONL file (``input``, ``label``)."""
    return data.load_records(path, "input", "label", name="toy")
'''

TOY_BENCHMARK = '''
def toy_options(p: argparse.ArgumentParser) -> None:
    """``--toy-file`` on ``p``."""
    p.add_argument("--toy-file", type=entry.input_file, help="the toy benchmark's labeled JSONL file")


def load_toy(options) -> data.Dataset:
    """The toy benchmark's ``options.toy_file``."""
    if options.toy_file is None:
        raise UserError("--benchmark toy reads --toy-file FILE")
    return known.toy(options.toy_file)


BENCHMARKS["toy"] = Benchmark("toy", load_toy, toy_options, notes="a toy of the extension path")
'''

TOY_BENCHMARK_TEST = EVAL + '''

def test_toy_benchmark(tiny_llama_dir, tmp_path, capsys):
    path = toy_labeled(tmp_path)
    ds = known.toy(path)
    assert list(ds.labels) == [0, 1, 0, 1] and ds.name == "toy"
    toy_help_lists(",toy}", capsys)
    got = toy_eval(tiny_llama_dir, tmp_path / "run", "--benchmark", "toy", "--toy-file", str(path), "--methods", "loss")
    assert got == toy_eval(tiny_llama_dir, tmp_path / "plain", "--data", str(path), "--methods", "loss")
'''

BENCHMARK = Walk("A benchmark", {}, {
    "mia_jax/data/known.py": append(TOY_READER),
    "mia_jax/benchmarks.py": append(TOY_BENCHMARK),
    "tests/test_known_benchmarks.py": append(TOY_BENCHMARK_TEST),
}, ["tests/test_cli.py::test_every_option_is_fingerprinted_or_explained",
    "tests/test_entry_fuzz.py::test_bad_option_values[mia-jax eval --toy-file]",
    "tests/test_known_benchmarks.py::test_toy_benchmark"])

# ------------------------------------------------------------------ a model family (a renamed copy of phi3.py)


def toy_family(path: Path) -> None:
    """mia_jax/models/toy_phi.py: phi3.py renamed (its model_type toy_phi)."""
    source = (path.parent / "phi3.py").read_text()
    path.write_text(source.replace("Phi3", "ToyPhi").replace("phi3", "toy_phi").replace("Phi-3", "Toy-Phi"))


TOY_FAMILY_TEST = '''import pytest
from flax import nnx

from mia_jax.models import load, toy_phi
from train.export import save_hf
''' + EVAL + '''

def test_toy_phi_scores_as_the_llama_it_copies(tiny_llama_dir, tmp_path):
    llama = load(str(tiny_llama_dir))
    cfg = toy_phi.ToyPhiConfig.from_hf({**llama.config.to_hf(), "model_type": "toy_phi"})
    model = toy_phi.from_params(cfg, nnx.to_pure_dict(nnx.state(llama.model, nnx.Param)))
    save_hf(tmp_path / "toy", model, llama.tokenizer)
    assert isinstance(load(str(tmp_path / "toy")).model, toy_phi.ToyPhi)
    data = toy_labeled(tmp_path)
    want = toy_eval(tiny_llama_dir, tmp_path / "a", "--data", str(data), "--methods", "loss")
    got = toy_eval(tmp_path / "toy", tmp_path / "b", "--data", str(data), "--methods", "loss")
    assert [s["loss"] for s in got] == pytest.approx([s["loss"] for s in want], abs=1e-5)
'''

FAMILY = Walk("A model family", {"<family>": "toy_phi"}, {
    "mia_jax/models/<family>.py": toy_family,
    "mia_jax/models/checkpoint.py": append('ARCHITECTURES["toy_phi"] = Architecture("toy_phi", "ToyPhiConfig")\n'),
    "tests/test_weights.py": both(
        insert_after(r"^CASES = \{", '    "toy_phi": (toy_phi.ToyPhi, toy_phi.ToyPhiConfig(**LLAMA)),\n'),
        importing("from mia_jax.models import toy_phi")),
    "tests/test_packed_forward.py": both(
        insert_after(r"^FAMILIES = \{", '    "toy_phi": lambda: toy_phi.ToyPhi(toy_phi.ToyPhiConfig(**_LLAMA)),\n'),
        importing("from mia_jax.models import toy_phi")),
    "tests/test_<family>.py": create(TOY_FAMILY_TEST),
}, ["tests/test_weights.py::test_every_family_is_a_case",
    "tests/test_weights.py::test_spec_describes_the_model_exactly[toy_phi]",
    "tests/test_weights.py::test_export_round_trip[toy_phi]",
    "tests/test_packed_forward.py::test_every_family_is_packed",
    "tests/test_packed_forward.py::test_packed_hidden_states_equal_each_text_alone[toy_phi-full]",
    "tests/test_packed_forward.py::test_packed_hidden_states_equal_each_text_alone[toy_phi-chunked]",
    "tests/test_packed_forward.py::test_logits_take_segment_ids_and_default_is_unchanged[toy_phi]",
    "tests/test_sharding.py::test_every_architecture_shards_its_large_matrices",
    "tests/test_toy_phi.py::test_toy_phi_scores_as_the_llama_it_copies"])

# ------------------------------------------------------------------ a contamination ablation

TOY_ABLATION = '''
def _plan_toy(cfg: ExperimentConfig) -> list[tuple[str, ExperimentConfig]]:
    return [(f"toy_{lr:g}", with_changes(cfg, train__lr=lr)) for lr in (1e-5, 1e-4)]


ABLATIONS["toy"] = Ablation("toy", _plan_toy, "toy_*", "toy_", (("config.train.lr", _NUMBER),), False,
                            sweep_tables.toy_table, claims.toy_study)
'''

TOY_TABLE = '''
def toy_table(runs: list[dict], methods: list[str]) -> tuple[str, dict[str, str | bytes]]:
    """Toy of the extension path: each run's learning rate, datasets and examples."""
    lines = [f"| {r['config']['train']['lr']:g} | {', '.join(r['trained'])} | {len(r['examples'])} |" for r in runs]
    text = "\\n".join(["| lr | datasets | examples |", "|---|---|---|", *lines]) + "\\n"
    return text, {"toy.md": text}
'''

TOY_STUDY = '''
def toy_study(runs: list[tuple[str, dict]], outputs: dict, tag: str = "") -> tuple[list[str], list[dict]]:
    """Toy of the extension path: its table in the report, no claim."""
    return [outputs["toy.md"]], []
'''

# python train/contaminate.py --ablation toy --out results/contamination/toy, each run made by hand (no training)
TOY_SWEEP = '''import sys, tempfile
sys.path.insert(0, "tests")
from test_contaminate import TINY, fake_run
from train import contaminate, experiment
from train.config import TinyModelConfig
from train.tiny import write_tiny_model
experiment.run_experiment = lambda cfg, folder, cache=None: fake_run(folder, lr=cfg.train.lr)
model = write_tiny_model(Path(tempfile.mkdtemp()) / "model", TinyModelConfig())
assert contaminate.main(["--config", TINY, "--out", str(path), "--no-progress", "--ablation", "toy",
                         f"model.path={model}"]) == 0
'''

TOY_SWEEP_TEST = '''

def test_toy_sweep(tmp_path):
    import runpy

    from train import study, tables

    src = REPO / "results" / "contamination" / "toy"
    table = (src / "toy.md").read_text()
    assert "| 1e-05 | boolq, imdb | 48 |" in table and "| 0.0001 |" in table
    assert tables.main(["--from", str(src), "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "toy.md").read_text() == table
    assert study.main(["--toy", str(src), "--out", str(tmp_path / "report.md")]) == 0
    assert table in (tmp_path / "report.md").read_text()
    assert runpy.run_path(str(REPO / "scripts" / "build_results.py"), run_name="x")["SWEEPS"]["toy"] == ["toy"]
'''

ABLATION = Walk("A contamination ablation", {"<ablation>": "toy"}, {
    "train/ablations.py": append(TOY_ABLATION),
    "train/sweep_tables.py": append(TOY_TABLE),
    "train/claims.py": append(TOY_STUDY),
    "results/contamination/<ablation>/": in_copy(TOY_SWEEP),
    "tests/test_contaminate.py": append(TOY_SWEEP_TEST),
}, ["tests/test_entry_fuzz.py::test_help_and_unknown_option[python -m train.study]",
    "tests/test_entry_fuzz.py::test_help_and_unknown_option[python train/contaminate.py]",
    "tests/test_entry_fuzz.py::test_bad_option_values[python -m train.study --toy]",
    "tests/test_entry_fuzz.py::test_rebuild_refuses_damaged_inputs[python -m train.study --toy]",
    "tests/test_entry_fuzz.py::test_rebuild_refuses_an_out_holding_another_run[python -m train.study---toy]",
    "tests/test_contaminate.py::test_toy_sweep"])

WALKS = {"scorer": SCORER, "scorer_module": MODULE, "benchmark": BENCHMARK, "family": FAMILY, "ablation": ABLATION}
