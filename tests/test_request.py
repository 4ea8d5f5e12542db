"""The request of ``mia-jax eval`` / ``score`` (mia_jax.commands.request): made once from the parsed command line,
frozen and typed, read back as run.json's "config" exactly as argparse gave it; the methods' needs and the
benchmarks' loaders receive frozen options holding what they declared and nothing else."""
import dataclasses
import json
import pickle
from pathlib import Path

import pytest

from mia_jax import benchmarks
from mia_jax.cli import build_parser
from mia_jax.commands.request import ScoreRequest
from mia_jax.methods import resources
from mia_jax.methods.options import MethodOptions, TextFields
from mia_jax.runs.options import Options


@pytest.fixture
def files(tmp_path):
    """A labeled JSONL file, a tokenizer file and a shots file: the paths the parser checks."""
    paths = {name: tmp_path / name for name in ("data.jsonl", "tokenizer.json", "shots.jsonl")}
    for path in paths.values():
        path.write_text(json.dumps({"input": "a text", "label": 1}) + "\n")
    return paths


def parse(argv):
    args = build_parser().parse_args(argv)
    vars(args).pop("func")  # as cli._main does
    return args


def eval_args(files, *extra):
    return parse(["eval", "--data", str(files["data.jsonl"]), "--tokenizer", str(files["tokenizer.json"]),
                  "--methods", "loss", "min_k", "recall", "--k", "0.1", "0.3", "--compare", "loss", "min_k@0.1",
                  "--recall-shots", str(files["shots.jsonl"]), "--recall-n-shots", "3", "--dtype", "bfloat16",
                  "--tokens-per-batch", "512", "--seed", "7", "--label-field", "member", *extra])


def test_a_parsed_eval_becomes_a_typed_request(files):
    request = ScoreRequest.from_args(eval_args(files))
    assert request.command == "eval" and request.labeled
    assert request.data.data == files["data.jsonl"] and isinstance(request.data.data, Path)
    assert request.data.label_field == "member" and request.data.benchmark is None
    assert request.data.benchmark_options.length is None and request.data.benchmark_options.split
    assert request.model.tokenizer == files["tokenizer.json"] and request.model.dtype == "bfloat16"
    assert request.methods.methods == ("loss", "min_k", "recall") and request.methods.k == (0.1, 0.3)
    assert request.methods.compare == (("loss", "min_k@0.1"),)
    opts = request.methods.options
    assert isinstance(opts, MethodOptions) and opts.recall_shots == files["shots.jsonl"]
    assert opts.recall_n_shots == 3 and opts.window is None
    assert opts.fields == TextFields(None, "member", "utf-8")
    assert request.plan.tokens_per_batch == 512 and request.plan.batch_size == 8
    assert request.output.seed == 7 and request.output.n_bootstrap == 1000 and request.output.out is None
    hash(request)  # frozen all the way down: hashable


def test_the_request_is_frozen(files):
    request = ScoreRequest.from_args(eval_args(files))
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.command = "score"
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.model.model = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.methods.options.recall_seed = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.data.benchmark_options.length = 64
    with pytest.raises(TypeError):
        request.methods.options["recall_seed"] = 1


@pytest.mark.parametrize("command", ["eval", "score"])
def test_config_is_the_command_line_as_parsed(files, command):
    """run.json's "config" (and so a run's record) reads the request back: vars(args) in the same order."""
    args = parse([command, "--data", str(files["data.jsonl"]), "--methods", "loss", "zlib", "--window", "16",
                  "--stream-window", "9"])
    want = dict(vars(args))
    request = ScoreRequest.from_args(args)
    assert list(request.config()) == list(want) and request.config() == want
    assert json.dumps(request.config(), default=str) == json.dumps(want, default=str)
    resolved = request.resolved(dtype="float32", tokens_per_batch=2048)
    assert resolved.model.dtype == "float32" and resolved.plan.tokens_per_batch == 2048
    assert resolved.config() == {**want, "dtype": "float32", "tokens_per_batch": 2048}
    assert request.model.dtype is None  # resolving makes a new request
    if command == "score":
        assert not request.labeled and request.data.label_field is None and "seed" not in request.config()
        assert request.output.n_bootstrap == 0 and request.output.no_blind is False


def test_a_given_dtype_is_kept_when_resolved(files):
    request = ScoreRequest.from_args(eval_args(files)).resolved(dtype="float32", tokens_per_batch=2048)
    assert request.model.dtype == "bfloat16" and request.plan.tokens_per_batch == 512


def test_an_option_no_part_holds_is_refused(files):
    args = eval_args(files)
    args.undeclared = 1  # as if an option were added to the parser and not to the request
    with pytest.raises(RuntimeError, match="undeclared"):
        ScoreRequest.from_args(args)


def test_method_options_hold_only_the_needs_options(files):
    opts = ScoreRequest.from_args(eval_args(files)).methods.options
    assert set(opts) == set(resources.option_dests()) and "recall_seed" in opts
    with pytest.raises(AttributeError, match="model"):
        opts.model  # noqa: B018 - an option of the command, not of a need
    with pytest.raises(TypeError, match="Namespace"):
        resources.build(eval_args(files), ["loss"], ["a text"])


def test_a_need_reading_an_option_it_did_not_declare_fails(monkeypatch, files):
    def toy_options(p):
        p.add_argument("--toy-level", type=int)

    def build_toy(options, methods, texts, loaded, out):
        out.fingerprint["toy_level"] = options.toy_level
        out.fingerprint["toy_model"] = options.model  # not declared by any need

    monkeypatch.setitem(resources.NEEDS, "toy", resources.Need("toy", toy_options, build_toy, ("toy_level",), {}))
    args = parse(["eval", "--data", str(files["data.jsonl"]), "--methods", "loss", "--toy-level", "4"])
    opts = ScoreRequest.from_args(args).methods.options
    assert opts.toy_level == 4
    with pytest.raises(AttributeError, match="'model'"):
        resources.build(opts, ["loss"], ["a text"])


def test_benchmark_loaders_receive_frozen_options(monkeypatch):
    seen = []
    monkeypatch.setitem(benchmarks.BENCHMARKS, "toy", benchmarks.Benchmark("toy", seen.append))
    own = Options.of({"length": 64, "split": "s", "domain": "d", "difficulty": "random", "model": "m"},
                     ("length", "split", "domain", "difficulty"))
    benchmarks.load("toy", benchmarks.loader_options(own, data_dir=None, window=32, member_from_field="mf"))
    (opts,) = seen
    assert (opts.length, opts.window, opts.member_from_field, opts.data_dir) == (64, 32, "mf", None)
    assert "model" not in opts
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.length = 32
    with pytest.raises(TypeError, match="shared options"):
        benchmarks.loader_options(own, data_dir=None)


def test_options_freeze_lists_and_compare_by_value():
    a = Options({"xs": [1, [2, 3]], "y": None})
    assert a.xs == (1, (2, 3)) and a == Options({"xs": (1, (2, 3)), "y": None}) and hash(a) == hash(Options(a))
    assert a.with_values(y=2).y == 2 and a.y is None
    assert MethodOptions({"x": 1}) != MethodOptions({"x": 1}, TextFields(encoding="latin-1"))
    with pytest.raises(ValueError, match="fields"):
        MethodOptions({"fields": 1})
    m = MethodOptions({"x": 1}, TextFields("input"))
    assert pickle.loads(pickle.dumps(m)) == m and pickle.loads(pickle.dumps(a)) == a
