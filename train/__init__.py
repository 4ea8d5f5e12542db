"""Continued pretraining (Optax) and the controlled contamination experiments of Shi et al. 2023, section 6.

    corpus.py      the contaminated corpus (templates, seeded insertion, occurrence / news variants, manifest)
    data.py        packed, seeded input pipeline (documents separated by EOS, fixed-length sequences)
    trainer.py     AdamW trainer: accumulation, clipping, bf16 compute, Orbax checkpoints, exact resume
    export.py      save a model of any family in the Hugging Face layout (from its weight spec)
    tiny.py        the randomly initialised `tiny` base model of the CI config
    experiment.py  one run: corpus -> base scores -> training -> trained scores -> metrics
    tables.py      Table 3 / 4 / 7 and Figure 5a-c (markdown, CSV, PNG)
    contaminate.py the entry point: python train/contaminate.py --config configs/contamination/tiny.yaml --out DIR
"""
