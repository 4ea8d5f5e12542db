"""Workflows built on scoring: windowed (online) detection; the copyrighted-book and unlearning audits."""


def model_options(p, runs: str) -> None:
    """The options every audit command shares: how its models are loaded and its scoring runs kept."""
    from mia_jax import entry

    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="parameter dtype")
    p.add_argument("--batch-size", type=entry.positive_int, default=8)
    p.add_argument("--chunk-size", type=entry.positive_int, default=8192,
                   help="vocabulary chunk of the statistics kernel")
    p.add_argument("--allow-download", action="store_true",
                   help="let a model that is not a local path be fetched from the Hugging Face Hub")
    p.add_argument("--overwrite", action="store_true",
                   help=f"empty --out first (even a folder of another run) and rescore {runs} afresh")
    p.add_argument("--no-progress", action="store_true")
