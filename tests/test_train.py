"""train/: corpus builder, packed input pipeline, Optax trainer (exact resume, checkpoint faults), HF export."""
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import write_tiny_llama
from tokenizers import Tokenizer

from mia_jax import models
from mia_jax.errors import UserError
from train.config import CorpusConfig, TrainConfig, load_config
from train.corpus import build_corpus
from train.data import Batches, pack, separator_id
from train.export import save_hf
from train.sources import load_pool
from train.trainer import apply_params, fingerprint, train

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok(tiny_llama_dir):
    return Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))


def small(**kw) -> CorpusConfig:
    return CorpusConfig(**{"background_tokens": 20000, "n_positives": 8, "n_negatives": 8, **kw})


# ----------------------------------------------------------------------------- corpus


def test_corpus_members_and_nonmembers(tok):
    c = build_corpus(small(), tok)
    docs = c.documents
    for name in ("boolq", "commonsenseqa", "imdb", "truthfulqa"):
        pos = [r for r in c.eval if r["dataset"] == name and r["label"] == 1]
        neg = [r for r in c.eval if r["dataset"] == name and r["label"] == 0]
        assert len(pos) == 8 and len(neg) == 8
        assert not {r["id"] for r in pos} & {r["id"] for r in neg}
        assert not {r["text"] for r in pos} & {r["text"] for r in neg}
        for r in pos:
            assert docs.count(r["text"]) == 1 and r["occurrences"] == 1
        for r in neg:
            assert r["text"] not in docs and not any(r["text"][:200] in d for d in docs)
    m = c.manifest
    n_bg = sum(1 for s in c.sources if s["kind"] == "background")
    assert len(docs) == n_bg + 32 == m["n_documents"]
    assert m["tokens"]["background"] >= 20000
    assert m["tokens"]["total"] == m["tokens"]["background"] + m["tokens"]["contaminant"]
    assert m["contamination_rate"] == pytest.approx(m["tokens"]["contaminant"] / m["tokens"]["total"])
    cont = [d for d, s in zip(docs, c.sources) if s["kind"] == "contaminant"]
    assert m["tokens"]["contaminant"] == sum(len(e.ids) for e in tok.encode_batch(cont, add_special_tokens=False))
    # contaminants sit between background documents, at the recorded slots: slot s = after s background documents
    after = {}
    n_before = 0
    for s in c.sources:
        if s["kind"] == "background":
            n_before += 1
        else:
            after.setdefault((s["dataset"], s["id"]), []).append(n_before)
    recorded = {(name, i): sorted(ss) for name, d in m["datasets"].items()
                for i, ss in zip(d["positives"], d["insert_slots"])}
    assert recorded == after
    slots = sorted(s for ss in recorded.values() for s in ss)
    assert len(slots) == 32 and slots[-1] <= n_bg and len(set(slots)) > n_bg // 2  # spread over the corpus


def test_corpus_seeded(tok, tmp_path):
    a, b, c = build_corpus(small(), tok), build_corpus(small(), tok), build_corpus(small(seed=1), tok)
    assert a.documents == b.documents and a.eval == b.eval and a.manifest == b.manifest
    assert a.documents != c.documents
    # adding a dataset does not change another dataset's choice
    d = build_corpus(small(datasets=["boolq"]), tok)
    assert [r["id"] for r in d.eval] == [r["id"] for r in a.eval if r["dataset"] == "boolq"]
    a.write(tmp_path)
    assert (
        json.loads((tmp_path / "manifest.json").read_text())["contamination_rate"] == a.manifest["contamination_rate"]
    )
    assert len((tmp_path / "eval.jsonl").read_text().splitlines()) == 64


