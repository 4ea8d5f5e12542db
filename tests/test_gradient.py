"""GradNorm: per-example gradient norms of the mean token loss, through the runner's batches, equal to a per-text
loop and to torch autograd on the same weights."""
import numpy as np
import pytest

from mia_jax.evaluation import metrics
from mia_jax import models
from mia_jax.engine import runner
from mia_jax.batching import real_vocab_size
from mia_jax.data import wikimia
from mia_jax.methods.gradient import NORMS

TEXTS = [" ".join(t.split()[:n]) for t, n in zip(wikimia(32).texts[:5], (12, 5, 9, 2, 7))] + ["x"]


def torch_norms(tiny_dir, loaded, text):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    ids = torch.tensor([loaded.tokenizer.encode(text).ids])
    logits = model(ids).logits[0, :-1, : real_vocab_size(loaded)].float()
    loss = -torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None]).mean()
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    flat = torch.cat([g.reshape(-1) for g in grads]).double()
    return {"gradnorm_l1": -flat.abs().sum().item(), "gradnorm_l2": -flat.norm().item(),
            "gradnorm_linf": -flat.abs().max().item()}


def test_gradnorm_through_the_runner_equals_torch_autograd_per_text(tiny_llama_dir, tmp_path):
    loaded = models.load(str(tiny_llama_dir))
    report = {}
    recs = runner.score_dataset(loaded, TEXTS, list(NORMS), out_dir=tmp_path, batch_size=4, progress=False,
                                report=report)
    got = metrics.scores_by_method(recs, list(NORMS))
    assert sorted(report) == ["gradnorm", "main"]  # one gradient pass gives the three norms
    for i, text in enumerate(TEXTS[:-1]):  # each text alone in torch: padding and batch-mates change nothing
        want = torch_norms(tiny_llama_dir, loaded, text)
        for m in NORMS:
            assert got[m][i] == pytest.approx(want[m], rel=2e-4), (i, m)
    assert np.isnan(got["gradnorm_l2"][-1]) and "nothing to predict" in recs[-1]["skip_reason"]  # one token
    # resumed: the pass's records are reused, nothing recomputed
    again = {}
    recs2 = runner.score_dataset(loaded, TEXTS, list(NORMS), out_dir=tmp_path, batch_size=4, progress=False,
                                 report=again, resume=True)
    assert again["gradnorm"]["computed"] == 0 and recs2 == recs
