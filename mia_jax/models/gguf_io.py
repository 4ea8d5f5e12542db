"""GGUF files (llama.cpp): metadata, Hugging Face-named float32 tensors, and a `tokenizers.Tokenizer`.

The architecture-specific parts live in each model module, which provides
- `config_from_gguf(meta, arrays)` (arrays: the GGUF-named float32 tensors; `tensors.GGUFMeta` reads them),
- `tensors_from_gguf(cfg, arrays)`: HF-named tensors with llama.cpp's conversion-time changes undone (permuted
  q/k rows for llama, 1 + weight norms for Gemma, regrouped qkv for GPT-NeoX, ...), generated from the family's
  weight spec (`weights.WeightSpec.tensors_from_gguf`; its GGUF names: `GGUF_TO_HF`).
`read_gguf(path, module_for)` ties them together; `module_for(arch)` comes from the dispatch table in
`checkpoint.py`. The metadata is parsed here directly (the `gguf` package's reader takes ~10 s on a
262k-token vocabulary); the `gguf` package dequantizes the tensors.
"""

from __future__ import annotations

import math
import mmap
import struct
from typing import Any, Callable

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from mia_jax.errors import UserError
from mia_jax.models import hf
from mia_jax.models.tensors import Lazy

# GGUF value types: id -> numpy dtype (arrays) and struct format (scalars)
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
            12: "<f8"}
