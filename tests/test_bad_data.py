"""Bad input gets one clear one-line message (what, where, how to fix), never a traceback (issue 13): data files
that are not UTF-8 or not valid JSON / CSV, duplicate texts, mistyped experiment configs and empty prompts; and
the CLIs exit with code 2 and one line on stderr."""
import json
from pathlib import Path

import pytest

from mia_jax import data
from mia_jax.errors import UserError
from train.config import load_config

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO / "configs/contamination/tiny.yaml"


def raises(fn, *args, **kwargs) -> str:
    """The message of the UserError ``fn`` raises; asserted to be one line."""
    with pytest.raises(UserError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message
    return message


def one_error_line(err: str, prog: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and prog in lines[0].split(": error: ")[0], err
    return lines[0]


# ----------------------------------------------------------------------------- encodings


@pytest.mark.parametrize("name, content", [
    ("data.csv", b"input,label\nhello,1\ncaf\xe9 au lait,0\n"),
    ("data.tsv", b"input\tlabel\nhello\t1\ncaf\xe9 au lait\t0\n"),
    ("data.jsonl", b'{"input": "hello", "label": 1}\n\n{"input": "caf\xe9", "label": 0}\n'),
])
def test_not_utf8_names_file_line_byte_and_offset(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    message = raises(data.load_records, path)
    offset = content.index(b"\xe9")
    assert message.startswith(f"{path}: line 3 is not valid utf-8 (byte 0xe9 at file offset {offset}); ")
    assert "re-save the file as UTF-8" in message and "--encoding latin-1" in message
    # the keyword reads it
    ds = data.load_records(path, encoding="latin-1")
    assert ds.texts[1].startswith("café") and ds.labels == [1, 0]


def test_encoding_keyword_cp1252_utf16_and_quoted_newlines(tmp_path):
    text = 'input,label\n"two\nlines, “quoted”",1\nplain,0\n'
    (tmp_path / "w.csv").write_bytes(text.encode("cp1252"))
    assert data.load_records(tmp_path / "w.csv", encoding="cp1252").texts == ["two\nlines, “quoted”", "plain"]
    (tmp_path / "u.csv").write_bytes(text.encode("utf-16"))  # with a byte-order mark, as Excel writes it
    assert data.load_records(tmp_path / "u.csv", encoding="utf-16").texts == ["two\nlines, “quoted”", "plain"]
    message = raises(data.load_records, tmp_path / "u.csv")
    assert "line 1 is not valid utf-8 (byte 0xff at file offset 0)" in message and "--encoding utf-16" in message
    # a byte undefined in cp1252 (0x81), in the encoding the user gave
    (tmp_path / "bad.csv").write_bytes(b"input,label\nx\x81y,1\n")
    message = raises(data.load_records, tmp_path / "bad.csv", encoding="cp1252")
    assert "line 2 is not valid cp1252 (byte 0x81 at file offset 13)" in message and "latin-1" in message
    # UTF-16 decoded whole: the line of a lone surrogate is still found
    raw = "input\tlabel\r\nx\t1\r\n".encode("utf-16-le") + b"\x00\xd8"
    (tmp_path / "s.tsv").write_bytes(raw)
    message = raises(data.load_records, tmp_path / "s.tsv", encoding="utf-16-le")
    assert "line 3 is not valid utf-16-le" in message and f"file offset {len(raw) - 2}" in message


def test_unknown_encoding(tmp_path):
    (tmp_path / "a.csv").write_text("input,label\nx,1\n")
    for name in ("utf-9", "rot13", ""):
        assert raises(data.load_records, tmp_path / "a.csv", encoding=name).startswith(
            f"unknown text encoding {name!r}; give a name such as utf-8")


def test_byte_order_mark_accepted(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.csv").write_bytes(bom + b"input,label\nhello,1\n")
    assert data.load_records(tmp_path / "a.csv").texts == ["hello"]  # the header is 'input', not '\ufeffinput'
    (tmp_path / "a.jsonl").write_bytes(bom + b'{"input": "hello", "label": 1}\n')
    assert data.load_records(tmp_path / "a.jsonl").texts == ["hello"]
    (tmp_path / "b.jsonl").write_bytes(bom + b'{"input" "hello"}\n')  # the column is counted after the BOM
    assert "(Expecting ':' delimiter at column 10)" in raises(data.load_records, tmp_path / "b.jsonl")


# ----------------------------------------------------------------------------- JSON and CSV structure


def test_json_error_column_is_the_real_one(tmp_path):
    good = '{"input": "ok", "label": 1}\n'
    # leading spaces and non-ASCII characters before the error: columns count characters from 1
    (tmp_path / "a.jsonl").write_text(good + '    {"input": "Zürich → Genève" "label": 1}\n', encoding="utf-8")
    line = '    {"input": "Zürich → Genève" "label": 1}'
    message = raises(data.load_records, tmp_path / "a.jsonl")
    column = line.index('"label') + 1
    assert column == 33 and f"line 2 is not valid JSON (Expecting ',' delimiter at column {column})" in message
    assert "each line must be one JSON object" in message
    # a line cut short: the error is at its end (json alone would say column 1 of a line after it)
    (tmp_path / "b.jsonl").write_text(good + good + '{"input": "cut", "label": \r\n' + good)
    assert "line 3 is not valid JSON (Expecting value at the end of the line)" in raises(
        data.load_records, tmp_path / "b.jsonl")


def test_csv_structure_errors_name_the_line(tmp_path):
    cases = [
        ('input,label\n"fine\nspanning",1\n"never closed,0\nmore,1\n', "line 4: a quoted field starting on this "
                                                                        "line is never closed"),
        ('input,label\n"quoted" then text,1\n', "line 2 is not valid CSV"),
        ('input,label\nhello, world,1\n', "row 2 has 3 fields, the header has 2; quote a field"),
        ('input,label\n\n"two\nlines",1\n\nalone\n', "row 6 has 1 field(s), the header has 2"),
        ('input,label\n"a\nb",1\nx,2\n', "row 4 has label '2'"),  # the row number is the line where it starts
    ]
    for text, expected in cases:
        (tmp_path / "a.csv").write_text(text)
        assert expected in raises(data.load_records, tmp_path / "a.csv"), text
    (tmp_path / "mac.csv").write_bytes(b"input,label\rx,1\ry,0\r")  # classic Mac line ends
    assert data.load_records(tmp_path / "mac.csv").labels == [1, 0]


# ----------------------------------------------------------------------------- duplicates


def test_duplicate_report():
    texts = ["a", "b", "a", "c", "b", "a", "d", "d"]
    labels = [1, 0, 1, 1, 1, 0, 0, 0]
    report = data.duplicate_report(texts, labels)
    assert report == {"n_texts": 8, "n_duplicate_texts": 4, "n_conflicting_texts": 2,
                      "duplicate_examples": [[2, 0], [4, 1], [5, 0], [7, 6]],
                      "conflicting_examples": [[0, 2, 5], [1, 4]]}
    json.dumps(report)
    unlabeled = data.duplicate_report(texts, None, max_examples=1)
    assert unlabeled == {"n_texts": 8, "n_duplicate_texts": 4, "n_conflicting_texts": 0,
                         "duplicate_examples": [[2, 0]], "conflicting_examples": []}
    assert data.duplicate_report(["a", "A", "a "], [1, 0, 0])["n_duplicate_texts"] == 0  # exact equality only
    with pytest.raises(ValueError):
        data.duplicate_report(["a"], [1, 0])


# ----------------------------------------------------------------------------- experiment configs


@pytest.mark.parametrize("override, expected", [
    ("train.batch_size=abc", "override train.batch_size=abc: expected an int"),
    ("train.batch_size=1.5", "override train.batch_size=1.5: expected an int"),
    ("train.lr=fast", "override train.lr=fast: expected a float"),
    ("train.lr=.nan", "override train.lr=.nan: expected a finite float"),
    ("train.shuffle=maybe", "override train.shuffle=maybe: expected true or false"),
    ("train.max_grad_norm=big", "override train.max_grad_norm=big: expected a float or null"),
    ("score.k=0.2", "override score.k=0.2: expected a list"),
    ("score.k=[0.2, x]", "override score.k=[0.2, x]: score.k[1] is 'x', expected a float"),
    ("train.lrr=1", "override train.lrr=1: unknown key 'train.lrr' (did you mean 'train.lr'?); known in train: "),
    ("trian.lr=1", "override trian.lr=1: unknown key 'trian' (did you mean 'train'?); known at the top level: "),
    ("train.lr.x=1", "override train.lr.x=1: train.lr is not a section"),
    ("train=5", "override train=5: train is a section"),
    ("corpus.news={n_positivs: 5}", "unknown key 'corpus.news.n_positivs'"),
    ("score.k=[0.1,", "override score.k=[0.1,: the value is not valid YAML ("),
])
def test_config_override_errors(override, expected):
    assert expected in raises(load_config, TINY_CONFIG, [override])


def test_config_values_are_converted_to_the_field_types():
    cfg = load_config(TINY_CONFIG, ["corpus.background_tokens=1e5", "train.lr=1e-5", "score.k=[1e-1, 0.3]",
                                    "train.max_grad_norm=null", "train.shuffle=false", "name=2024",
                                    "corpus.news={n_positives: 5}"])
    assert cfg.corpus.background_tokens == 100000 and type(cfg.corpus.background_tokens) is int
    assert cfg.train.lr == 1e-5 and cfg.score.k == [0.1, 0.3] and cfg.train.max_grad_norm is None
    assert cfg.train.shuffle is False and cfg.name == "2024"
    assert (cfg.corpus.news.n_positives, cfg.corpus.news.n_background) == (5, 40)  # the other keys are kept


@pytest.mark.parametrize("text, expected", [
    ('train:\n  lr: "fast"\n', "config {path}: train.lr is 'fast', expected a float"),
    ("train:\n  batch_size: 1.5\n", "config {path}: train.batch_size is 1.5, expected an int"),
    ("train:\n  lr:\n", "config {path}: train.lr is null, expected a float"),
    ("- a\n- b\n", "config {path}: expected a mapping of sections (model:, corpus:, train:, ...) at the top level"),
    ("train: 5\n", "config {path}: train is 5, expected a mapping"),
    ("trian: {lr: 1}\n", "config {path}: unknown key 'trian' (did you mean 'train'?)"),
    ("train: {nope: 1}\n", "config {path}: unknown key 'train.nope'; known in train: seq_len, "),
    ("train:\n  lr: [1\n  x: 2\n", "config {path} is not valid YAML (expected ',' or ']', but got ':' at line 3"),
])
def test_config_file_errors(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert expected.format(path=path) in raises(load_config, path)


def test_config_file_missing_or_unreadable(tmp_path):
    assert raises(load_config, tmp_path / "nope.yaml") == f"config file not found: {tmp_path / 'nope.yaml'}"
    assert "is a folder" in raises(load_config, tmp_path)
    (tmp_path / "latin.yaml").write_bytes(b"name: caf\xe9\n")
    assert "is not UTF-8 text (byte 0xe9 at file offset 9)" in raises(load_config, tmp_path / "latin.yaml")


# ----------------------------------------------------------------------------- prompts


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    from mia_jax.models import checkpoint

    return checkpoint.load(str(tiny_llama_dir))


def test_empty_prompts_refused(loaded):
    from mia_jax.engine import generate

    assert raises(generate.encode_prompts, loaded, [""]) == "prompt 1 is empty: give some text to continue"
    assert raises(generate.encode_prompts, loaded, ["fine", " \n\t"]) == (
        "prompt 2 is only whitespace: give some text to continue")
    assert "prompt 1 is int" in raises(generate.encode_prompts, loaded, [3])
    assert generate.encode_prompts(loaded, ["fine"])[0]

    class NoTokens:  # a tokenizer that drops the text (e.g. a normalizer removing it) and adds no BOS
        def encode_batch(self, texts):
            return [type("Encoding", (), {"ids": []})() for _ in texts]

    fake = type("Loaded", (), {"tokenizer": NoTokens(), "bos_token_id": None, "add_bos": False})()
    assert "prompt 1 ('\\u200b') encodes to no tokens" in raises(generate.encode_prompts, fake, ["\u200b"])


# ----------------------------------------------------------------------------- the CLIs: exit code 2, one line


@pytest.mark.parametrize("args, expected", [
    (["train.batch_size=abc"], "override train.batch_size=abc: expected an int"),
    (["train.lrr=1"], "unknown key 'train.lrr'"),
])
def test_contaminate_bad_override_exits_2_before_writing(tmp_path, capsys, args, expected):
    from train.contaminate import main

    out = tmp_path / "run"
    assert main(["--config", str(TINY_CONFIG), "--out", str(out), *args]) == 2
    assert expected in one_error_line(capsys.readouterr().err, "python train/contaminate.py")
    assert not out.exists()
    out.mkdir()  # an existing folder is left as it was
    (out / "keep.txt").write_text("x")
    assert main(["--config", str(TINY_CONFIG), "--out", str(out), *args]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    one_error_line(capsys.readouterr().err, "python train/contaminate.py")


def test_contaminate_bad_config_file_exits_2(tmp_path, capsys):
    from train.contaminate import main

    (tmp_path / "bad.yaml").write_text('train:\n  lr: "fast"\n')
    out = tmp_path / "run"
    assert main(["--config", str(tmp_path / "bad.yaml"), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err, "python train/contaminate.py")
    assert "train.lr is 'fast', expected a float" in line
    assert main(["--config", str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err, "python train/contaminate.py")
    assert "missing.yaml" in line and ("not found" in line or "no such file" in line), line
    assert not out.exists()


# ----------------------------------------------------------------------------- data files (issue 30)


def test_a_folder_is_not_a_data_file(tmp_path):
    (tmp_path / "b.jsonl").write_text('{"input": "x", "label": 1}\n')
    (tmp_path / "a.csv").write_text("input,label\nx,1\n")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "sub.csv").mkdir()
    assert raises(data.load_records, tmp_path) == (
        f"{tmp_path} is a folder, not a data file; pass one file (data files in it: a.csv, b.jsonl)")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert raises(data.load_records, empty) == (
        f"{empty} is a folder, not a data file; pass one file (it holds no .jsonl, .csv, .tsv or .parquet file)")
    assert raises(data.load_records, tmp_path / "nope.jsonl") == f"data file not found: {tmp_path / 'nope.jsonl'}"


@pytest.mark.parametrize("name, content", [
    ("empty.jsonl", b""),
    ("blank.jsonl", b"\n  \n\n"),
    ("empty.csv", b""),
    ("header.csv", b"input,label\n"),
    ("bom-header.tsv", b"\xef\xbb\xbfinput\tlabel\r\n"),
])
def test_no_rows(tmp_path, name, content):
    (tmp_path / name).write_bytes(content)
    assert raises(data.load_records, tmp_path / name).startswith(f"{tmp_path / name}: no rows (the file is empty")


@pytest.mark.parametrize("line, expected", [
    ("[1, 2]", "row 2 is a list, expected an object with a 'input' field (or a string)"),
    ("5", "row 2 is a number, expected an object"),
    ("null", "row 2 is null, expected an object"),
    ("true", "row 2 is true/false, expected an object"),
    ('{"input": 5, "label": 1}', "row 2 field 'input' is int, expected a string"),
    ('{"text": "x", "label": 1}', "row 2 has no field 'input' (fields: text, label)"),
    ('{"input": "x"}', "row 2 has no field 'label' (fields: input)"),
])
def test_jsonl_row_that_is_not_a_record(tmp_path, line, expected):
    path = tmp_path / "a.jsonl"
    path.write_text('{"input": "fine", "label": 0}\n' + line + "\n")
    message = raises(data.load_records, path)
    assert message.startswith(f"{path}: ") and expected in message, message


@pytest.mark.parametrize("label", ['2', '-1', '0.5', '"yes"', '"member"', 'null', '[1]', '"1.0"'])
def test_label_that_is_not_0_or_1(tmp_path, label):
    path = tmp_path / "a.jsonl"
    path.write_text('{"input": "fine", "label": 1}\n{"input": "x", "label": ' + label + "}\n")
    message = raises(data.load_records, path)
    assert message.startswith(f"{path}: row 2 has label ") and "labels must be 0 (non-member) or 1 (member)" in message


def test_labels_spelled_as_numbers_strings_or_booleans(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(f'{{"input": "x", "label": {v}}}\n'
                                              for v in ("1", "0", "1.0", '"1"', '" 0 "', "true", "false")))
    assert data.load_records(tmp_path / "a.jsonl").labels == [1, 0, 1, 1, 0, 1, 0]


def test_csv_with_a_byte_order_mark_and_a_named_column(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "s.csv").write_bytes(bom + b"set,text,label\r\nmember,hello,1\r\n")
    assert data.load_records(tmp_path / "s.csv", "text").labels == [1]
    assert data.load_records(tmp_path / "s.csv", "text", extra=["set"]).extra == {"set": ["member"]}
    assert data.load_records(tmp_path / "s.csv", "text", encoding="utf-8-sig").texts == ["hello"]
    assert data.read_csv(tmp_path / "s.csv", ["set", "label"]) == [{"set": "member", "text": "hello", "label": "1"}]
    (tmp_path / "s.tsv").write_bytes(bom + b"set\tlabel\nseen\t1\n")
    assert data.read_csv(tmp_path / "s.tsv", ["set"]) == [{"set": "seen", "label": "1"}]


@pytest.mark.parametrize("content, expected", [
    (b"set,score\nseen,0.5\nunseen\n", "row 3 has 1 field(s), the header has 2; give every row one value per column"),
    (b"set,score\nseen,0.5,9\n", "row 2 has 3 fields, the header has 2"),
    (b'set,score\n"seen,0.5\nunseen,0.1\n', "line 2: a quoted field starting on this line is never closed"),
    (b"set,score\nseen,0.5\nunseen,0.\xff\n", "line 3 is not valid utf-8 (byte 0xff at file offset 28)"),
    (b"", "the file is empty; expected a header line (set, score)"),
    (b"\xef\xbb\xbfname,score\nx,1\n", "no column 'set' (columns: name, score)"),
])
def test_read_csv_is_strict(tmp_path, content, expected):
    path = tmp_path / "scores.csv"
    path.write_bytes(content)
    message = raises(data.read_csv, path, ["set", "score"])
    assert message.startswith(f"{path}: ") and expected in message, message
    assert raises(data.read_csv, tmp_path) == f"{tmp_path} is a folder, not a CSV file"
    assert raises(data.read_csv, tmp_path / "none.csv") == f"file not found: {tmp_path / 'none.csv'}"


def test_parquet_that_is_not_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    (tmp_path / "a.parquet").write_bytes(b"PAR1 not really")
    assert "cannot read it as Parquet" in raises(data.load_records, tmp_path / "a.parquet")


def test_eval_data_folder_exits_2_and_leaves_out_as_it_was(tmp_path, capsys):
    from helpers import assert_clean_error, snapshot

    from mia_jax.cli import main

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"input": "x", "label": 1}\n')
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    before = snapshot(out)
    rc = main(["eval", "--model", str(tmp_path / "unused"), "--data", str(folder), "--out", str(out)])
    assert_clean_error(rc, capsys.readouterr().err, f"{folder} is a folder")
    assert snapshot(out) == before
