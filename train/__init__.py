"""Continued pretraining (Optax) and the controlled contamination experiments of Shi et al. 2023, section 6.

    config.py        the experiment config (pydantic dataclasses, Literal choices, checks); config_parse.py reads
                     the YAML file and key=value overrides and says pydantic's errors in one line
    sources.py       the data files: downstream datasets and their templates, background text, normalisation
    overlap.py       13-gram isolation of the candidates and the corpus's overlap check
    split.py         members / non-members (stratified, length-matched) and occurrence counts
    corpus.py        the contaminated corpus (seeded insertion, occurrence / news variants, manifest)
    data.py          packed, seeded input pipeline (documents separated by EOS, fixed-length sequences)
    trainer.py       AdamW trainer: accumulation, clipping, bf16 compute, Orbax checkpoints, exact resume
    speed.py         model FLOPs of a step, and the trainer's per-step speed.jsonl (tokens/s, MFU)
    export.py        save a model of any family in the Hugging Face layout (from its weight spec)
    tiny.py          the randomly initialised `tiny` base model of the CI config
    experiment.py    one run: corpus -> base scores -> training -> trained scores -> metrics
    records.py       a run's per-example scores (examples.jsonl.gz), from which every table is rebuilt
    cells.py         names, cells and file bytes of the tables and figures
    run_tables.py    Table 3 / 7 and roc.png of one run; sweep_tables.py: Table 4 and Figure 5a-c of a sweep
    claims.py        the paper's claims, each a paired bootstrap
    ablations.py     the one registry of the ablations (lr, size, news, occurrence): plan, table, claims
    loading.py       reading and checking a --from folder
    tables.py        python -m train.tables --from DIR: every table and figure rebuilt
    study.py         python -m train.study: the study's report
    contaminate.py   the entry point: python train/contaminate.py --config configs/contamination/tiny.yaml --out DIR
"""
