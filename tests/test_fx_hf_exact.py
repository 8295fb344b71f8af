"""More HuggingFace families as they come, bit for bit with eager (tolerance 0), as
test_fx_hf.py runs its own: tiny configs built in code (random init, no downloads), passed raw.

- ELECTRA's discriminator (``ElectraForPreTraining``): its loss is
  ``BCEWithLogitsLoss`` on the per-token logits (3e-6 off eager after 2 AdamW steps while
  binary_cross_entropy_with_logits lowered to a composite of PopXL ops; issue 34).
- Mamba (``MambaForCausalLM``, the sequential scan of its CPU path): ``dt_proj.weight @
  time_step.transpose(1, 2)``, a matrix times a strided batch, which at::matmul folds into one
  mm because the weight requires grad (tests/test_fx_matmul_fold.py).
"""

from __future__ import annotations

import copy

import pytest
import torch

import popxl_fx

transformers = None  # imported by `_transformers` when this module's tests run


@pytest.fixture(scope="module", autouse=True)
def _transformers():
    global transformers
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()


VOCAB = 64


def _electra():
    config = transformers.ElectraConfig(
        num_hidden_layers=2, hidden_size=32, embedding_size=16, num_attention_heads=2,
        intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=16,
    )  # fmt: skip
    return transformers.ElectraForPreTraining(config)


def _mamba():
    config = transformers.MambaConfig(
        num_hidden_layers=2, hidden_size=32, state_size=8, expand=2, conv_kernel=4,
        time_step_rank=4, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return transformers.MambaForCausalLM(config)


_BUILDERS = {"electra": _electra, "mamba": _mamba}


def _case(name: str):
    """(model, positional inputs, keyword inputs without labels, labels)."""
    torch.manual_seed(0)
    model = _BUILDERS[name]()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 8), generator=gen)
    if name == "electra":  # the discriminator's labels: was each token replaced?
        return model, (ids,), {}, torch.randint(0, 2, (2, 8), generator=gen)
    return model, (ids,), {"use_cache": False}, ids


@pytest.mark.parametrize("name", sorted(_BUILDERS))
def test_inference_returns_the_model_output_bit_for_bit(name):
    model, args, kwargs, _ = _case(name)
    model.eval()
    ref = model(*args, **kwargs)
    out = popxl_fx.inference_model(model)(*args, **kwargs)
    assert type(out) is type(ref)
    assert torch.equal(out.logits, ref.logits), (out.logits - ref.logits).abs().max()


@pytest.mark.parametrize("name", sorted(_BUILDERS))
def test_two_adamw_steps_with_the_models_own_loss(name):
    model, args, kwargs, labels = _case(name)
    model.train()
    eager = copy.deepcopy(model)
    trainer = popxl_fx.training_model(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    for seed in range(2):
        torch.manual_seed(seed)  # dropout masks: drawn from torch's generator on both sides
        loss = trainer(*args, labels=labels, **kwargs)
        torch.manual_seed(seed)
        eager_opt.zero_grad()
        ref = eager(*args, labels=labels, **kwargs).loss
        ref.backward()
        eager_opt.step()
        assert torch.equal(loss, ref.detach()), (seed, loss.item(), ref.item())
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        assert torch.equal(p, q), (n, (p - q).abs().max().item())
