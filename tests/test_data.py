"""Dataset readers: WikiMIA (bundled), JSONL / CSV / bare strings, and their errors."""

import pytest

from mia_jax import data
from mia_jax.errors import UserError


def test_wikimia_bundled_sizes():
    for length, (n, members) in {32: (776, 387), 64: (542, 284), 128: (250, 139), 256: (82, 51)}.items():
        ds = data.wikimia(length)
        assert (len(ds), sum(ds.labels)) == (n, members)
        assert len(next(iter(ds.files.values()))) == 64


def test_csv_tsv_and_bare_strings(tmp_path):
    (tmp_path / "a.csv").write_text('text,member\n"hello, world",1\nbye,0\n')
    ds = data.load_records(tmp_path / "a.csv", "text", "member")
    assert ds.texts == ["hello, world", "bye"] and ds.labels == [1, 0]
    (tmp_path / "a.tsv").write_text("text\tlabel\nfoo bar\t0\n")
    assert data.load_records(tmp_path / "a.tsv", "text").labels == [0]
    (tmp_path / "s.jsonl").write_text('"just a string"\n"another"\n')
    assert data.load_records(tmp_path / "s.jsonl", "input", None).texts == ["just a string", "another"]
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(UserError, match="unsupported file type"):
        data.load_records(tmp_path / "a.txt")


def test_text_field_default_is_text_or_input(tmp_path):
    """Without --text-field a file's texts come from its `text` field or (WikiMIA's files) its `input` field; the
    field read is recorded, the same for every row; a file with both or neither is refused, naming them."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a corpus text", "label": 1}\n{"text": "b", "label": 0}\n')
    ds = data.load_records(corpus)
    assert (ds.texts, ds.text_field) == (["a corpus text", "b"], "text")
    wiki = tmp_path / "wiki.jsonl"
    wiki.write_text('{"input": "x y", "label": 1}\n{"input": "z", "label": 0}\n')
    ds = data.load_records(wiki)
    assert (ds.texts, ds.labels, ds.text_field) == (["x y", "z"], [1, 0], "input")
    both = tmp_path / "both.jsonl"
    both.write_text('{"text": "t", "input": "i", "label": 1}\n')
    with pytest.raises(UserError, match=r"row 1 has both a 'text' and an 'input' field \(fields: text, input, label\)"):
        data.load_records(both)
    assert data.load_records(both, "input").texts == ["i"]  # a named field is read
    mixed = tmp_path / "mixed.jsonl"  # the field is chosen on the first row: a later row without it is refused
    mixed.write_text('{"text": "t", "label": 1}\n{"input": "i", "label": 0}\n')
    with pytest.raises(UserError, match=r"row 2 has no field 'text'"):
        data.load_records(mixed)
    neither = tmp_path / "neither.jsonl"
    neither.write_text('{"body": "t", "label": 1}\n')
    with pytest.raises(UserError, match=r"row 1 has neither a 'text' nor an 'input' field \(fields: body, label\)"):
        data.load_records(neither)
