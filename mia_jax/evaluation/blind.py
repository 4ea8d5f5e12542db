"""The blind baseline (Das, Zhang & Tramèr 2024): detect "members" without any model.

A bag-of-words classifier (TF-IDF of word unigrams and bigrams + logistic regression) is trained
to tell members from non-members by their text alone, with seeded stratified k-fold
cross-validation; every text is scored by the fold model that did not see it (with ``groups``, e.g. the windows of
one text in online detection, a group's texts all fall in one fold). If it separates the
two sets well (AUROC above ``WARN_AUROC``), members and non-members differ in distribution (topic,
dates, style) and detector AUROCs on that benchmark overstate the membership signal.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np

from mia_jax.errors import UserError
from mia_jax.evaluation.rounding import fmt

NAME = "blind_bow"
WARN_AUROC = 0.6
FOLDS = 5
CHILD_MIN_TEXTS = 200  # from this many texts an eval computes the baseline in a child process (``Child``)
SAMPLE_MAX = 20_000  # a streamed corpus's baseline reads at most this many texts (``data.sample.stratified_sample``)


def assign_folds(labels: Sequence[int], *, folds: int = FOLDS, seed: int = 0, groups: Sequence | None = None,
                 ) -> np.ndarray:
    """The cross-validation fold (0 .. ``folds`` - 1) of each text: seeded stratified k-fold, or with ``groups``
    stratified *group* k-fold (``StratifiedGroupKFold``), every text of a group in the same fold."""
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold  # here: scikit-learn is slow to import

    y = np.asarray(labels, int)
    smallest = min(int(y.sum()), int(len(y) - y.sum()))
    if smallest < folds:
        raise UserError(f"the blind baseline needs at least {folds} members and {folds} non-members "
                        f"for {folds}-fold cross-validation; the smaller class has {smallest}")
    if groups is None:
        cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    else:
        groups = np.asarray(groups)
        if groups.shape != y.shape:
            raise UserError(f"the blind baseline got {groups.size} groups for {y.size} texts")
        n_groups = len(set(groups.tolist()))
        if n_groups < folds:
            raise UserError(f"the blind baseline needs at least {folds} groups (texts) for {folds}-fold grouped "
                            f"cross-validation; got {n_groups}")
        per_class = [len(set(groups[y == c].tolist())) for c in (1, 0)]
        if min(per_class) < folds:
            raise UserError(f"the blind baseline needs members and non-members each in at least {folds} groups "
                            f"(texts); members are in {per_class[0]}, non-members in {per_class[1]}")
        cv = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    out = np.full(y.size, -1, np.int64)
    for k, (_, test) in enumerate(cv.split(np.zeros(y.size), y, groups)):
        out[test] = k
    return out


def blind_bow_scores(texts: Sequence[str], labels: Sequence[int], *, folds: int = FOLDS, seed: int = 0,
                     groups: Sequence | None = None) -> np.ndarray:
    """Out-of-fold member probabilities (higher = member) of a model-free bag-of-words classifier; the folds are
    :func:`assign_folds`'.

    ``groups`` (one key per text, e.g. the index of the document a window was cut from): all texts of a group fall
    in the same fold. The windows of one document share its vocabulary (names, dates, topic words); were they split
    over folds, a fold model would have seen the very document it scores (from its other windows), and the baseline
    would overstate how separable members and non-members are."""
    from sklearn.feature_extraction.text import TfidfVectorizer  # here, as above: the CLI's start-up
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import PredefinedSplit, cross_val_predict
    from sklearn.pipeline import make_pipeline

    y = np.asarray(labels, int)
    fold = assign_folds(y, folds=folds, seed=seed, groups=groups)
    pipe = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True),
                         LogisticRegression(C=10.0, max_iter=2000))
    return cross_val_predict(pipe, list(texts), y, cv=PredefinedSplit(fold), method="predict_proba")[:, 1]


def warning(auroc: float | None) -> str | None:
    """The warning printed when the blind baseline's ``auroc`` exceeds ``WARN_AUROC``, else None."""
    if auroc is not None and auroc > WARN_AUROC:
        return (f"WARNING: a model-free bag-of-words classifier reaches AUROC {fmt(auroc)} > {WARN_AUROC} on this "
                "benchmark: members and non-members differ in distribution, so detector AUROCs here overstate "
                "the membership signal (Das et al. 2024).")
    return None


STALL_S = 60.0  # a child whose CPU time has not moved for this long is stalled (``Child.scores``)


