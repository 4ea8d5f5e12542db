"""The requests of the commands other than eval / score (each beside its command module): made once from the parsed
command line, frozen and typed (paths as Path, lists as tuples, choices checked), holding every option as parsed and
nothing else; the audits' fingerprints read the same options as before the requests."""
import dataclasses
import json
from pathlib import Path

import pytest

from mia_jax.cli import build_parser
from mia_jax.commands import (audit_books, audit_unlearning, concat, dataset_inference, datasets, freq_table,
                              generate, window_metrics)
from mia_jax.commands.request import AuditRunRequest, CommandRequest, build, check_holds, held_options


@pytest.fixture
def files(tmp_path):
    """A JSONL file, a folder holding it and a tokenizer file: the paths the parsers check."""
    folder = tmp_path / "folder"
    folder.mkdir()
    paths = {"texts": folder / "texts.jsonl", "tokenizer": tmp_path / "tokenizer.json", "folder": folder,
             "out": tmp_path / "out"}
    paths["texts"].write_text(json.dumps({"text": "a text", "title": "t"}) + "\n")
    paths["tokenizer"].write_text("{}\n")
    return paths


def parse(argv):
    args = build_parser().parse_args(argv)
    vars(args).pop("func")  # as cli._main does
    return args


def command_lines(f):
    """{request class: a command line of its command giving most of its options}."""
    texts, folder, out = str(f["texts"]), str(f["folder"]), str(f["out"])
    return {
        audit_books.BooksRequest: ["audit-books", "--books", texts, "--model", "m", "--out", out, "--methods", "loss",
                                   "min_k", "--threshold", "-5", "--data-dir", folder, "--dtype", "bfloat16"],
        audit_unlearning.UnlearningRequest: ["audit-unlearning", "--original", "a", "--unlearned", "b", "--texts",
                                             texts, "--qa", texts, "--out", out, "--k", "0.3", "--top-k", "4"],
        dataset_inference.InferenceRequest: ["dataset-inference", "--suspect", texts, "--validation", texts, "--out",
                                             out, "--methods", "loss", "zlib", "--k", "0.2", "0.5"],
        datasets.DatasetsRequest: ["datasets", "build", "wikimia", "--config", "32", "64", "--data-dir", out,
                                   "--source", folder],
        freq_table.FreqTableRequest: ["freq-table", "--corpus", texts, texts, "--tokenizer", str(f["tokenizer"]),
                                      "--out", out, "--max-tokens", "9"],
        generate.GenerateRequest: ["generate", "--prompt", "a", "--prompt", "b", "--top-p", "0.5"],
        concat.ConcatRequest: ["concat", "--corpus", texts, "--out", out, "--lengths", "8", "16", "--per-side", "2",
                               "1"],
        window_metrics.WindowMetricsRequest: ["window-metrics", folder, "--data", texts, "--out", out],
    }


KINDS = [audit_books.BooksRequest, audit_unlearning.UnlearningRequest, dataset_inference.InferenceRequest,
         datasets.DatasetsRequest, freq_table.FreqTableRequest, generate.GenerateRequest, concat.ConcatRequest,
         window_metrics.WindowMetricsRequest]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.COMMAND)
def test_every_option_lands_in_the_request_as_parsed(files, kind):
    args = parse(command_lines(files)[kind])
    request = kind.from_args(args)
    want = {k: v for k, v in vars(args).items() if k != "command"}
    assert request.options() == want  # lists as lists again: as argparse gave them
    assert list(request.options()) == list(held_options(request))
    hash(request)  # frozen all the way down: hashable
    for value in held_options(request).values():
        assert not isinstance(value, list)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.COMMAND)
def test_the_request_is_frozen(files, kind):
    request = kind.from_args(parse(command_lines(files)[kind]))
    name = dataclasses.fields(request)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(request, name, None)
    for f in dataclasses.fields(request):
        part = getattr(request, f.name)
        if dataclasses.is_dataclass(part):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(part, dataclasses.fields(part)[0].name, None)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.COMMAND)
def test_an_option_the_request_lacks_is_refused(files, kind):
    args = parse(command_lines(files)[kind])
    args.undeclared = 1  # as if an option were added to the parser and not to the request
    with pytest.raises(RuntimeError, match="undeclared"):
        kind.from_args(args)


def test_a_field_the_parser_lacks_is_refused(files):
    """A request field that no option fills: the parsed command line has no such destination."""
    args = parse(command_lines(files)[generate.GenerateRequest])
    del args.no_stop
    with pytest.raises(KeyError, match="no_stop"):
        generate.GenerateRequest.from_args(args)
    with pytest.raises(RuntimeError, match="no option of the command: extra"):
        check_holds({"a": [1]}, {"a": (1,), "extra": 2}, exact=True)
    check_holds({"a": [1]}, {"a": (1,), "extra": 2})  # ScoreRequest's defaults of the other command


