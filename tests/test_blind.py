"""The model-free blind baseline: out-of-fold, seeded, and it finds WikiMIA's distribution shift."""
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import ENV
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline

from mia_jax.evaluation.blind import WARN_AUROC, blind_bow_scores, warning
from mia_jax.data import wikimia
from mia_jax.errors import UserError
from mia_jax.evaluation.metrics import auroc


def test_wikimia32_members_are_separable_without_any_model():
    ds = wikimia(32)
    scores = blind_bow_scores(ds.texts, ds.labels, seed=0)
    assert scores.shape == (776,)
    a = auroc(ds.labels, scores)
    assert a == pytest.approx(roc_auc_score(ds.labels, scores.astype(np.float64)), abs=1e-12)
    assert a > 0.9  # Das et al. 2024 report ~0.99 for a bag-of-words on WikiMIA
    np.testing.assert_array_equal(scores, blind_bow_scores(ds.texts, ds.labels, seed=0))
    assert "WARNING" in warning(auroc(ds.labels, scores))


def test_scores_are_out_of_fold():
    """Each text carries a unique word (and otherwise the same words): a model that had seen a text would
    recognise its label from that word (in-sample AUROC 1), but a fold model never saw the word, so every text
    of a fold gets the same member probability: 0.5, the folds being balanced (stratified, 30 members of 60)."""
    texts = [f"uniqueword{i} the same shared words" for i in range(60)]
    labels = np.r_[np.ones(30, int), np.zeros(30, int)]
    scores = blind_bow_scores(texts, labels, seed=0)
    np.testing.assert_allclose(scores, 0.5, atol=1e-4)
    assert auroc(labels, scores) == 0.5  # constant within each fold, and each fold has 6 of each class
    in_sample = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
                              LogisticRegression(C=10.0, max_iter=2000)).fit(texts, labels)
    assert auroc(labels, in_sample.predict_proba(texts)[:, 1]) == 1.0  # what scoring in-sample would give


def test_no_signal_when_labels_are_random():
    ds = wikimia(32)
    labels = np.random.default_rng(0).permutation(ds.labels)
    a = auroc(labels, blind_bow_scores(ds.texts, labels, seed=0))
    assert abs(a - 0.5) < 0.1
    assert a <= WARN_AUROC and warning(a) is None


def test_too_few_examples():
    with pytest.raises(UserError, match="at least 5 members"):
        blind_bow_scores(["a", "b", "c", "d"], [1, 0, 1, 0])


def test_groups_keep_each_texts_windows_in_one_fold_and_stop_the_leak():
    """40 documents of 3 windows each; every window of a document carries the document's own word, and the label is
    the document's. Plain k-fold spreads a document's windows over folds (the fold model saw its word: AUROC near 1,
    a leak); grouped k-fold keeps them in one fold (the word is unseen: every window scores the same, AUROC 0.5)."""
    from mia_jax.evaluation.blind import assign_folds

    groups = np.repeat(np.arange(40), 3)
    labels = (groups % 2).astype(int)
    texts = [f"doc{g} shared words here" for g in groups]
    folds = assign_folds(labels, seed=0, groups=groups)
    assert sorted(set(folds.tolist())) == [0, 1, 2, 3, 4]
    for g in range(40):
        assert len(set(folds[groups == g].tolist())) == 1  # all windows of a text in one fold
    for k in range(5):
        assert set(labels[folds == k].tolist()) == {0, 1}  # stratified: both classes in each fold
    np.testing.assert_array_equal(folds, assign_folds(labels, seed=0, groups=groups))
    plain = assign_folds(labels, seed=0)
    assert any(len(set(plain[groups == g].tolist())) > 1 for g in range(40))  # what grouping prevents
    assert auroc(labels, blind_bow_scores(texts, labels, seed=0)) > 0.9  # the leak
    grouped = blind_bow_scores(texts, labels, seed=0, groups=groups)
    assert auroc(labels, grouped) < 0.6 and np.ptp(grouped[folds == 0]) < 1e-9


def test_too_few_groups():
    texts, labels = [f"w{i}" for i in range(12)], [0, 1] * 6
    with pytest.raises(UserError, match="at least 5 groups"):
        blind_bow_scores(texts, labels, groups=[i % 4 for i in range(12)])
    with pytest.raises(UserError, match="members are in 2, non-members in 5"):  # 6 groups, members in only 2
        blind_bow_scores(texts, labels, groups=[0, 1, 2, 1, 3, 5, 4, 1, 5, 5, 0, 1])