class Child:
    """:func:`blind_bow_scores` (no groups) computed in a child process, ``python -m mia_jax.evaluation.blind IN OUT``,
    started now.

    The eval starts it before the model loads: the baseline is pure-Python work under scikit-learn (its import, the
    TF-IDF, the L-BFGS loop; the child took 2.2-2.3 s for WikiMIA-32's 776 texts) that on a thread of the eval's own
    would hold the interpreter lock the model load needs, while a process of its own runs on the core the
    single-threaded load leaves idle. The child has a session of its own (a Ctrl-C reaches the eval alone) and is
    killed when the eval's main thread ends first.

    Its input and output go through files in a temporary folder, written whole before the child starts and read
    once it has exited: no pipe to keep fed, so the child has its whole input however busy the parent is (a pipe
    fed in bounded slices by ``communicate(input, timeout=...)`` and retried without the input never sent the rest:
    the child waited for the end of its input, the parent for its output). The wait ends when the child exits, when
    the eval's main thread ends, or when the child stalls: its CPU time unchanged for ``stall_s`` seconds (read from
    ``/proc``; where there is none, after ``stall_s`` seconds in all)."""

    def __init__(self, texts: Sequence[str], labels: Sequence[int], *, seed: int = 0,
                 stall_s: float | None = None):
        root = str(Path(__file__).resolve().parents[1])  # the child imports this very package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
               **{f"{lib}_NUM_THREADS": "1" for lib in ("OMP", "OPENBLAS", "MKL")}}  # one core: XLA has the rest
        self.stall_s = float(STALL_S if stall_s is None else stall_s)
        self._dir = Path(tempfile.mkdtemp(prefix="mia-jax-blind-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        job = {"texts": list(texts), "labels": [int(y) for y in labels], "seed": int(seed)}
        (self._dir / "in.json").write_text(json.dumps(job))
        with open(self._dir / "stderr", "wb") as err:
            self._proc = subprocess.Popen([sys.executable, "-m", "mia_jax.evaluation.blind", str(self._dir / "in.json"),
                                           str(self._dir / "out.json")], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)

    def _cpu_ticks(self) -> int | None:
        """The child's user + system CPU time in clock ticks, None where ``/proc`` does not tell."""
        try:
            fields = Path(f"/proc/{self._proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            return None

    def _stop(self, why: str) -> RuntimeError:
        self._proc.kill()
        self._proc.wait()
        self._cleanup()
        return RuntimeError(why)

    def scores(self) -> np.ndarray:
        """The child's scores, waiting for them; a ``UserError`` as :func:`blind_bow_scores` raises it, and a
        ``RuntimeError`` with one line (the child's last line of stderr; or that it stalled, and for how long) when
        the child failed otherwise."""
        ticks, since = self._cpu_ticks(), time.monotonic()
        while True:
            try:
                self._proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if not threading.main_thread().is_alive():  # the eval is exiting (an error, a Ctrl-C)
                raise self._stop("the eval ended before the blind baseline's process") from None
            now, ticks_now = time.monotonic(), self._cpu_ticks()
            if ticks_now is not None and ticks_now != ticks:  # it works: the stall clock starts again
                ticks, since = ticks_now, now
            if now - since >= self.stall_s:
                raise self._stop(f"the blind baseline's process made no progress for {now - since:.0f} s "
                                 f"(stalled; killed)") from None
        try:
            if self._proc.returncode != 0:
                err = (self._dir / "stderr").read_text(errors="replace").strip().splitlines()
                raise RuntimeError(f"the blind baseline's process exited with code {self._proc.returncode}: "
                                   f"{(err or ['no output'])[-1]}")
            try:
                result = json.loads((self._dir / "out.json").read_text())
            except (OSError, ValueError) as e:
                raise RuntimeError(f"the blind baseline's process wrote no result ({e})") from None
        finally:
            self._cleanup()
        if "error" in result:
            raise UserError(result["error"])
        return np.asarray(result["scores"], np.float64)


def _main(argv: Sequence[str]) -> None:
    """``Child``'s process: {"texts", "labels", "seed"} as JSON in the file ``argv[0]`` -> {"scores": [...]} or
    {"error": the UserError's message} as JSON in the file ``argv[1]`` (written under another name, then renamed:
    the parent never reads half a file; floats written by ``repr``: the parent reads the same float64s). Not a
    command: the eval's child; a failure here reaches the eval as a ``RuntimeError`` and the eval computes the
    baseline itself."""
    src, dst = Path(argv[0]), Path(argv[1])
    job = json.loads(src.read_text())
    try:
        result = {"scores": blind_bow_scores(job["texts"], job["labels"], seed=job["seed"]).tolist()}
    except UserError as e:
        result = {"error": str(e)}
    tmp = dst.with_name(dst.name + ".part")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, dst)


if __name__ == "__main__":
    _main(sys.argv[1:])
