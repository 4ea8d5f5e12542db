"""Datasets: labeled or unlabeled texts from JSONL / CSV / TSV / Parquet files, TFDS and the bundled WikiMIA.

The face of the package; the code is in its modules: ``dataset`` (the ``Dataset`` record and the label rules),
``readers`` (files, WikiMIA, the ``--data`` argument), ``tfds_source`` (TFDS datasets, read lazily), ``stream``
(reading a file window by window), ``sample`` (a seeded sample balanced by label), ``known`` (the benchmarks'
files: MIMIR and the others in ``../shared/data``), ``builders`` (``mia-jax datasets build``), ``corpora`` (the
frequency-table corpora).
"""
from mia_jax.data.dataset import TEXT_FIELDS, TFDS_DATASETS, Dataset, default_text_field, label_of
from mia_jax.data.readers import (FILES, WIKIMIA_LENGTHS, check_encoding, parquet_rows, read_rows, DATA_SUFFIXES,
                                  check_data_file, read_csv, record, load_records, load, duplicate_report, wikimia,
                                  data_input)

__all__ = ["TEXT_FIELDS", "TFDS_DATASETS", "Dataset", "default_text_field", "label_of", "FILES", "WIKIMIA_LENGTHS",
    "check_encoding", "parquet_rows", "read_rows", "DATA_SUFFIXES", "check_data_file", "read_csv", "record",
    "load_records", "load", "duplicate_report", "wikimia", "data_input"]
