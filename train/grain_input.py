"""The trainer's input on grain over ArrayRecord: the packed sequences written once, read back by the trainer's
own rows of every step, and the data position saved in the Orbax checkpoint.

* **The file** (``write_records`` / ``packed_records``): one ArrayRecord record per packed sequence (train/data.py),
  ``seq_len`` little-endian int32 token ids followed by the loss mask as ``np.packbits`` (4.125 bytes per token),
  written with ``group_size:1`` (every record readable on its own); ``sequences.json`` beside it holds the
  sequence length, counts, separator and the SHA-256 of the packing (``PackedData.digest`` of the same sequences,
  so the training fingerprint is the one of the in-memory pipeline). The file is written to a temporary name and
  renamed, and reused when its ``sequences.json`` matches (a resumed run does not write it again). On several
  processes process 0 writes it and the others wait for it (a barrier), then open it; where the hosts have one disk
  each (no file on a non-zero process after the barrier), that process writes its own copy (the same bytes).
* **Reading** (``RecordData``): ``grain.python.ArrayRecordDataSource``, random access by sequence index; the
  order is the sampler of ``train.data.Batches`` (grain's ``IndexSampler``: seeded global shuffle, ``num_epochs``).
  Each process reads only its own rows of every global batch (``process_shard``: the ``grain.ShardOptions`` of
  the process's contiguous block, ``placement.local_rows``), so the batches do not depend on the number of
  processes and a run resumes on another mesh or another number of hosts with the same batches in the same order.
* **The data position** (``step_iterator``, ``DataSave`` / ``DataRestore``): the trainer reads its steps through a
  ``grain.MapDataset`` of steps (prefetched by grain's threads); its iterator state ``{"next_index": step}`` is
  an item of the Orbax checkpoint (grain's ``PyGrainCheckpointHandler``: one JSON file per process; restored from
  any process's file when the number of processes changed, the position being global).

Where this differs from grain's usual multi-host recipe (``IndexSampler(shard_options=ShardByJaxProcess())`` and a
``DataLoader`` per process, as in maxtext): there each process shuffles and batches its own contiguous part of the
records, so a global batch, and the order, depend on the number of processes, and a short shard must drop or pad
records. Here one sampler orders every record globally and the ``ShardOptions`` only choose each process's rows
within a global batch, which keeps the batches of the single-process run (and every record once per epoch).
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grain.python as grain
import numpy as np
import orbax.checkpoint as ocp
from array_record.python.array_record_module import ArrayRecordWriter

from mia_jax.runs import processes
from mia_jax.errors import UserError
from train.data import Batches, pack_stream

RECORDS = "sequences.array_record"
META = "sequences.json"
FORMAT = "int32 little-endian token ids, then np.packbits(loss mask)"
WRITER_OPTIONS = "group_size:1"
READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)  # steps read ahead of the device


def encode(tokens: np.ndarray, mask: np.ndarray) -> bytes:
    """One sequence as a record: int32 little-endian ids, then the packed mask bits."""
    return np.asarray(tokens, "<i4").tobytes() + np.packbits(np.asarray(mask, bool)).tobytes()


def decode(record: bytes, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32 tokens, bool mask) of a record written by ``encode``."""
    tokens = np.frombuffer(record, "<i4", seq_len).astype(np.int32)
    mask = np.unpackbits(np.frombuffer(record, np.uint8, offset=4 * seq_len), count=seq_len).astype(bool)
    return tokens, mask


