from setuptools import find_packages, setup

setup(
    name="mia-jax",
    version="0.2.0",
    description="Pretraining-data detection (membership inference) for large language models in JAX/Flax",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["mia_jax", "mia_jax.*", "train", "train.*"]),
    package_data={"mia_jax.data": ["files/*.jsonl", "files/*.md"],
                  "train": ["data/*.jsonl", "data/*.md", "data/downstream/*"]},
    install_requires=[
        "jax[cpu]==0.10.2",
        "jaxlib==0.10.2",
        "flax==0.12.8",
        "optax==0.2.8",
        "orbax-checkpoint==0.12.8",
        "numpy==2.4.6",
        "scikit-learn==1.9.1",
        "scipy==1.17.1",
        "safetensors==0.8.0",
        "tokenizers==0.23.3",
        "gguf==0.19.0",
        "pyyaml==6.0.3",
        "pydantic==2.14.4",  # the contamination config (train/config.py)
        "tqdm==4.70.1",
        "matplotlib==3.11.2",
        "rouge-score==0.1.2",
        "nltk==3.10.4",  # the n-gram coverage attack's word tokenizer (casual_tokenize), as its authors
        # corpus-scale data: Parquet by row groups, TFDS datasets (read without TensorFlow), grain over ArrayRecord
        "pyarrow==26.0.1",
        "tensorflow-datasets==4.9.10",
        "grain==0.2.18",
        "array-record==0.8.6",
        # Tag&Tab's keywords: English word frequencies and sentence boundaries, offline (data inside the wheels)
        "wordfreq==3.1.1",
        "pysbd==0.3.4",
    ],
    extras_require={
        # torch is the CPU build (pip install torch==2.13.0 finds the local CPU wheel here)
        # pytest-xdist: `make test` runs the suite in two worker processes (tests grouped by file)
        "test": ["pytest==9.2.0", "pytest-xdist==3.8.0", "hypothesis==6.170.15", "torch==2.13.0",
                 "transformers==5.23.0", "ruff==0.17.6"],
    },
    entry_points={"console_scripts": ["mia-jax=mia_jax.cli:console"]},
)
