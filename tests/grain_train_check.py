"""Helper of test_grain_data.py, run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=N set
before JAX starts: ``python -m train.finetune``'s run (``train.finetune.finetune``) killed with SIGKILL right after
a step (a real kill: no cleanup, no final checkpoint).

    python tests/grain_train_check.py MODEL TEXTS OUT KILL_AT OVERRIDE...
"""
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(model, texts, out, kill_at, *overrides):
    from mia_jax.data import load_records
    from train.finetune import finetune

    def on_step(step):
        if step == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)

    finetune(model, list(load_records(texts, "text", None).texts), out, overrides, progress=False, on_step=on_step)
    raise SystemExit(f"not killed: the run has fewer than {kill_at} steps")


if __name__ == "__main__":
    main(*sys.argv[1:])
