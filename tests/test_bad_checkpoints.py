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
    (b"\xff\xfe\x00garbage", r"not UTF-8 text \(byte 0xff at file offset 0\)"),
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


# ----------------------------------------------------------------------------- config.json values (issue 30)


def edit_config(folder, **change):
    """Set (or, for a value of `DELETE`, remove) keys of a model folder's config.json."""
    config = folder / "config.json"
    raw = {k: v for k, v in dict(json.loads(config.read_text()), **change).items() if v is not DELETE}
    config.write_text(json.dumps(raw))
    return config


DELETE = object()


@pytest.mark.parametrize("change, expected", [
    (dict(hidden_size="32"), "'hidden_size' is \"32\", expected a positive integer"),
    (dict(num_hidden_layers=2.0), "'num_hidden_layers' is 2.0, expected a positive integer"),
    (dict(rope_theta=None), "'rope_theta' is null, expected a positive number"),
    (dict(max_position_embeddings=-1), "'max_position_embeddings' is -1, expected a positive integer"),
    (dict(num_attention_heads=0), "'num_attention_heads' is 0, expected a positive integer"),
    (dict(vocab_size=-320), "'vocab_size' is -320, expected a positive integer"),
    (dict(intermediate_size=None), "'intermediate_size' is null, expected a positive integer"),
    (dict(num_key_value_heads=True), "'num_key_value_heads' is true, expected a positive integer"),
    (dict(rms_norm_eps="1e-5"), "'rms_norm_eps' is \"1e-5\", expected a number >= 0"),
    (dict(rms_norm_eps=-1e-5), "'rms_norm_eps' is -1e-05, expected a number >= 0"),
    (dict(tie_word_embeddings="yes"), "'tie_word_embeddings' is \"yes\", expected true or false"),
    (dict(eos_token_id="0"), "'eos_token_id' is \"0\", expected a token id"),
    (dict(hidden_act=5), "'hidden_act' is 5, expected a string"),
    (dict(rope_scaling=[2]), "'rope_scaling' is [2], expected a JSON object"),
    (dict(rope_scaling={"rope_type": "linear", "factor": "2"}), "'rope_scaling.factor' is \"2\", expected a positive"),
    (dict(rope_scaling={"rope_type": "linear"}), "rope_scaling of type 'linear' has no 'factor'"),
    (dict(num_attention_heads=3), "num_attention_heads=3 is not a multiple of num_key_value_heads=2"),  # the family
    (dict(num_hidden_layers=DELETE), "required key 'num_hidden_layers' is missing"),
])
def test_config_value_of_the_wrong_type_or_range(hf_copy, change, expected):
    config = edit_config(hf_copy, **change)
    msg = user_error(hf_copy, config)
    assert msg.startswith(f"{config}: ") and expected in msg, msg


@pytest.mark.parametrize("content, expected", [
    (b"", "the file is empty, expected a JSON object"),
    (b"  \n", "the file is empty, expected a JSON object"),
    (b'"llama"', "expected a JSON object, found a string"),
    (b"null", "expected a JSON object, found null"),
    (b'{"model_type": "llama", "hidden_size": caf\xc3\xa9}', "cannot read it as JSON"),
    (b'{"model_type": "caf\xe9"}', r"not UTF-8 text \(byte 0xe9 at file offset 19\)"),
])
def test_config_empty_or_not_json(hf_copy, content, expected):
    (hf_copy / "config.json").write_bytes(content)
    with pytest.raises(UserError, match=expected):
        load(str(hf_copy))


def test_config_with_a_byte_order_mark_is_read(hf_copy):
    config = hf_copy / "config.json"
    config.write_bytes(b"\xef\xbb\xbf" + config.read_bytes())
    assert load(str(hf_copy)).config.hidden_size == 32


def test_config_json_that_is_a_folder(hf_copy):
    (hf_copy / "config.json").unlink()
    (hf_copy / "config.json").mkdir()
    assert "config.json: cannot read it" in user_error(hf_copy, hf_copy / "config.json")