def test_the_child_process_gives_the_very_scores_of_this_process():
    """``Child`` (the eval's baseline in a process of its own) returns the same float64s as ``blind_bow_scores``
    here (the JSON between them writes floats by repr), and its UserError as this process would raise it."""
    from mia_jax.evaluation.blind import Child

    ds = wikimia(32)
    texts, labels = ds.texts[:300], ds.labels[:300]
    np.testing.assert_array_equal(Child(texts, labels, seed=3).scores(), blind_bow_scores(texts, labels, seed=3))
    with pytest.raises(UserError, match="at least 5 members"):
        Child(["a", "b", "c", "d"], [1, 0, 1, 0]).scores()


def test_the_child_process_is_killed_when_the_main_thread_ends_first():
    """The eval's main thread ends (an error, a Ctrl-C) while the child still works: the thread that waits for the
    child kills it, and the eval exits without waiting for the child's work to finish."""
    code = ("import subprocess, sys, threading\n"
            "import mia_jax.evaluation.blind as b\n"
            "real = subprocess.Popen\n"
            "def popen(cmd, **kw):  # the child: 300 s of sleep instead of the baseline\n"
            "    p = real([sys.executable, '-c', 'import time; time.sleep(300)'], **kw)\n"
            "    print(p.pid, flush=True)\n"
            "    return p\n"
            "subprocess.Popen = popen\n"
            "child = b.Child(['x'], [1])\n"
            "threading.Thread(target=child.scores).start()\n"
            "raise SystemExit(3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 3, done.stderr
    pid = int(done.stdout.split()[0])
    with pytest.raises(ProcessLookupError):  # killed and reaped by the waiting thread, not left to run
        os.kill(pid, 0)
    assert "the eval ended before the blind baseline's process" in done.stderr  # the thread's exception


def _stalled_popen(real):
    """A ``subprocess.Popen`` whose process sleeps for 300 s instead of computing the baseline."""
    def popen(cmd, **kw):
        return real([sys.executable, "-c", "import time; time.sleep(300)"], **kw)
    return popen


def test_the_child_gets_an_input_far_larger_than_a_pipe_while_the_main_thread_holds_the_lock():
    """The eval's case that hung (issue 44): an input of megabytes (a pipe holds 64 KiB; the old parent sent it in
    slices of 0.2 s and, once one timed out, never sent the rest) while the main thread runs pure Python, holding the
    interpreter lock. The waiting thread ends with the very scores of this process, within a bound."""
    import threading
    import time

    from mia_jax.evaluation.blind import Child

    ds = wikimia(32)
    texts = [" ".join([t] * 60) for t in ds.texts[:300]]  # ~3.6 MB of JSON
    labels = ds.labels[:300]
    assert sum(map(len, texts)) > 50 * 65536
    child = Child(texts, labels, seed=1)
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("scores", child.scores()), daemon=True)
    waiter.start()
    deadline, spins = time.monotonic() + 240, 0
    while waiter.is_alive() and time.monotonic() < deadline:
        spins += sum(i * i for i in range(20000)) > 0  # pure Python: the main thread holds the lock
    assert not waiter.is_alive(), "the wait for the blind baseline's child did not end within 240 s"
    assert spins > 0
    np.testing.assert_array_equal(got["scores"], blind_bow_scores(texts, labels, seed=1))


def test_a_child_that_never_answers_ends_the_wait_within_its_stall_bound(monkeypatch):
    """A child that stalls (here: sleeps, its CPU time still) is killed and reported in one line once its CPU time
    has not moved for ``stall_s`` seconds; the wait ends within that bound plus one poll, not never."""
    import time

    import mia_jax.evaluation.blind as b

    monkeypatch.setattr(subprocess, "Popen", _stalled_popen(subprocess.Popen))
    child = b.Child(["x"] * 10, [1, 0] * 5, stall_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        child.scores()
    assert 1.5 <= time.monotonic() - t0 < 10
    assert "made no progress" in str(e.value) and "\n" not in str(e.value)
    assert child._proc.returncode is not None  # killed and reaped
    assert not child._dir.exists()  # its files removed
