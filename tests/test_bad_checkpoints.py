"""Corrupt or truncated checkpoints give one clear UserError naming the file; Hub ids never touch the network
unless asked (issue 13)."""
import json
import re
import shutil
import socket
import struct

import numpy as np
import pytest
from helpers import write_tiny_gguf

from mia_jax.errors import UserError
from mia_jax.models import load, resolve_model

gguf = pytest.importorskip("gguf")


def user_error(path, named=None, **kwargs) -> str:
    """The UserError message of load(path): one line that names the file (`named`, else `path`)."""
    with pytest.raises(UserError) as e:
        load(str(path), **kwargs)
    msg = str(e.value)
    assert "\n" not in msg and str(named or path) in msg, msg
    return msg


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama_dir, tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_llama_dir)


@pytest.fixture
def hf_copy(tiny_llama_dir, tmp_path):
    return shutil.copytree(tiny_llama_dir, tmp_path / "model")


def corrupt(tmp_path, content: bytes, name="bad.gguf"):
    path = tmp_path / name
    path.write_bytes(content)
    return path


# ----------------------------------------------------------------------------- GGUF


def test_the_uncorrupted_gguf_loads(tiny_gguf, tiny_llama_dir):
    loaded = load(str(tiny_gguf))
    assert loaded.config.vocab_size == 320 and loaded.config.num_hidden_layers == 2


def test_gguf_magic_then_garbage(tmp_path):
    rng = np.random.default_rng(0)
    path = corrupt(tmp_path, b"GGUF" + rng.bytes(4096))
    assert "GGUF version" in user_error(path)
    # a valid version, then garbage: the counts and lengths are checked against the file size before any allocation
    for seed in range(5):
        path = corrupt(tmp_path, b"GGUF" + struct.pack("<I", 3) + np.random.default_rng(seed).bytes(4096))
        assert "truncated or corrupt GGUF" in user_error(path) and "re-download or re-convert" in user_error(path)


TOKENS = "metadata field 'tokenizer.ggml.tokens'"


@pytest.mark.parametrize("n_bytes, where", [
    (4, "the header"), (6, "the header"), (8, "the header"), (20, "the header"),
    (200, "the header (16 metadata fields, 20 tensors)"),  # the counts, checked before any field is read
    (1000, f"an array of 320 strings in {TOKENS}"), (2000, f"in {TOKENS}"),
])
def test_gguf_header_cut_short(tiny_gguf, tmp_path, n_bytes, where):
    path = corrupt(tmp_path, tiny_gguf.read_bytes()[:n_bytes])
    msg = user_error(path)
    assert "truncated or corrupt GGUF: " in msg and where in msg and f"(file size {n_bytes})" in msg, msg


def test_gguf_cut_inside_tensor_infos(tiny_gguf, tmp_path):
    start = gguf.GGUFReader(str(tiny_gguf)).data_offset
    path = corrupt(tmp_path, tiny_gguf.read_bytes()[:start - 40])
    assert "tensor info" in user_error(path)


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_gguf_truncated_in_tensor_data(tiny_gguf, tmp_path, keep):
    data = tiny_gguf.read_bytes()
    size = int(len(data) * keep)
    msg = user_error(corrupt(tmp_path, data[:size]))
    # the tensor's byte range is checked against the file size before any tensor is read
    assert "truncated or corrupt GGUF: tensor" in msg and f"the file has {size} bytes" in msg


def test_gguf_tensor_type_unknown(tiny_gguf, tmp_path):
    data = bytearray(tiny_gguf.read_bytes())
    info = gguf.GGUFReader(str(tiny_gguf)).tensors[0].field  # parts: name length, name, n_dims, dims, type, offset
    offset = info.offset + sum(part.nbytes for part in info.parts[:-2])
    assert struct.unpack_from("<I", data, offset)[0] == 0  # F32
    data[offset:offset + 4] = struct.pack("<I", 999)
    assert "unknown GGML type 999" in user_error(corrupt(tmp_path, bytes(data)))


# ----------------------------------------------------------------------------- HF folders


@pytest.mark.parametrize("content, expected", [
    ("[1, 2]", "expected a JSON object, found a list"),
    ('{"model_type": "llama"', "cannot read"),
    (b"\xff\xfe\x00garbage", "cannot read"),
])
def test_config_not_an_object_or_not_json(hf_copy, content, expected):
    config = hf_copy / "config.json"
    config.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError, match=expected) as e:
        load(str(hf_copy))
    assert str(config) in str(e.value) and "\n" not in str(e.value)