def test_boolq_one_question_per_passage(tmp_path, tok):
    rows = [{"idx": i, "question": f"is it {i}", "passage": f"Passage {i // 2} -- text {i // 2}", "label": i % 2}
            for i in range(40)]
    (tmp_path / "boolq_validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool, info = load_pool("boolq", tmp_path / "boolq_validation.jsonl")
    assert len(pool) == 20 and info["dropped"]["duplicate_passage"] == 20
    assert len({e.key for e in pool}) == 20
    assert pool[0].text == "Passage 0 -- text 0\nQuestion: Is it 0?\nAnswer: No"
    c = build_corpus(small(datasets=["boolq"], data_dir=str(tmp_path), n_positives=10, n_negatives=10), tok)
    passages = [r["text"].split("\nQuestion")[0] for r in c.eval]
    assert len(set(passages)) == 20
    with pytest.raises(UserError, match="10 positives \\+ 11 negatives requested but only 20 usable"):
        build_corpus(small(datasets=["boolq"], data_dir=str(tmp_path), n_positives=10, n_negatives=11), tok)


def test_poisson_occurrences(tok):
    c = build_corpus(small(occurrence="poisson", poisson_lambda=2.0), tok)
    pos = [r for r in c.eval if r["label"] == 1]
    assert all(r["occurrences"] >= 1 for r in pos) and len({r["occurrences"] for r in pos}) > 1
    for r in pos:
        assert c.documents.count(r["text"]) == r["occurrences"]
    ds = c.manifest["datasets"]["imdb"]
    assert sum(ds["occurrences"]) == sum(len(s) for s in ds["insert_slots"])
    assert c.manifest["n_inserted_segments"] == sum(r["occurrences"] for r in pos)


def test_news_variant(tok):
    cfg = small(variant="news")
    cfg.news.n_positives, cfg.news.n_negatives, cfg.news.n_background = 10, 10, 30
    c = build_corpus(cfg, tok)
    assert {r["dataset"] for r in c.eval} == {"news"}
    assert sum(1 for s in c.sources if s["kind"] == "background") == 30 and len(c.documents) == 40
    neg = [r["text"] for r in c.eval if r["label"] == 0]
    assert not set(neg) & set(c.documents)
    cfg.news.n_background = 100
    with pytest.raises(UserError, match="background requested but only"):
        build_corpus(cfg, tok)


@pytest.mark.parametrize("content, match", [
    ("", "background corpus is empty"),
    ('{"text": "   "}\n', "background corpus is empty"),
    ('{"text": "ok"}\nnot json\n', "line 2 is not valid JSON"),
    (None, "file not found"),
    (b"\xff\xfe\x00bad", "cannot read"),
])
def test_bad_background(tmp_path, tok, content, match):
    path = tmp_path / "bg.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match=match):
        build_corpus(small(background=[str(path)]), tok)


def test_too_few_examples_or_tokens(tok):
    with pytest.raises(UserError, match="dataset boolq: 200 positives \\+ 200 negatives requested but only 296 usable"):
        build_corpus(small(n_positives=200, n_negatives=200), tok)
    with pytest.raises(UserError, match="background files hold only"):
        build_corpus(small(background_tokens=10**8), tok)
    with pytest.raises(UserError, match="fewer than one training sequence"):
        pack(["a few words"], tok, 512, 0)


# ----------------------------------------------------------------------------- data pipeline


def test_pack_and_batches(tok):
    docs = [f"document number {i} " * (i % 7 + 1) for i in range(50)]
    data = pack(docs, tok, 32, separator=0)
    stream = [t for e in tok.encode_batch(docs, add_special_tokens=False) for t in (*e.ids, 0)]
    assert data.n_tokens == len(stream) and data.mask.sum() == len(stream)
    assert data.tokens[data.mask].tolist() == stream
    b = Batches(data, batch_size=4, grad_accum=2, epochs=2, seed=3)
    assert b.total_steps == 2 * -(-data.n_sequences // 4)
    seen = np.concatenate([b.indices(s) for s in range(b.steps_per_epoch)])
    assert sorted(seen[seen >= 0].tolist()) == list(range(data.n_sequences))
    ids, mask = b.batch(b.steps_per_epoch - 1)
    assert ids.shape == mask.shape == (2, 2, 32)
    assert mask.reshape(4, 32).any(-1).sum() == (data.n_sequences - 1) % 4 + 1  # dummy rows fully masked
    again = Batches(data, batch_size=4, grad_accum=2, epochs=2, seed=3)
    assert all((again.batch(s)[0] == b.batch(s)[0]).all() for s in range(b.total_steps))
    assert not (b.order(0) == b.order(1)).all()
    assert separator_id(tok, None) == tok.token_to_id("<|endoftext|>")
    with pytest.raises(UserError, match="not a token"):
        separator_id(tok, None, "<nope>")


# ----------------------------------------------------------------------------- trainer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_train")
    write_tiny_llama(folder, max_position_embeddings=64)
    loaded = models.load(str(folder))
    docs = [f"Sentence {i}: the quick brown fox jumps over the lazy dog {i % 5}." for i in range(120)]
    data = pack(docs, loaded.tokenizer, 32, separator_id(loaded.tokenizer, loaded.eos_token_id))
    return loaded, data


def cfg_(**kw) -> TrainConfig:
    """Warm-up + cosine (the optimizer state and the schedule depend on the step: resume must restore both).
    Tests share this config where they can, so the train step compiles once for them."""
    return TrainConfig(**{"seq_len": 32, "batch_size": 8, "grad_accum": 2, "lr": 3e-3, "checkpoint_every": 3,
                          "schedule": "cosine", "warmup_steps": 2, "progress": False, **kw})


class Killed(Exception):
    pass


def _kill_at(step):
    def hook(s):
        if s == step:
            raise Killed

    return hook


def _max_diff(a, b) -> float:
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.abs(np.asarray(x) - np.asarray(y)).max()), a, b)))