@pytest.mark.parametrize("family, raw, expected", [
    ("gpt2", {"model_type": "gpt2", "n_embd": "768"}, "'n_embd' is \"768\", expected a positive integer"),
    ("gpt2", {"model_type": "gpt2", "n_embd": None, "n_layer": 2, "n_head": 4, "vocab_size": 9},
     "required key 'hidden_size' is missing"),  # neither spelling
    ("gpt_neox", {"model_type": "gpt_neox", "rotary_pct": 1.5}, "'rotary_pct' is 1.5, expected a number in (0, 1]"),
    ("gpt_neox", {"model_type": "gpt_neox", "use_parallel_residual": 1}, "'use_parallel_residual' is 1, expected true"),
    ("opt", {"model_type": "opt", "ffn_dim": 0}, "'ffn_dim' is 0, expected a positive integer"),
    ("gemma3", {"model_type": "gemma3", "text_config": {"sliding_window": "512"}},
     "'text_config.sliding_window' is \"512\", expected a positive integer"),
    ("gemma3", {"model_type": "gemma3", "text_config": [1]}, "'text_config' is [1], expected a JSON object"),
    ("gemma3_text", {"model_type": "gemma3_text", "rope_parameters": {"full_attention": {"rope_theta": "1e6"}}},
     "'rope_parameters.full_attention.rope_theta' is \"1e6\", expected a positive number"),
    ("gemma3_text", {"model_type": "gemma3_text", "num_hidden_layers": 2.5}, "'num_hidden_layers' is 2.5"),
    ("phi3", {"model_type": "phi3", "rope_theta": "10000"}, "'rope_theta' is \"10000\", expected a positive number"),
    ("qwen2", {"model_type": "qwen2", "max_window_layers": -1}, "'max_window_layers' is -1, expected an integer >= 0"),
    ("mistral", {"model_type": "mistral", "sliding_window": 0}, "'sliding_window' is 0, expected a positive integer"),
    ("llama", {"model_type": "llama", "layer_types": "full_attention"}, "'layer_types' is \"full_attention\", "
                                                                         "expected a list of strings"),
])
def test_config_checks_of_every_family(tmp_path, family, raw, expected):
    from mia_jax.models import architecture, hf

    path = tmp_path / "config.json"
    with pytest.raises(UserError) as e:
        hf.parse_config(architecture(family)[1], raw, path)
    assert str(e.value).startswith(f"{path}: ") and expected in str(e.value), str(e.value)


def test_config_checks_of_bert(tmp_path):
    from mia_jax.models import bert, hf

    path = tmp_path / "config.json"
    with pytest.raises(UserError, match="'type_vocab_size' is \"2\", expected a positive integer"):
        hf.parse_config(bert.BertConfig, {"model_type": "bert", "type_vocab_size": "2"}, path)
    with pytest.raises(UserError, match="'layer_norm_eps' is null, expected a number >= 0"):
        hf.parse_config(bert.BertConfig, {"model_type": "roberta", "layer_norm_eps": None}, path)


def test_gguf_metadata_values_are_checked(tiny_gguf, tmp_path):
    """A GGUF whose metadata gives a size of 0 is refused when its config is built, naming the file."""
    reader = gguf.GGUFReader(str(tiny_gguf))
    field = reader.fields["llama.block_count"]
    data = bytearray(tiny_gguf.read_bytes())
    offset = field.offset + sum(part.nbytes for part in field.parts[:-1])
    assert struct.unpack_from("<I", data, offset)[0] == 2
    data[offset:offset + 4] = struct.pack("<I", 0)
    path = corrupt(tmp_path, bytes(data))
    assert "GGUF metadata gives num_hidden_layers=0, expected a positive integer" in user_error(path)


# ----------------------------------------------------------------------------- integer weights (issue 30)


def resave(folder, dtype, names=None):
    """Re-save the tensors `names` (all when None) of a folder's model.safetensors as `dtype`."""
    from safetensors.numpy import load_file, save_file

    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    for name in names if names is not None else list(tensors):
        tensors[name] = (tensors[name] * 100).astype(dtype)
    save_file(tensors, str(weights))
    return weights


@pytest.mark.parametrize("dtype, shown", [(np.int32, "I32"), (np.int8, "I8"), (np.uint8, "U8"), (bool, "BOOL")])
def test_integer_safetensors_weight_is_refused(hf_copy, dtype, shown):
    name = "model.layers.1.mlp.up_proj.weight"
    weights = resave(hf_copy, dtype, [name])
    msg = user_error(hf_copy, weights)
    assert msg.startswith(f"{weights}: tensor {name!r} has dtype {shown} (an integer type), expected floating-point "
                          "weights"), msg


def test_float_safetensors_of_any_width_load_and_unused_integer_buffers_are_ignored(hf_copy):
    from safetensors.numpy import load_file, save_file

    reference = load(str(hf_copy)).model.embed[...]
    weights = hf_copy / "model.safetensors"
    tensors = {k: v.astype(np.float64 if "embed" in k else np.float16) for k, v in load_file(str(weights)).items()}
    tensors["model.layers.0.self_attn.masked_bias"] = np.zeros((4, 4), np.int32)  # a buffer no weight reads
    save_file(tensors, str(weights))
    loaded = load(str(hf_copy))
    np.testing.assert_allclose(np.asarray(loaded.model.embed[...]), np.asarray(reference), rtol=1e-6)