@dataclass
class RecordData:
    """Packed sequences in an ArrayRecord file (the interface of ``train.data.PackedData`` less the arrays)."""
    path: Path  # the .array_record file
    n_sequences: int
    seq_len: int
    n_tokens: int
    separator: int
    sha256: str

    def digest(self) -> str:
        """``PackedData.digest`` of the same sequences (what the training fingerprint records)."""
        return self.sha256

    @property
    def source(self) -> grain.ArrayRecordDataSource:
        """grain's random-access reader of the file (opened once per process)."""
        if "_source" not in self.__dict__:
            self.__dict__["_source"] = grain.ArrayRecordDataSource(str(self.path))
            if len(self._source) != self.n_sequences:
                raise UserError(f"{self.path} holds {len(self._source)} records, its {META} says {self.n_sequences}; "
                                "delete the folder to write it again")
        return self._source

    def rows(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, mask) of the sequences ``idx`` (any shape; -1 = a dummy row: separators, fully masked); only those
        records are read."""
        flat = np.asarray(idx).reshape(-1)
        tokens = np.full((flat.size, self.seq_len), self.separator, np.int32)
        mask = np.zeros((flat.size, self.seq_len), bool)
        real = np.flatnonzero(flat >= 0)
        for r in real:  # one read each: ~20 us a record here, while __getitems__ costs ms in its thread pool
            tokens[r], mask[r] = decode(self.source[int(flat[r])], self.seq_len)
        return tokens.reshape(*np.shape(idx), self.seq_len), mask.reshape(*np.shape(idx), self.seq_len)

    def meta(self) -> dict:
        """The content of ``sequences.json``."""
        return {"format": FORMAT, **{k: v for k, v in dataclasses.asdict(self).items() if k != "path"}}


def open_records(folder: str | Path) -> RecordData | None:
    """The packed sequences in ``folder`` (``sequences.json`` + the file), None when there are none."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / META).read_text())
        fields = {f.name for f in dataclasses.fields(RecordData)} - {"path"}
        data = RecordData(folder / RECORDS, **{k: meta[k] for k in fields})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data if data.path.is_file() and meta.get("format") == FORMAT else None


def write_records(folder: str | Path, documents: Iterable[str], tokenizer, seq_len: int, separator: int) -> RecordData:
    """Pack ``documents`` (``train.data.pack_stream``) straight into ``folder/sequences.array_record`` (written to a
    temporary name and renamed, then ``sequences.json``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{RECORDS}.{_unique()}.tmp"
    writer = ArrayRecordWriter(str(tmp), WRITER_OPTIONS)
    try:
        info = pack_stream(documents, tokenizer, seq_len, separator, lambda t, m: writer.write(encode(t, m)))
        writer.close()
        os.replace(tmp, folder / RECORDS)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    data = RecordData(folder / RECORDS, info.n_sequences, seq_len, info.n_tokens, separator, info.sha256)
    meta_tmp = folder / f".{META}.{_unique()}.tmp"
    meta_tmp.write_text(json.dumps(data.meta(), indent=2) + "\n")
    os.replace(meta_tmp, folder / META)
    return data


def _unique() -> str:
    """A temporary name's part unique to this process (several hosts may write into one shared folder)."""
    return f"{socket.gethostname()}.{os.getpid()}"


def packed_records(folder: str | Path, documents: Iterable[str], tokenizer, seq_len: int, separator: int,
                   sha256: str | None = None) -> RecordData:
    """The packed sequences of ``documents`` in ``folder``: the existing file when its ``sequences.json`` says it holds
    this packing (``sha256``, when the caller knows it, else computed by packing without writing), else written.
    On several processes every process calls this: process 0 finds or writes the file, the others wait for it (its
    digest, broadcast) and then open it on a shared folder, or write their own copy where it is absent (one disk per
    host)."""
    main = processes.is_main_process()
    data = _packed_records(folder, documents, tokenizer, seq_len, separator, sha256) if main else None
    digest = processes.broadcast_json(data.sha256 if main else None)  # a barrier: process 0's file is complete
    return data if main else _packed_records(folder, documents, tokenizer, seq_len, separator, digest)


def _packed_records(folder: str | Path, documents, tokenizer, seq_len: int, separator: int,
                    sha256: str | None) -> RecordData:
    have = open_records(folder)
    if have is not None and (have.seq_len, have.separator) == (seq_len, separator):
        if sha256 is None:
            sha256 = pack_stream(documents, tokenizer, seq_len, separator).sha256
        if have.sha256 == sha256:
            return have
    data = write_records(folder, documents, tokenizer, seq_len, separator)
    if sha256 is not None and data.sha256 != sha256:
        raise RuntimeError(f"packing the same documents twice gave two digests ({sha256} then {data.sha256})")
    return data