def test_another_commands_line_is_refused(files):
    with pytest.raises(ValueError, match="'generate'"):
        concat.ConcatRequest.from_args(parse(command_lines(files)[generate.GenerateRequest]))


def test_the_types_of_the_audits_requests(files):
    books = audit_books.BooksRequest.from_args(parse(command_lines(files)[audit_books.BooksRequest]))
    assert books.inputs.books == str(files["texts"]) and books.inputs.model == "m"
    assert books.inputs.data_dir == files["folder"] and isinstance(books.inputs.data_dir, Path)
    assert books.settings.methods == ("loss", "min_k") and books.settings.threshold == -5.0
    assert books.run == AuditRunRequest(dtype="bfloat16", batch_size=8, chunk_size=None, allow_download=False,
                                        overwrite=False, no_progress=False)
    assert books.source is None and books.out == files["out"] and isinstance(books.out, Path)
    assert audit_books.config_of(books).methods == ("loss", "min_k")
    unl = audit_unlearning.UnlearningRequest.from_args(parse(command_lines(files)[audit_unlearning.UnlearningRequest]))
    assert unl.inputs.texts == files["texts"] and unl.qa.qa == files["texts"] and isinstance(unl.qa.qa, Path)
    assert unl.settings.k == 0.3 and unl.settings.top_k == 4 and unl.qa.qa_question_field == "question"
    assert audit_unlearning.config_of(unl).top_k == 4 and unl.run.dtype == "float32"


def test_the_types_of_the_flat_requests(files):
    lines = command_lines(files)
    di = dataset_inference.InferenceRequest.from_args(parse(lines[dataset_inference.InferenceRequest]))
    assert di.methods == ("loss", "zlib") and di.k == (0.2, 0.5) and di.suspect == files["texts"]
    assert di.out == files["out"] and di.suspect_scores is None and di.dtype == "float32"
    ds = datasets.DatasetsRequest.from_args(parse(lines[datasets.DatasetsRequest]))
    assert (ds.action, ds.name, ds.config) == ("build", "wikimia", ("32", "64"))
    assert ds.source == files["folder"] and isinstance(ds.data_dir, Path)
    ft = freq_table.FreqTableRequest.from_args(parse(lines[freq_table.FreqTableRequest]))
    assert ft.corpus == (files["texts"], files["texts"]) and all(isinstance(c, Path) for c in ft.corpus)
    assert ft.tokenizer == files["tokenizer"] and ft.max_tokens == 9 and ft.model == "smollm2"
    gen = generate.GenerateRequest.from_args(parse(lines[generate.GenerateRequest]))
    assert gen.prompt == ("a", "b") and gen.top_p == 0.5 and gen.top_k is None and gen.n == 20
    cc = concat.ConcatRequest.from_args(parse(lines[concat.ConcatRequest]))
    assert cc.per_side == (2, 1) and cc.lengths == (8, 16) and cc.corpus == files["texts"] and not cc.wikimia
    wm = window_metrics.WindowMetricsRequest.from_args(parse(lines[window_metrics.WindowMetricsRequest]))
    assert wm.run == files["folder"] and wm.data == files["texts"] and wm.by == "dataset" and wm.n_bootstrap == 1000


def test_a_choice_outside_its_literal_is_refused(files):
    args = parse(command_lines(files)[datasets.DatasetsRequest])
    args.action = "remove"  # the parser's choices and the request's Literal out of step
    with pytest.raises(ValueError, match="action must be one of"):
        datasets.DatasetsRequest.from_args(args)


def test_parts_are_built_from_the_same_options():
    @dataclasses.dataclass(frozen=True)
    class Part:
        b: int

    @dataclasses.dataclass(frozen=True)
    class Whole(CommandRequest):
        a: tuple[int, ...]
        part: Part

    whole = build(Whole, {"a": [1, 2], "b": 3})
    assert whole == Whole((1, 2), Part(3)) and whole.options() == {"a": [1, 2], "b": 3}


@pytest.mark.parametrize("module, kind", [(audit_books, audit_books.BooksRequest),
                                          (audit_unlearning, audit_unlearning.UnlearningRequest)])
def test_audit_fingerprints_read_the_options_as_parsed(files, module, kind):
    """The options in an audit folder's fingerprint: those of the parsed command line (as the fingerprint read them
    before the requests), but the ones NOT_IN_FINGERPRINT names."""
    args = parse(command_lines(files)[kind])
    request = kind.from_args(args)
    before = {k: v for k, v in sorted(vars(args).items()) if k not in module.NOT_IN_FINGERPRINT and k != "command"}
    after = {k: v for k, v in sorted(request.options().items()) if k not in module.NOT_IN_FINGERPRINT}
    assert json.dumps(after) == json.dumps(before) and after