def test_config_missing_key_is_named(hf_copy):
    config = hf_copy / "config.json"
    raw = json.loads(config.read_text())
    del raw["hidden_size"]
    config.write_text(json.dumps(raw))
    with pytest.raises(UserError, match=r"required key 'hidden_size' is missing") as e:
        load(str(hf_copy))
    assert str(config) in str(e.value)


def test_safetensors_random_bytes(hf_copy):
    weights = hf_copy / "model.safetensors"
    weights.write_bytes(np.random.default_rng(0).bytes(10_000))
    assert "not a valid safetensors file" in user_error(hf_copy, weights)


def test_safetensors_truncated(hf_copy):
    weights = hf_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    # safetensors checks the header's byte ranges against the file size when it opens the file
    assert "truncated or corrupt" in user_error(hf_copy, weights)
    weights.write_bytes(data[:6])
    assert "truncated or corrupt" in user_error(hf_copy, weights)


@pytest.mark.parametrize("change, expected", [
    (dict(intermediate_size=48), r"has shape \(2, 64, 32\), expected \(2, 48, 32\)"),
    (dict(hidden_size=16), r"cannot reshape array of shape \(32, 32\)"),
    (dict(num_hidden_layers=3), r"missing tensor 'model.layers.2.input_layernorm.weight'"),
])
def test_safetensors_shape_does_not_match_config(hf_copy, change, expected):
    config = hf_copy / "config.json"
    config.write_text(json.dumps(dict(json.loads(config.read_text()), **change)))
    msg = user_error(hf_copy)
    assert re.search(expected, msg) and "do not match the model config" in msg, msg


@pytest.mark.parametrize("content", [b'{"hello": "world"}', b"[1, 2, 3]", b"\x00\xff" * 50, b""])
def test_tokenizer_json_not_a_tokenizer(hf_copy, content):
    tok = hf_copy / "tokenizer.json"
    tok.write_bytes(content)
    assert "not a valid tokenizer.json" in user_error(hf_copy, tok)


def test_gguf_with_bad_tokenizer_path(tiny_gguf, tmp_path):
    tok = corrupt(tmp_path, b'{"model": 5}', "tokenizer.json")
    with pytest.raises(UserError, match="not a valid tokenizer.json") as e:
        load(str(tiny_gguf), tokenizer_path=str(tok))
    assert str(tok) in str(e.value)


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Fail the test on any connection or huggingface_hub call; run from an empty folder."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network or Hub call: {args} {kwargs}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub, "snapshot_download", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)


def test_hub_id_is_not_looked_up_by_default(no_network):
    for call in (lambda: load("org/name"), lambda: resolve_model("org/name")):
        with pytest.raises(UserError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith("no such local path: 'org/name'") and "\n" not in msg
        assert "allow_download=True" in msg and "--allow-download" in msg and "hf://org/name" in msg


def test_missing_local_path_is_reported_as_such(no_network, tmp_path):
    with pytest.raises(UserError, match="no such local path: .*nope.*packaged names"):
        load(str(tmp_path / "a" / "nope"), allow_download=True)  # not an org/name: never a Hub id


def test_hub_is_consulted_only_when_asked(monkeypatch, tiny_llama_dir, tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    calls = []

    def from_cache(repo_id, allow_patterns=None, local_files_only=False):
        calls.append((repo_id, local_files_only))
        if not local_files_only:
            raise AssertionError("no download: HF_HUB_OFFLINE is set")
        if repo_id != "org/cached":
            raise FileNotFoundError(repo_id)
        return str(tiny_llama_dir)

    monkeypatch.setattr(hub, "snapshot_download", from_cache)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("network probe"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("hf://org/cached") == str(tiny_llama_dir.resolve())
    assert resolve_model("org/cached", allow_download=True) == str(tiny_llama_dir.resolve())
    assert calls == [("org/cached", True)] * 2
    with pytest.raises(UserError, match="^no such local path: 'org/other', and model org/other is not in the local "
                                        "Hugging Face cache and HF_HUB_OFFLINE is set"):
        resolve_model("org/other", allow_download=True)
    with pytest.raises(UserError, match="^model hf://org/other is not in the local Hugging Face cache"):
        load("hf://org/other")
    with pytest.raises(UserError, match="not a Hugging Face Hub id"):
        resolve_model("hf://just-a-name")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "cached").mkdir()  # an existing local path wins over the Hub
    assert resolve_model("org/cached", allow_download=True) == str((tmp_path / "org" / "cached").resolve())