# ----------------------------------------------------------------------------- per-process rows, the step iterator


def process_shard(rows: slice, micro: int) -> grain.ShardOptions:
    """The ``grain.ShardOptions`` of a process that holds the contiguous block ``rows`` of each micro-batch of
    ``micro`` rows (``placement.local_rows``): shard ``rows.start / len``, of ``micro / len``."""
    width = rows.stop - rows.start
    options = grain.ShardOptions(shard_index=rows.start // width, shard_count=micro // width)
    if shard_rows(options, micro) != rows:
        raise UserError(f"rows {rows.start}..{rows.stop} of a micro-batch of {micro} are not one of equal blocks")
    return options


def shard_rows(options: grain.ShardOptions, micro: int) -> slice:
    """The rows of each micro-batch that the process of ``options`` reads: the ``shard_index``-th of ``shard_count``
    equal contiguous blocks (grain's even split; the mesh check makes ``micro`` a multiple of the block count)."""
    if micro % options.shard_count:
        raise UserError(f"a micro-batch of {micro} rows cannot be split over {options.shard_count} processes")
    width = micro // options.shard_count
    return slice(options.shard_index * width, (options.shard_index + 1) * width)


def step_batch(batches: Batches, shard: grain.ShardOptions | None, step: int) -> dict:
    """What the step iterator yields for ``step``: the ``ids`` and ``mask`` [grad_accum, rows, seq_len] of the rows
    that ``shard`` reads of each micro-batch (``shard_rows``; all of them without one) and the sequence ``index`` of
    every row of the global batch (-1 = dummy)."""
    rows = None if shard is None else shard_rows(shard, batches.batch_size // batches.grad_accum)
    index = batches.indices(step)
    ids, mask = batches.gather(index, rows)
    return {"step": step, "ids": ids, "mask": mask, "index": index}


def step_iterator(batches: Batches, shard: grain.ShardOptions | None = None,
                  read_options: grain.ReadOptions = READ_OPTIONS):
    """A grain ``DatasetIterator`` over ``batches``' steps (``step_batch``: this process's ``shard`` of each), from
    step 0: ``set_state({"next_index": s})`` moves it to step s, ``get_state()`` is its position (saved with the
    checkpoint)."""
    steps = grain.MapDataset.range(batches.total_steps).map(partial(step_batch, batches, shard))
    return iter(steps.to_iter_dataset(read_options))


class DataHandler(grain.PyGrainCheckpointHandler):
    """grain's Orbax handler of an iterator's state (one ``process_I-of-N.json`` per process), restoring also when the
    number of processes changed: the step iterator's position is global, so every file holds the same state."""

    def restore(self, directory, item: Any = None, args: Any = None):
        """The iterator ``args.item`` (or ``item``) moved to the saved position."""
        item = item if item is not None else args.item
        try:
            return super().restore(directory, item=item)
        except ValueError:  # no file of this process: saved by another number of processes
            states = {json.dumps(json.loads(p.read_text()), sort_keys=True)
                      for p in sorted(Path(directory).glob("process_*-of-*.json"))}
            if len(states) != 1:
                raise ValueError(f"{directory}: {len(states)} different data positions, expected one") from None
            item.set_state(json.loads(states.pop()))
            return item


@ocp.args.register_with_handler(DataHandler, for_save=True)
@dataclass
class DataSave(ocp.args.CheckpointArgs):
    """Orbax args: save the iterator ``item``'s state."""
    item: Any


@ocp.args.register_with_handler(DataHandler, for_restore=True)
@dataclass
class DataRestore(ocp.args.CheckpointArgs):
    """Orbax args: restore the saved state into the iterator ``item``."""
    item: Any
