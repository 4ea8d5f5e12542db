"""The contamination config read by pydantic (train/config.py): Literal choices, types, unknown keys, overrides, and
the fingerprints of the committed configs unchanged by the move to pydantic."""
import dataclasses
import json
from pathlib import Path

import pytest

from helpers import assert_clean_error, snapshot
from mia_jax.errors import UserError
from train import contaminate, experiment
from train.config import ExperimentConfig, load_config

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "contamination"
TINY = str(CONFIGS / "tiny.yaml")
# every committed config's run.json config and sweep fingerprint ({"ablation": null, "config": ...}, as
# train/contaminate.py claims its --out with), recorded by the hand-written parser that pydantic replaced
RECORDED = Path(__file__).parent / "fixtures" / "config_fingerprints.json"


def message(path, *overrides) -> str:
    with pytest.raises(UserError) as e:
        load_config(path, list(overrides))
    assert "\n" not in str(e.value)
    return str(e.value)


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("override, expected", [
    ("train.remat=all", "override train.remat=all: expected 'none' or 'layer'"),
    ("corpus.variant=web", "override corpus.variant=web: expected 'downstream', 'news' or 'traps'"),
    ("corpus.datasets=[imdb, squad]", "override corpus.datasets=[imdb, squad]: corpus.datasets[1] is 'squad', "
                                      "expected 'boolq', 'commonsenseqa', 'imdb' or 'truthfulqa'"),
])
def test_a_literal_choice_is_refused_in_one_line_through_the_command(tmp_path, capsys, override, expected):
    out = tmp_path / "out"
    out.mkdir()
    (out / "kept.txt").write_text("the user's")
    before = snapshot(out)
    rc = contaminate.main(["--config", TINY, "--out", str(out), "--no-progress", override])
    assert_clean_error(rc, capsys.readouterr().err, expected)
    assert snapshot(out) == before


def test_a_literal_choice_in_a_file_names_the_key_the_value_and_the_choices(tmp_path):
    path = write(tmp_path, "train:\n  compute_dtype: float16\n")
    assert message(path) == f"config {path}: train.compute_dtype is 'float16', expected 'float32' or 'bfloat16'"


@pytest.mark.parametrize("text, expected", [
    ("train:\n  batch_size: true\n", "train.batch_size is True, expected an int"),  # pydantic alone would read 1
    ("train:\n  lr: yes\n", "train.lr is True, expected a float"),
    ("corpus:\n  occurrence_buckets: [1, two]\n", "corpus.occurrence_buckets[1] is 'two', expected an int"),
    ("model:\n  tiny:\n    init_std: .inf\n", "model.tiny.init_std is inf, expected a finite float"),
    ("train:\n  peak_tflops: fast\n", "train.peak_tflops is 'fast', expected a float or null"),
    ("model:\n  path: [a]\n", "model.path is ['a'], expected a string (quote it)"),
    ("corpus:\n  news: 3\n", "corpus.news is 3, expected a mapping (a section)"),
])
def test_a_wrong_type_is_one_line_naming_the_key_the_value_and_what_is_expected(tmp_path, text, expected):
    path = write(tmp_path, text)
    assert message(path) == f"config {path}: {expected}"


def test_a_wrong_type_in_an_override():
    assert message(TINY, "train.lr=true") == "override train.lr=true: expected a float"
    assert message(TINY, "score.k=[0.2, .nan]") == "override score.k=[0.2, .nan]: score.k[1] is nan, expected a " \
                                                  "finite float"


def test_an_unknown_nested_key_gets_its_suggestion(tmp_path):
    path = write(tmp_path, "corpus:\n  news:\n    n_positivs: 5\n")
    assert message(path) == (f"config {path}: unknown key 'corpus.news.n_positivs' (did you mean "
                             "'corpus.news.n_positives'?); known in corpus.news: path, n_positives, n_negatives, "
                             "n_background")
    assert message(TINY, "corpus.traps.bin=2").startswith(
        "override corpus.traps.bin=2: unknown key 'corpus.traps.bin' (did you mean 'corpus.traps.bins'?); known in "
        "corpus.traps: lengths, bins, per_cell, ")
    assert message(TINY, "model.tiny.hiden_size=8").startswith(
        "override model.tiny.hiden_size=8: unknown key 'model.tiny.hiden_size' (did you mean "
        "'model.tiny.hidden_size'?)")


def test_an_override_of_a_nested_key_changes_that_key_alone(tmp_path):
    path = write(tmp_path, "corpus:\n  background_tokens: 1e5\n  news:\n    n_background: 9\ntrain:\n")
    base = load_config(path)
    assert base.corpus.background_tokens == 100000 and type(base.corpus.background_tokens) is int  # YAML 1.2's 1e5
    assert base.train == ExperimentConfig().train  # a section left empty: its defaults
    cfg = load_config(path, ["corpus.news.n_negatives=12", "corpus.traps.temperatures=[1, 2]",
                             "model.tiny.hidden_size=32", "train.remat=layer"])
    expected = dataclasses.asdict(base)
    expected["corpus"]["news"]["n_negatives"] = 12
    expected["corpus"]["traps"]["temperatures"] = [1.0, 2.0]
    expected["model"]["tiny"]["hidden_size"] = 32
    expected["train"]["remat"] = "layer"
    assert json.dumps(dataclasses.asdict(cfg), sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert [type(t) for t in cfg.corpus.traps.temperatures] == [float, float]
    assert cfg.corpus.news.n_background == 9  # the file's value beside the override's


def test_the_fingerprint_of_every_committed_config_is_unchanged():
    """What a run of each config records (run.json's config) and claims its --out with: as the hand-written parser
    gave, to the type of every value (1 vs 1.0), so a run made before resumes."""
    recorded = json.loads(RECORDED.read_text())
    assert sorted(recorded) == sorted(p.name for p in CONFIGS.glob("*.yaml")), \
        f"record a new config's fingerprint in {RECORDED} (a run of it must keep resuming)"
    for name, want in recorded.items():
        cfg = load_config(CONFIGS / name)
        got = {"config": dataclasses.asdict(cfg), "fingerprint": {"ablation": None,
                                                                  "config": experiment.comparable(cfg)}}
        assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True), name