_STRUCT = {k: struct.Struct("<" + c) for k, c in zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIifBQqd")}
_STRING, _ARRAY, _BOOL = 8, 9, 7


_FIX = "re-download or re-convert it"


class _Cursor:
    """Reads GGUF header fields, checking each size against the bytes left before reading or allocating."""

    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path, self.at = buf, 0, path, "the header"

    def need(self, n: int, what: str = "") -> None:
        left = len(self.buf) - self.pos
        if n > left:
            raise UserError(f"{self.path}: truncated or corrupt GGUF: {what or self.at} needs {n} bytes at offset "
                            f"{self.pos} but only {left} remain (file size {len(self.buf)}); {_FIX}")

    def scalar(self, kind: int):
        fmt = _STRUCT[kind]
        self.need(fmt.size)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return bool(value) if kind == _BOOL else value

    def string(self) -> str:
        n = self.scalar(10)
        self.need(n, f"a {n}-byte string in {self.at}")
        s = bytes(self.buf[self.pos: self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def kind(self) -> int:
        kind = self.scalar(4)
        if kind not in _SCALARS and kind not in (_STRING, _ARRAY):
            raise UserError(f"{self.path}: unknown GGUF value type {kind} in {self.at}; the file is corrupt: {_FIX}")
        return kind

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            return self.scalar(kind)
        item, n = self.kind(), self.scalar(10)
        if item == _STRING:
            self.need(8 * n, f"an array of {n} strings in {self.at}")
            return [self.string() for _ in range(n)]
        if item == _ARRAY:
            self.need(12 * n, f"an array of {n} arrays in {self.at}")
            return [self.value(self.kind()) for _ in range(n)]
        dt = np.dtype(_SCALARS[item])
        self.need(n * dt.itemsize, f"an array of {n} {dt.name} in {self.at}")
        out = np.frombuffer(self.buf, dt, n, self.pos)
        self.pos += n * dt.itemsize
        return [bool(x) for x in out] if item == _BOOL else out.tolist()


def _parse(buf, path: str) -> tuple[dict, list[tuple[str, tuple[int, ...], int, int]], int]:
    """(metadata, [(name, dims fastest-first, ggml type, offset)], data start) of a GGUF buffer; a header that
    claims more than the file holds is a UserError before anything of that size is allocated."""
    if bytes(buf[:4]) != b"GGUF":
        raise UserError(f"{path}: not a GGUF file")
    c = _Cursor(buf, path)
    c.pos = 4
    version = c.scalar(4)
    if version not in (2, 3):
        raise UserError(f"{path}: GGUF version {version} is not supported (only 2 and 3, little-endian); the file is "
                        f"corrupt or from another tool: {_FIX}")
    n_tensors, n_kv = c.scalar(10), c.scalar(10)
    # each metadata field takes at least 13 bytes (key length, type, one byte), each tensor info at least 24
    c.need(13 * n_kv + 24 * n_tensors, f"the header ({n_kv} metadata fields, {n_tensors} tensors)")
    meta = {}
    for i in range(n_kv):
        c.at = f"metadata field {i}"
        key = c.string()
        c.at = f"metadata field {key!r}"
        meta[key] = c.value(c.kind())
    infos = []
    for i in range(n_tensors):
        c.at = f"tensor info {i}"
        name = c.string()
        c.at = f"tensor info {name!r}"
        n_dims = c.scalar(4)
        c.need(8 * n_dims + 12)
        dims = tuple(c.scalar(10) for _ in range(n_dims))
        infos.append((name, dims, c.scalar(4), c.scalar(10)))
    align = meta.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0:
        raise UserError(f"{path}: GGUF general.alignment is {align!r}, not a positive integer; {_FIX}")
    return meta, infos, -(-c.pos // align) * align


_INTEGER_TYPES = ("I8", "I16", "I32", "I64")


def _dequantizable(qtype) -> bool:
    """F32, F16, F64 and the quantized types the installed gguf package dequantizes."""
    import gguf  # ~20 ms: only when a GGUF file's tensors are read

    if qtype.name in ("F32", "F16", "F64"):
        return True
    traits = getattr(gguf.quants, "_type_traits", None)
    return traits is None or qtype in traits  # (an older gguf without the table: tried when read)


def _dequantize(raw: np.ndarray, qtype) -> np.ndarray:
    import gguf  # ~20 ms: only when a GGUF file's tensors are read

    if qtype.name == "F64":  # stored as it is; gguf.quants has no F64 path
        return raw.view(np.float64)
    return gguf.quants.dequantize(raw, qtype)


def _layout(path: str, size: int, start: int, name: str, dims: tuple, kind: int, offset: int):
    """(quantization type, bytes per row, rows) of one tensor, its byte range checked against the file size."""
    import gguf  # ~20 ms: only when a GGUF file's tensors are read

    try:
        qtype = gguf.GGMLQuantizationType(kind)
    except ValueError:
        raise UserError(f"{path}: tensor {name!r} has unknown GGML type {kind}; the file is corrupt or newer than "
                        f"the installed gguf package: {_FIX}, or upgrade gguf") from None
    if qtype.name in _INTEGER_TYPES:
        raise UserError(f"{path}: tensor {name!r} has GGML type {qtype.name}, an integer type, not floating-point or "
                        f"quantized weights (F32, F16, BF16, Q8_0, Q4_K, ...); the file is corrupt or not a model: "
                        f"{_FIX}")
    if not _dequantizable(qtype):
        raise UserError(f"{path}: tensor {name!r} has GGML type {qtype.name}, which the installed gguf package "
                        "cannot dequantize; upgrade gguf, or re-convert the model to F16 or Q8_0")
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if not dims or dims[0] % block:
        raise UserError(f"{path}: tensor {name!r} has dims {list(dims)}, not whole {qtype.name} blocks of {block}; "
                        f"the file is corrupt: {_FIX}")
    row_bytes, n_rows = dims[0] // block * type_size, math.prod(dims[1:])
    begin, end = start + offset, start + offset + row_bytes * n_rows
    if end > size:
        raise UserError(f"{path}: truncated or corrupt GGUF: tensor {name!r} ({qtype.name}, dims {list(dims)}) needs "
                        f"bytes {begin}..{end} but the file has {size} bytes; {_FIX}")
    return qtype, row_bytes, n_rows


def read_metadata(path: str) -> dict:
    """All key/value fields of a GGUF file as Python values (arrays as lists)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _parse(buf, path)[0]


def read_arrays(path: str) -> tuple[dict, dict[str, Lazy]]:
    """(metadata, {GGUF tensor name: `Lazy` float32 tensor in the HF [out, in] order}) of a GGUF file; each
    tensor is dequantized from the memory-mapped file when it is used."""
    data = np.memmap(path, np.uint8, mode="r")
    meta, infos, start = _parse(data, path)

    def entry(name, dims, kind, offset) -> Lazy:
        qtype, row_bytes, n_rows = _layout(path, data.size, start, name, dims, kind, offset)
        shape = tuple(reversed(dims))  # GGUF lists dims fastest-first

        def rows(first: int, stop: int) -> np.ndarray:
            """Dequantized [first:stop] along the first dimension (whole quantization rows of the file)."""
            per = n_rows // shape[0] if len(shape) > 1 else 1
            lo, hi = (first * per, stop * per) if len(shape) > 1 else (0, n_rows)
            raw = data[start + offset + lo * row_bytes: start + offset + hi * row_bytes].reshape(hi - lo, row_bytes)
            try:
                a = _dequantize(np.array(raw), qtype)
            except NotImplementedError as e:
                raise UserError(f"{path}: tensor {name!r} has type {qtype.name}, which cannot be "
                                f"dequantized: {e}") from e
            return np.asarray(a, np.float32).reshape((stop - first, *shape[1:]) if len(shape) > 1 else shape)

        def take(index):
            index = index if isinstance(index, tuple) else (index,)
            first = index[0] if index else slice(None)
            if len(shape) < 2 or not isinstance(first, slice) or first.step not in (None, 1):
                return rows(0, shape[0])[index]
            lo, hi, _ = first.indices(shape[0])
            return rows(lo, max(lo, hi))[(slice(None), *index[1:])]  # Lazy.__getitem__ copies it

        return Lazy(shape, lambda: rows(0, shape[0]), take)

    return meta, {info[0]: entry(*info) for info in infos}


def read_gguf(path: str, module_for: Callable[[str], Any]) -> tuple[Any, dict[str, np.ndarray], dict]:
    """(config, HF-named float32 tensors, metadata) of a GGUF file; `module_for(arch)` gives the model module,
    whose `config_from_gguf(meta, arrays)` and `tensors_from_gguf(cfg, arrays)` do the architecture's part."""
    meta, arrays = read_arrays(path)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise UserError(f"{path}: GGUF general.architecture is {arch!r}, not a name; {_FIX}")
    module = module_for(arch)
    if "token_embd.weight" not in arrays:
        raise UserError(f"{path}: no token_embd.weight tensor")
    try:
        cfg = module.config_from_gguf(meta, arrays)
    except UserError as e:
        raise UserError(str(e) if str(e).startswith(path) else f"{path}: {e}") from e
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise UserError(f"{path}: GGUF metadata cannot be read as a {arch} config ({type(e).__name__}: "
                        f"{hf.one_line(e)}); {_FIX}") from e
    hf.check_config(cfg, path, "GGUF metadata", _FIX)
    try:
        tensors = module.tensors_from_gguf(cfg, arrays)
    except UserError as e:
        raise UserError(f"{path}: {e}") from e
    return cfg, tensors, meta


# ----------------------------------------------------------------------------- tokenizers

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(add_prefix_space: bool = False):
    return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)


def _split_then_bytes(regex: str):
    return lambda _: pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated"), pre_tokenizers.ByteLevel(False, use_regex=False)]
    )


# tokenizer.ggml.pre -> pre-tokenizer builder (argument: add_prefix_space); anything else gets plain ByteLevel.
PRE_TOKENIZERS = {
    "smollm": lambda p: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level(p)]),
    "llama3": _split_then_bytes(_LLAMA3_SPLIT),
    "llama-v3": _split_then_bytes(_LLAMA3_SPLIT),
    "llama-bpe": _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": _split_then_bytes(_QWEN2_SPLIT),
}
GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tokenizer_from_gguf(meta: dict, path: str) -> Tokenizer:
    """The tokenizer `tokenizer.ggml.*` describes, built as transformers' GGUF loader builds it:
    'gpt2' -> byte-level BPE; 'llama' -> SentencePiece-style BPE with byte fallback (Gemma's variant for gemma*)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind in ("gpt2", "llama") and not isinstance(meta.get("tokenizer.ggml.tokens"), list):
        raise UserError(f"{path}: GGUF tokenizer.ggml.tokens is missing or not a list; {_FIX}, or pass "
                        "tokenizer_path= a tokenizer.json")
    if kind == "gpt2":
        tok = _byte_level_bpe(meta)
    elif kind == "llama":
        tok = _sentencepiece_bpe(meta)
    else:
        raise UserError(
            f"{path}: building a tokenizer from GGUF tokenizer model {kind!r} is not implemented (only 'gpt2' "
            "byte-level BPE and 'llama' SentencePiece BPE); pass tokenizer_path= a tokenizer.json for this model"
        )
    tok.post_processor = _template(meta)
    return tok


def _byte_level_bpe(meta: dict) -> Tokenizer:
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    in_alphabet = [set(t) <= alphabet for t in tokens]
    vocab = {
        t if ok else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, (t, ok) in enumerate(zip(tokens, in_alphabet))
    }
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or ()]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    tok.pre_tokenizer = PRE_TOKENIZERS.get(meta.get("tokenizer.ggml.pre"), _byte_level)(add_prefix)
    tok.decoder = decoders.ByteLevel()
    # 3 = control (special, e.g. <|endoftext|>); 4 = user-defined (matched whole, not special)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty, ok in zip(tokens, types, in_alphabet) if ty == 3 and ok])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4])
    return tok


def sentencepiece_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a token into two vocabulary tokens,
    best score first (transformers' `generate_merges` with vocab_scores, same order and tie-breaking)."""
    merges = []
    for token, score in scores.items():
        local = [(token[:i], token[i:], score) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _sentencepiece_bpe(meta: dict) -> Tokenizer:
    """SentencePiece BPE as a `tokenizers` BPE with byte fallback (transformers' LlamaTokenizer /
    GemmaTokenizer from a GGUF). The file has no merges: they are rebuilt from the vocabulary, ordered by
    score, or for Gemma (whose scores do not follow its merge order) by position in the file."""
    gemma = meta.get("general.architecture") in GEMMA_ARCHITECTURES
    tokens = stored = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if gemma:  # runs of spaces are stored as real spaces; Gemma's vocabulary spells them with "▁"
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in stored]
    vocab = {t: i for i, t in enumerate(tokens)}
    if gemma:
        scores = {t: -i for i, t in enumerate(tokens)}
    else:
        scores = dict(zip(tokens, meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)))
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=sentencepiece_merges(vocab, scores), fuse_unk=True,
                               byte_fallback=True, unk_token=tokens[unk] if gemma and unk is not None else None))
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:  # GemmaTokenizer: spaces become "▁" and split after each, no prefix space
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:  # LlamaTokenizer: a "▁" prepended to the first word
        prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
        tok.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first" if prefix else "never", split=False)
        if prefix:
            steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    # user-defined tokens are matched whole, as stored (so the respelled space runs are not among them)
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(stored, types) if ty == 4 and t in vocab])
    return tok


def add_bos(meta: dict) -> bool:
    """llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise."""
    return bool(meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama"))


def _template(meta: dict):
    """BOS/EOS post-processor per tokenizer.ggml.add_bos_token / add_eos_token (None when neither)."""
    tokens = meta["tokenizer.ggml.tokens"]
    specials, single = [], "$A:0"
    for key, flag, fmt in (("bos", add_bos(meta), "{t}:0 {s}"),
                           ("eos", meta.get("tokenizer.ggml.add_eos_token"), "{s} {t}:0")):
        tid = meta.get(f"tokenizer.ggml.{key}_token_id")
        if flag and tid is not None:
            single = fmt.format(t=tokens[tid], s=single)
            specials.append((tokens[tid], tid))
    if not specials:
        return None
    pair = single + " " + single.replace("$A:0", "$B:1").replace(":0", ":1")
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
