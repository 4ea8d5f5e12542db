"""train/finetune.py: continued pretraining on your own texts (the audits' recipe), gradient ascent from its result,
a finished run not trained again, bad overrides refused cleanly."""
import json

from mia_jax import models
from train import finetune


def _texts(path):
    rows = [{"text": f"Chapter {i}. The lighthouse keeper counted {i % 7} ships before the storm of year {i}."}
            for i in range(60)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_finetune_then_ascent(tiny_llama_dir, tmp_path, capsys):
    _texts(tmp_path / "t.jsonl")
    common = ["--texts", str(tmp_path / "t.jsonl"), "--no-progress"]
    over = ["train.seq_len=32", "train.batch_size=8", "train.lr=3e-3", "train.epochs=2", "train.checkpoint_every=0"]
    assert finetune.main(["--model", str(tiny_llama_dir), "--out", str(tmp_path / "lm"), *common, *over]) == 0
    lm = json.loads((tmp_path / "lm" / "train.json").read_text())
    assert lm["final_loss"] < lm["first_loss"] - 0.5 and lm["n_texts"] == 60 and lm["train"]["objective"] == "lm"
    assert models.load(str(tmp_path / "lm" / "model")).model is not None
    # the same command again: the finished model is reused, not trained again
    mtime = (tmp_path / "lm" / "model" / "model.safetensors").stat().st_mtime_ns
    assert finetune.main(["--model", str(tiny_llama_dir), "--out", str(tmp_path / "lm"), *common, *over]) == 0
    assert (tmp_path / "lm" / "model" / "model.safetensors").stat().st_mtime_ns == mtime
    assert json.loads((tmp_path / "lm" / "train.json").read_text())["final_loss"] == lm["final_loss"]
    # gradient ascent on the same texts from the trained model: the loss climbs back
    up = ["train.objective=ascent", "train.lr=1e-3", *over[:2], "train.epochs=1", "train.checkpoint_every=0"]
    assert finetune.main(["--model", str(tmp_path / "lm" / "model"), "--out", str(tmp_path / "up"), *common,
                          *up]) == 0
    asc = json.loads((tmp_path / "up" / "train.json").read_text())
    assert asc["final_loss"] > asc["first_loss"] + 0.2
    capsys.readouterr()
    # an override that would do nothing here: exit 2, one line, the folder untouched
    before = sorted(p.name for p in (tmp_path / "lm").iterdir())
    assert finetune.main(["--model", str(tiny_llama_dir), "--out", str(tmp_path / "lm"), *common,
                          "corpus.n_positives=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only train.* and model.dtype overrides" in err and "Traceback" not in err
    assert sorted(p.name for p in (tmp_path / "lm").iterdir()) == before


def test_finetune_refusals_before_writing(tiny_llama_dir, tmp_path, capsys, monkeypatch):
    """A seq_len beyond the model's context (64 tokens), a bad override value, a missing model or texts file, a bad
    memory setting: one line, exit 2, the --out folder not made."""
    from helpers import assert_clean_error

    _texts(tmp_path / "t.jsonl")
    out = tmp_path / "out"
    common = ["--texts", str(tmp_path / "t.jsonl"), "--out", str(out), "--no-progress"]
    for args, needle in ((["--model", str(tiny_llama_dir), "train.seq_len=4096"], "exceeds the context"),
                         (["--model", str(tiny_llama_dir), "train.lr=abc"], "expected a float"),
                         (["--model", str(tiny_llama_dir), "train.steps=-1"], "unknown key 'train.steps'"),
                         (["--model", str(tiny_llama_dir), "train.epochs=0"], "train.epochs must be at least 1"),
                         (["--model", str(tmp_path / "nope")], "no such local path")):
        assert_clean_error(finetune.main([*args, *common]), capsys.readouterr().err, needle)
        assert not out.exists()
    assert_clean_error(finetune.main(["--model", str(tiny_llama_dir), "--texts", str(tmp_path / "none.jsonl"),
                                      "--out", str(out)]), capsys.readouterr().err, "no such file")
    monkeypatch.setenv("MIA_JAX_DEVICE_MEMORY_GIB", "abc")
    assert_clean_error(finetune.main(["--model", str(tiny_llama_dir), *common]), capsys.readouterr().err,
                       "MIA_JAX_DEVICE_MEMORY_GIB")
    assert not out.exists()
