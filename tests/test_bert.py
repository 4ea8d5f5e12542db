"""mia_jax.models.bert: BERT / RoBERTa masked-LM logit parity with transformers (padded batches included),
loading a Hugging Face folder, and unsupported options refused by name."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import hf_config, tiny_mlm_tokenizer, write_tiny_mlm
from safetensors.numpy import save_file

from mia_jax.errors import UserError
from mia_jax.models import bert
from mia_jax.models.llama import ConfigError

TEXTS = ["The cat sat on the mat, quietly.", "A much longer sentence about the history of the city and its people."]


def padded_batch(tok, pad_id):
    encs = [tok.encode(t).ids for t in TEXTS]
    n = max(map(len, encs))
    ids = np.full((len(encs), n), pad_id, np.int64)
    mask = np.zeros((len(encs), n), np.int64)
    for i, e in enumerate(encs):
        ids[i, : len(e)], mask[i, : len(e)] = e, 1
    assert mask.sum(1).min() < n  # the batch really is padded
    return ids, mask


@pytest.mark.parity
@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_mlm_parity(tmp_path, model_type):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = tiny_mlm_tokenizer(model_type)
    cfg = hf_config(model_type, tok.get_vocab_size())
    cls = transformers.BertForMaskedLM if model_type == "bert" else transformers.RobertaForMaskedLM
    conf_cls = transformers.BertConfig if model_type == "bert" else transformers.RobertaConfig
    torch.manual_seed(0)
    ref = cls(conf_cls(**{k: v for k, v in cfg.items() if k != "model_type"})).eval()
    with torch.no_grad():
        for _, p in ref.named_parameters():
            p.copy_(p + 0.1 * torch.randn_like(p) if p.ndim == 1 else 0.08 * torch.randn_like(p))
    ref.save_pretrained(tmp_path, safe_serialization=True)
    tok.save(str(tmp_path / "tokenizer.json"))
    model, tokenizer, mask_id, info = bert.load_mlm(str(tmp_path))
    assert mask_id == 4 and info["model_type"] == model_type and len(info["files"]) == 3
    assert all(len(h) == 64 for h in info["files"].values())
    ids, mask = padded_batch(tokenizer, cfg["pad_token_id"])
    ids[0, 3] = mask_id
    with torch.no_grad():
        want = ref(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)).logits.float().numpy()
    got = np.asarray(model(jnp.asarray(ids, jnp.int32), jnp.asarray(mask)))
    real = mask.astype(bool)
    d_real, d_all = np.abs(got - want)[real].max(), np.abs(got - want).max()
    print(f"{model_type}: float32 max|diff| real tokens {d_real:.2e}, all {d_all:.2e}, "
          f"max|logit| {np.abs(want).max():.2f}")
    assert got.shape == want.shape and d_real < 1e-4 and d_all < 1e-4
    # the padding mask matters: without it the short row's logits change
    unmasked = np.asarray(model(jnp.asarray(ids, jnp.int32)))
    assert np.abs(unmasked[0][real[0]] - want[0][real[0]]).max() > 1e-3


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_load_numpy_folder(tmp_path, model_type):
    write_tiny_mlm(tmp_path, model_type)
    model, tok, mask_id, info = bert.load_mlm(str(tmp_path))
    assert tok.id_to_token(mask_id) in ("[MASK]", "<mask>")
    assert model.config.position_offset == (0 if model_type == "bert" else 2)
    assert info["max_length"] == 72 - model.config.position_offset
    ids, mask = padded_batch(tok, model.config.pad_token_id)
    out = model(jnp.asarray(ids, jnp.int32), jnp.asarray(mask))
    assert out.shape == (*ids.shape, tok.get_vocab_size()) and out.dtype == jnp.float32
    # right padding never changes the real tokens' logits (bidirectional attention is masked)
    short = np.asarray(model(jnp.asarray(ids[:1, : mask[0].sum()], jnp.int32)))
    np.testing.assert_allclose(np.asarray(out)[0, : mask[0].sum()], short[0], atol=1e-5)


@pytest.mark.parametrize("change, match", [
    (dict(position_embedding_type="relative_key"), "position_embedding_type"),
    (dict(is_decoder=True), "is_decoder"),
    (dict(add_cross_attention=True), "add_cross_attention"),
    (dict(hidden_act="mish"), "hidden_act"),
    (dict(model_type="gpt2"), "model_type"),
])
def test_unsupported_options(change, match):
    with pytest.raises(ConfigError, match=match):
        bert.BertConfig.from_hf({**hf_config("bert", 100), **change})


def test_needs_the_mlm_head(tmp_path):
    write_tiny_mlm(tmp_path, "bert")
    from safetensors.numpy import load_file

    tensors = {k: v for k, v in load_file(str(tmp_path / "model.safetensors")).items() if not k.startswith("cls.")}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="no masked-LM head"):
        bert.load_mlm(str(tmp_path))
