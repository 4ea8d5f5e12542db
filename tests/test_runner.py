"""The runner end to end on a tiny random Llama: scores equal per-example float64 NumPy from full logits."""
import json

import jax.numpy as jnp
import numpy as np
import pytest
from reference import ref_token_arrays, reference_scores

from mia_jax import batching, models
from mia_jax.engine import runner, score_step
from mia_jax.engine.records import Sink
from mia_jax.data import wikimia
from mia_jax.errors import UserError

METHODS = ["loss", "ppl", "zlib", "min_k@0.2", "max_k@0.2", "min_k_pp@0.2", "entropy", "rank"]


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


def per_example_reference(loaded, text):
    """One text, one forward pass, full float64 log-softmax: the published approach."""
    ids = loaded.tokenizer.encode(text).ids[: loaded.max_length]
    logits = np.asarray(loaded.model(jnp.asarray([ids], jnp.int32)), np.float64)[0]
    arrays = ref_token_arrays(logits[:-1], np.asarray(ids[1:]), vocab_size=batching.real_vocab_size(loaded))
    return reference_scores(*arrays, text, 0.2)


@pytest.mark.parametrize("batch_size", [1, 5])
def test_scores_equal_per_example_numpy(tiny, tmp_path, batch_size):
    texts = wikimia(32).texts[:12] + ["short"]
    out = tmp_path / "results.jsonl"
    records = runner.score_texts(tiny, texts, METHODS, batch_size=batch_size, chunk_size=100, out_path=out,
                                 progress=False)
    assert [json.loads(line) for line in out.read_text().splitlines()] == records
    assert [r["index"] for r in records] == list(range(len(texts)))
    for text, rec in zip(texts, records):
        want = per_example_reference(tiny, text)
        for m in METHODS:
            np.testing.assert_allclose(rec["scores"][m], want[m], rtol=1e-4, err_msg=m)


def test_padding_rows_of_the_head_are_excluded(tiny):
    assert batching.real_vocab_size(tiny) == tiny.tokenizer.get_vocab_size() < tiny.config.vocab_size


def test_skips_and_truncation_are_recorded(tiny):
    long_text = " ".join(wikimia(256).texts[:3])
    texts = ["", "   \n", "a", long_text]
    recs = runner.score_texts(tiny, texts, ["loss", "min_k@0.2"], labels=[1, 0, 1, 0], progress=False)
    assert "empty" in recs[0]["skip_reason"] and "empty" in recs[1]["skip_reason"]
    assert "fewer than 2 tokens" in recs[2]["skip_reason"]
    assert all(r["scores"]["loss"] is None for r in recs[:3])
    assert recs[3]["truncated"] is True and recs[3]["n_tokens"] == tiny.max_length
    assert np.isfinite(recs[3]["scores"]["loss"]) and "skip_reason" not in recs[3]
    assert [r["label"] for r in recs] == [1, 0, 1, 0]


def test_one_compilation_per_shape(tiny):
    fn = score_step.make_stats_fn(tiny)
    from flax import nnx
    _, state = nnx.split(tiny.model)
    for t in (16, 16, 32, 16, 32):
        fn(state, jnp.zeros((2, t), jnp.int32))
    assert fn._cache_size() == 2


def test_killed_and_resumed_run_is_byte_identical(tiny, tmp_path, monkeypatch):
    texts = wikimia(32).texts[:30] + [""]
    labels = list(range(2)) * 15 + [1]
    kw = dict(labels=labels, tokens_per_batch=128, progress=False)
    full = tmp_path / "full.jsonl"
    runner.score_texts(tiny, texts, METHODS, out_path=full, **kw)
    steps = batching.pack(batching.scoring_lengths(batching.encode(tiny, texts[:30])), 128, tiny.max_length)
    assert len(steps) >= 6

    part = tmp_path / "part.jsonl"
    real_add, calls = Sink.add, []

    def dying_add(*a, **k):  # the process dies while computing the 4th step, before its records are saved
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_add(*a, **k)

    monkeypatch.setattr(Sink, "add", dying_add)
    with pytest.raises(KeyboardInterrupt):
        runner.score_texts(tiny, texts, METHODS, out_path=part, **kw)
    monkeypatch.setattr(Sink, "add", real_add)
    lines = part.read_text().splitlines()
    assert len(lines) == 1 + sum(len(s.items) for s in steps[:3])  # the skipped text and three finished steps
    with open(part, "a") as f:
        f.write(lines[-1][:25])  # and a torn write, as a kill mid-line leaves it

    computed = []
    monkeypatch.setattr(Sink, "add", lambda *a, **k: computed.append(1) or real_add(*a, **k))
    report = {}
    runner.score_texts(tiny, texts, METHODS, out_path=part, resume=True, report=report, **kw)
    assert len(computed) == report["batches_computed"] == len(steps) - 3  # only the unfinished steps ran again
    assert report["reused"] == sum(len(s.items) for s in steps[:3])
    assert part.read_bytes() == full.read_bytes()