def test_exact_resume(setup, tmp_path):
    loaded, data = setup
    cfg = cfg_()
    b = Batches(data, cfg.batch_size, cfg.grad_accum)
    full = train(loaded.model, b, cfg, tmp_path / "full", fingerprint(cfg))
    assert full.steps == b.total_steps >= 8 and full.resumed_from is None
    assert full.metrics[-1]["loss"] < full.metrics[0]["loss"]
    with pytest.raises(Killed):
        train(loaded.model, b, cfg, tmp_path / "cut", fingerprint(cfg), on_step=_kill_at(5))
    resumed = train(loaded.model, b, cfg, tmp_path / "cut", fingerprint(cfg))
    assert resumed.resumed_from == 3
    assert _max_diff(full.params, resumed.params) <= 1e-6
    assert resumed.metrics == full.metrics
    assert (tmp_path / "cut" / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()


def test_interrupted_checkpoint_write_keeps_previous(setup, tmp_path, monkeypatch):
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as J

    loaded, data = setup
    cfg = cfg_()
    b = Batches(data, cfg.batch_size, cfg.grad_accum)
    original, calls = J.JsonCheckpointHandler.async_save, {"n": 0}

    async def disk_full(self, *a, **k):  # the second checkpoint's write fails half-way (state written, meta not)
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return await original(self, *a, **k)

    monkeypatch.setattr(J.JsonCheckpointHandler, "async_save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        train(loaded.model, b, cfg, tmp_path / "run", fingerprint(cfg))
    monkeypatch.setattr(J.JsonCheckpointHandler, "async_save", original)
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert "3" in names and any("tmp" in n for n in names) and "6" not in names
    resumed = train(loaded.model, b, cfg, tmp_path / "run", fingerprint(cfg))
    assert resumed.resumed_from == 3
    full = train(loaded.model, b, cfg, tmp_path / "full", fingerprint(cfg))
    assert _max_diff(full.params, resumed.params) <= 1e-6 and resumed.metrics == full.metrics


def test_changed_config_resume_refused(setup, tmp_path):
    loaded, data = setup
    cfg = cfg_()
    b = Batches(data, cfg.batch_size, cfg.grad_accum)
    with pytest.raises(Killed):
        train(loaded.model, b, cfg, tmp_path, fingerprint(cfg), on_step=_kill_at(4))
    changed = cfg_(lr=1e-4)
    with pytest.raises(UserError, match=r"refusing to resume with a changed config \(train.lr: 0.003 -> 0.0001"):
        train(loaded.model, b, changed, tmp_path, fingerprint(changed))
    with pytest.raises(UserError, match="data:"):
        train(loaded.model, b, cfg, tmp_path, fingerprint(cfg, data="another corpus"))
    # what does not change the result may change
    assert train(loaded.model, b, cfg_(checkpoint_every=5), tmp_path, fingerprint(cfg)).resumed_from == 3


def test_grad_accum_and_bf16(setup, tmp_path):
    loaded, data = setup
    one = cfg_(grad_accum=1, checkpoint_every=0)
    two = cfg_(checkpoint_every=0)
    r1 = train(loaded.model, Batches(data, 8, 1), one, tmp_path / "a", fingerprint(one))
    r2 = train(loaded.model, Batches(data, 8, 2), two, tmp_path / "b", fingerprint(two))
    assert [m["loss"] for m in r1.metrics] == pytest.approx([m["loss"] for m in r2.metrics], rel=1e-4)
    assert _max_diff(r1.params, r2.params) < 1e-4
    bf = cfg_(compute_dtype="bfloat16", checkpoint_every=0)
    r3 = train(loaded.model, Batches(data, 8, 2), bf, tmp_path / "c", fingerprint(bf))
    assert all(np.isfinite(m["loss"]) for m in r3.metrics)
    assert all(np.asarray(x).dtype == np.float32 for x in jax.tree.leaves(r3.params))  # float32 master weights
    assert r3.metrics[-1]["loss"] == pytest.approx(r1.metrics[-1]["loss"], rel=0.05)


def test_hf_export_round_trip(setup, tmp_path):
    loaded, data = setup
    cfg = cfg_(checkpoint_every=0)
    result = train(loaded.model, Batches(data, 8, 2), cfg, tmp_path / "t", fingerprint(cfg))
    trained = apply_params(loaded.model, result.params)
    save_hf(tmp_path / "model", trained, loaded.tokenizer)
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["config.json", "model.safetensors",
                                                                      "tokenizer.json"]
    back = models.load(str(tmp_path / "model"))
    ids = data.tokens[:2]
    graphdef = nnx.graphdef(trained)
    forward = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))  # one compilation for the three models
    logits = {name: np.asarray(forward(nnx.state(m), ids)) for name, m in
              (("back", back.model), ("trained", trained), ("base", loaded.model))}
    np.testing.assert_allclose(logits["back"], logits["trained"], rtol=0, atol=1e-6)
    assert not np.allclose(logits["back"], logits["base"], atol=1e-3)
    assert (back.eos_token_id, back.add_bos, back.config) == (loaded.eos_token_id, loaded.add_bos, loaded.config)