def test_integer_gguf_tensor_is_refused(hf_copy, tmp_path):
    resave(hf_copy, np.int32, ["model.layers.0.mlp.down_proj.weight"])
    path = write_tiny_gguf(tmp_path / "int.gguf", hf_copy)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["blk.0.ffn_down.weight"] == "I32" and types["blk.1.ffn_down.weight"] == "F32"
    msg = user_error(path)
    assert "tensor 'blk.0.ffn_down.weight' has GGML type I32, an integer type, not floating-point or quantized" in msg


def test_float64_gguf_loads(hf_copy, tmp_path):
    resave(hf_copy, np.float64)  # (x 100: the values change; the dtype is what matters)
    path = write_tiny_gguf(tmp_path / "f64.gguf", hf_copy)
    assert {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors} == {"F64"}
    loaded = load(str(path))
    assert np.isfinite(np.asarray(loaded.model.embed[...])).all()
    np.testing.assert_allclose(np.asarray(loaded.model.embed[...]), np.asarray(load(str(hf_copy)).model.embed[...]),
                               rtol=1e-6)


# ----------------------------------------------------------------------------- through the CLI: exit 2, one line


@pytest.mark.parametrize("spoil, needle", [
    (lambda folder: edit_config(folder, hidden_size="32"), "config.json: 'hidden_size' is \"32\", expected a positive"),
    (lambda folder: edit_config(folder, max_position_embeddings=-1), "'max_position_embeddings' is -1"),
    (lambda folder: resave(folder, np.int32, ["model.norm.weight"]), "tensor 'model.norm.weight' has dtype I32"),
], ids=["hidden-size-string", "negative-context", "int32-weight"])
def test_eval_with_a_broken_model_exits_2_and_leaves_out_as_it_was(hf_copy, tmp_path, capsys, spoil, needle):
    from helpers import assert_clean_error, snapshot

    from mia_jax.cli import main

    spoil(hf_copy)
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    capsys.readouterr()
    rc = main(["eval", "--model", str(hf_copy), "--limit", "2", "--methods", "loss", "--no-progress",
               "--out", str(out)])
    assert_clean_error(rc, capsys.readouterr().err, needle)
    assert snapshot(out) == before


# ----------------------------------------------------------------------------- masked LMs and sentence encoders


@pytest.fixture
def mlm_dir(tmp_path):
    from helpers import write_tiny_mlm

    return write_tiny_mlm(tmp_path / "roberta", "roberta")


def test_masked_lm_config_and_tokenizer_config_checked(mlm_dir):
    from mia_jax.models.bert import load_mlm

    config = edit_config(mlm_dir, max_position_embeddings=2)  # positions start at pad_token_id + 1 = 2
    with pytest.raises(UserError, match=f"^{re.escape(str(config))}: max_position_embeddings=2 leaves no position"):
        load_mlm(str(mlm_dir))
    edit_config(mlm_dir, max_position_embeddings=72)
    (mlm_dir / "tokenizer_config.json").write_bytes(b'{"mask_token": ')
    with pytest.raises(UserError, match="tokenizer_config.json: cannot read it as JSON"):
        load_mlm(str(mlm_dir))
    (mlm_dir / "tokenizer_config.json").write_text('{"mask_token": 4, "pad_token": 1}')  # not a token: ignored
    assert load_mlm(str(mlm_dir))[2] == 4


def test_sentence_max_seq_length_checked(mlm_dir):
    from mia_jax.models.sentence import SentenceEncoder

    st = mlm_dir / "sentence_bert_config.json"
    for bad in ('"128"', "0", "12.5"):
        st.write_text('{"max_seq_length": ' + bad + "}")
        with pytest.raises(UserError, match=f"^{re.escape(str(st))}: 'max_seq_length' is {re.escape(bad)}, expected"):
            SentenceEncoder(str(mlm_dir))
    st.write_text('{"max_seq_length": 16}')
    assert SentenceEncoder(str(mlm_dir)).max_length == 16


def test_tokenizer_config_values_that_are_not_tokens_are_ignored(hf_copy):
    (hf_copy / "tokenizer_config.json").write_text('{"bos_token": 5, "eos_token": {"content": null}, "pad_token": []}')
    loaded = load(str(hf_copy))
    assert loaded.bos_token_id == loaded.eos_token_id == loaded.tokenizer.token_to_id("<|endoftext|>")
    (hf_copy / "tokenizer_config.json").write_text("[]")
    assert "tokenizer_config.json: expected a JSON object, found a list" in user_error(
        hf_copy, hf_copy / "tokenizer_config.json")
