"""PAC (Ye et al. 2024): the polarized distance against a float64 loop, the seeded random-swap augmenter, and
``pac`` end to end as polarized(text) - mean polarized(augmentations) from the same runner, resumed from its pass."""
import json
from fractions import Fraction

import numpy as np
import pytest
from reference import scores_x64

from mia_jax.evaluation import metrics
from mia_jax import models
from mia_jax.engine import runner
from mia_jax.methods.augment import EdaAugmenter, n_swaps, random_swap
from mia_jax.data import wikimia
from mia_jax.methods.neighbors import SelfNeighbors, cache_key, cached_neighbors
from mia_jax.scorers import TokenBatch, score_batch
from mia_jax.stats import TokenStats

TEXTS = wikimia(32).texts[:3] + ["Alone"]


def count(frac: str, n: int) -> int:
    f = Fraction(frac)
    return max(1, n * f.numerator // f.denominator)


def pd_loop(values, mask) -> np.ndarray:
    out = []
    for row, m in zip(values, mask):
        v = sorted(float(x) for x, keep in zip(row, m) if keep)
        if not v:
            out.append(np.nan)
            continue
        far, near = count("0.05", len(v)), count("0.3", len(v))
        out.append(sum(v[::-1][:far]) / far - sum(v[:near]) / near)
    return np.array(out)


def test_polarized_distance_matches_a_loop():
    rng = np.random.default_rng(0)
    lengths = [0, 1, 2, 3, 10, 19, 20, 21, 40, 57]  # 10 * 0.3 = 2.9999999999999996: 3 near tokens, not 2
    t = max(lengths)
    logprob = -rng.exponential(3.0, size=(len(lengths), t))
    mask = np.arange(t) < np.array(lengths)[:, None]
    logprob[~mask] = rng.choice([1e3, -1e3, np.nan], size=(~mask).sum())  # padding must not leak in
    want = pd_loop(logprob, mask)
    stats = TokenStats(logprob, *(np.zeros_like(logprob),) * 4, logprob)
    got = -scores_x64(stats, mask, ["polarized"])["polarized"]  # the registered formula in float64: -PD
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.isnan(got[0]) and got[1] == 0.0 and np.all(np.isfinite(got[1:]))
    f32 = score_batch(TokenBatch(stats, mask), ["polarized"])["polarized"]  # the host path, float32
    np.testing.assert_allclose(f32, -want, rtol=1e-5, atol=1e-5)


def test_augmenter_is_seeded_per_text():
    gen = EdaAugmenter(n=5, seed=0)
    a = gen(TEXTS)
    assert a == gen(TEXTS[::-1])[::-1] == [gen([t])[0] for t in TEXTS]  # independent of the batch
    assert EdaAugmenter(n=5, seed=0)(TEXTS) == a  # a fresh object, same draws
    b = EdaAugmenter(n=5, seed=1)(TEXTS)
    assert all(x != y for x, y in zip(a[:3], b[:3]))
    assert EdaAugmenter(n=5, seed=0).config != EdaAugmenter(n=5, seed=1).config


def test_swaps_keep_the_word_multiset():
    text = TEXTS[0] + "  two  spaces\nand a newline"
    words = text.split(" ")
    augs = EdaAugmenter(n=8, alpha=0.3, seed=3)([text])[0]
    assert len(augs) == 8 and len(set(augs)) == 8
    swaps = n_swaps(len(words), 0.3)
    for x in augs:
        xw = x.split(" ")
        assert sorted(xw) == sorted(words)  # exactly the same words, the same count
        assert 0 < sum(p != q for p, q in zip(xw, words)) <= 2 * swaps
    assert n_swaps(10, 0.3) == 3 and n_swaps(3, 0.3) == 1 and n_swaps(1, 0.3) == 1
    assert EdaAugmenter(n=3)(["Alone"]) == [["Alone"] * 3]  # nothing to swap with
    assert random_swap("a b", 4, 0.3, np.random.default_rng(0)).count("b a") >= 1


def test_cache_keeps_augmenters_apart(tmp_path):
    a0, a1 = EdaAugmenter(n=2, seed=0), EdaAugmenter(n=2, seed=1)
    assert cached_neighbors(a0, TEXTS, tmp_path) == a0(TEXTS)
    assert cached_neighbors(a1, TEXTS, tmp_path) == a1(TEXTS)  # same file, other keys
    assert cached_neighbors(a0, TEXTS, tmp_path) == a0(TEXTS)
    assert len((tmp_path / "neighbors.jsonl").read_text().splitlines()) == 2 * len(TEXTS)
    assert cache_key(a0, TEXTS[0]) != cache_key(a1, TEXTS[0])


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return models.load(str(tiny_llama_dir))


def polarized_of(loaded, texts):
    recs = runner.score_texts(loaded, texts, ["polarized"], progress=False)
    return metrics.scores_by_method(recs, ["polarized"])["polarized"]


def test_pac_end_to_end_and_resumed(tiny, tmp_path):
    report = {}
    recs = runner.score_dataset(tiny, TEXTS, ["loss", "pac"], out_dir=tmp_path, progress=False, report=report)
    augs = EdaAugmenter()(TEXTS)
    want = polarized_of(tiny, TEXTS)
    for i in range(3):
        assert len(set(augs[i]) - {TEXTS[i]}) == 5
        want[i] -= polarized_of(tiny, augs[i]).mean()
    got = metrics.scores_by_method(recs, ["pac"])["pac"]
    np.testing.assert_allclose(got[:3], want[:3], rtol=1e-5, atol=1e-6)
    assert [r["n_augmentations"] for r in recs] == [5, 5, 5, 0]
    assert [r["n_identical_augmentations"] for r in recs] == [0, 0, 0, 5]
    assert recs[3]["scores"]["pac"] is None and recs[3]["scores"]["loss"] is not None
    assert "all 5 augmentations are identical" in recs[3]["nan_reasons"]["pac"]
    assert {p.name for p in (tmp_path / "passes").iterdir()} >= {"main.jsonl", "augment.polarized.jsonl"}
    assert report["augment.polarized"]["computed"] == 15
    cached = [json.loads(line) for line in (tmp_path / "neighbors" / "neighbors.jsonl").read_text().splitlines()]
    assert {c["generator"] for c in cached} == {"eda:random_swap"} and len(cached) == len(TEXTS)

    again = {}
    recs2 = runner.score_dataset(tiny, TEXTS, ["loss", "pac"], out_dir=tmp_path, resume=True, progress=False,
                                 report=again)
    assert recs2 == recs
    assert again["augment.polarized"]["reused"] == 15 and again["augment.polarized"]["computed"] == 0
    assert len((tmp_path / "neighbors" / "neighbors.jsonl").read_text().splitlines()) == len(TEXTS)


def test_pac_beside_neighbor_keeps_its_own_counts(tiny, tmp_path):
    gen = SelfNeighbors(tiny, n=2, seed=0)
    recs = runner.score_dataset(tiny, TEXTS[:2], ["neighbor", "pac"], neighbors=gen, out_dir=tmp_path,
                                progress=False, pass_options={"augment_n": 3})
    assert all(r["n_augmentations"] == 3 and r["n_neighbors"] <= 2 for r in recs)
    assert all(r["scores"]["pac"] is not None and r["scores"]["neighbor"] is not None for r in recs)
    gens = {json.loads(line)["generator"] for line in (tmp_path / "neighbors" / "neighbors.jsonl").open()}
    assert gens == {"eda:random_swap", gen.name}