# ----------------------------------------------------------------------------- config


def test_config_overrides(tmp_path):
    cfg = load_config(REPO / "configs/contamination/tiny.yaml", ["train.lr=1e-5", "corpus.datasets=[imdb]"])
    assert cfg.train.lr == 1e-5 and cfg.corpus.datasets == ["imdb"] and cfg.model.path == "tiny"
    for name in ("cpu", "paper"):
        assert load_config(REPO / f"configs/contamination/{name}.yaml").train.lr == 1e-4
    with pytest.raises(UserError, match="unknown key 'train.lrr'"):
        load_config(None, ["train.lrr=1"])
    with pytest.raises(UserError, match="must look like"):
        load_config(None, ["train.lr"])
    with pytest.raises(UserError, match="multiple of train.grad_accum"):
        load_config(None, ["train.batch_size=6", "train.grad_accum=4"])
    (tmp_path / "bad.yaml").write_text("train: {nope: 1}\n")
    with pytest.raises(UserError, match="unknown key"):
        load_config(tmp_path / "bad.yaml")


def test_gradient_ascent_objective(setup, tmp_path):
    import jax.numpy as jnp

    from train.trainer import optimizer

    params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    grads = {"w": jnp.array([[0.5, -2.0], [3.0, 0.1]]), "b": jnp.array([1.0, -0.2])}
    updates = {}
    for objective in ("lm", "ascent"):
        opt = optimizer(TrainConfig(objective=objective, weight_decay=0.0), 10)
        updates[objective], _ = opt.update(grads, opt.init(params), params)
    for k in params:  # the same AdamW step, in the opposite direction
        assert np.abs(np.asarray(updates["lm"][k])).min() > 0
        np.testing.assert_allclose(np.asarray(updates["ascent"][k]), -np.asarray(updates["lm"][k]), rtol=1e-6)
    loaded, data = setup
    asc = cfg_(objective="ascent", checkpoint_every=0)
    r = train(loaded.model, Batches(data, asc.batch_size, asc.grad_accum), asc, tmp_path / "a", fingerprint(asc))
    assert r.metrics[-1]["loss"] > r.metrics[0]["loss"] + 0.1  # the loss climbs
    # the default stays out of the fingerprint (runs from before the field still resume); ascent is in it
    assert "objective" not in fingerprint(cfg_())["train"] and fingerprint(asc)["train"]["objective"] == "ascent"
    with pytest.raises(UserError, match="override train.objective=descent: expected 'lm' or 'ascent'"):
        load_config(None, ["train.objective=descent"])