def test_resume_refuses_a_file_of_another_run(tiny, tmp_path):
    out = tmp_path / "r.jsonl"
    runner.score_texts(tiny, ["one two three", "four five six"], ["loss"], out_path=out, progress=False)
    with pytest.raises(UserError, match="does not belong to this run"):
        runner.score_texts(tiny, ["one two three", "four five six"], ["zlib"], out_path=out, resume=True,
                           progress=False)


def test_a_one_device_mesh_gives_the_same_records(tiny_llama_dir, tmp_path):
    """The sharded path (placed parameters, batch-sharded ids, vocabulary-sharded statistics) on the one
    device of this process; 8 devices and 2 processes are in test_sharding.py."""
    import jax

    from mia_jax.engine import sharding

    loaded = models.load(str(tiny_llama_dir))  # its own copy: score_texts places the parameters in place
    texts = wikimia(32).texts[:7] + [""]
    want = runner.score_texts(loaded, texts, METHODS, batch_size=3, chunk_size=100, progress=False)
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    got = runner.score_texts(loaded, texts, METHODS, batch_size=3, chunk_size=100, progress=False, mesh=mesh,
                             out_path=tmp_path / "r.jsonl")
    assert [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()] == got
    for a, b in zip(want, got):
        assert {k: v for k, v in a.items() if k != "scores"} == {k: v for k, v in b.items() if k != "scores"}
        for m in METHODS:
            if a["scores"][m] is None:
                assert b["scores"][m] is None
            else:
                np.testing.assert_allclose(b["scores"][m], a["scores"][m], rtol=1e-5, err_msg=m)


def test_cpu_runs_two_steps_at_once_and_writes_their_records_in_order(tiny, tmp_path, monkeypatch):
    """On the CPU a pass keeps ``inflight.CPU_STEPS`` (2) steps running at once, each on a worker thread: counted by
    wrapping the jitted step (at most one at a time without the workers); the records and the file are those of
    the one-at-a-time run, in the texts' order."""
    import threading
    import time

    from mia_jax.engine import inflight

    texts = wikimia(32).texts[:40]
    real, lock = runner.shared_score_step, threading.Lock()

    def run(workers):
        monkeypatch.setattr(inflight, "CPU_STEPS", workers)
        seen = {"active": 0, "most": 0, "threads": set()}

        def counting(*args, **kwargs):
            step = real(*args, **kwargs)

            def run_step(state, batch):
                with lock:
                    seen["active"] += 1
                    seen["most"] = max(seen["most"], seen["active"])
                    seen["threads"].add(threading.current_thread().name)
                time.sleep(0.3)  # long enough for the other worker to enter
                out = step(state, batch)
                with lock:
                    seen["active"] -= 1
                return out
            return run_step

        monkeypatch.setattr(runner, "shared_score_step", counting)
        out = tmp_path / f"w{workers}.jsonl"
        report = {}
        recs = runner.score_texts(tiny, texts, METHODS, tokens_per_batch=256, out_path=out, report=report,
                                  progress=False)
        return recs, out.read_bytes(), seen, report

    together, file2, seen2, report2 = run(2)
    alone, file0, seen0, _ = run(0)
    assert report2["batches_computed"] >= 4
    assert seen2["most"] == 2 and all(t.startswith("score-step") for t in seen2["threads"])
    assert seen0["most"] == 1 and seen0["threads"] == {"MainThread"}
    assert [r["index"] for r in together] == list(range(len(texts)))
    assert together == alone and file2 == file0


def test_ctrl_c_while_a_worker_step_runs_is_a_keyboard_interrupt(monkeypatch):
    """Waiting for a worker's step never enters ``Condition.wait`` (a KeyboardInterrupt raised there by Ctrl-C's
    handler, after the wait released its lock, ended as "RuntimeError: cannot release un-acquired lock" and a
    traceback): with ``Condition.wait`` made to fail, the wait still returns the step's value; and a SIGINT sent
    while it waits is the KeyboardInterrupt the command turns into one line and exit 130."""
    import os
    import signal
    import threading
    import time

    from mia_jax.engine.inflight import InFlight
    from mia_jax.runs import entry

    def no_wait(timeout=None):
        raise AssertionError("Condition.wait was entered")

    with InFlight(1) as flight:
        pending = flight.launch(lambda: (time.sleep(0.2), jnp.ones(2))[1])
        monkeypatch.setattr(pending._condition, "wait", no_wait)  # the future's own condition (CPython's Future)
        assert not pending.done() and InFlight.result(pending).tolist() == [1, 1]
    with entry.remember_sigint(), InFlight(1) as flight:
        pending = flight.launch(lambda: (time.sleep(1.0), jnp.ones(2))[1])
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            InFlight.result(pending)
