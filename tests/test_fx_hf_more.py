"""More HuggingFace families as they come (issue 34), in the shape of tests/test_fx_hf.py:
tiny random-init Mixtral (with its router's auxiliary loss), Qwen2-MoE, BLOOM and
Wav2Vec2-CTC, run raw, compared with eager bit for bit (tolerance 0): inference, 2 AdamW steps
with the model's own loss, 2 AdamW steps with a ``loss_fn`` on the logits.

Wav2Vec2-CTC's own loss flattens the labels with ``masked_select`` (a data-dependent shape):
that path is refused with the line, which is right for a static program; its label check
(``labels.max() >= vocab_size``) is a run-time check, not a refusal.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import popxl_fx
from popxl_fx import UnsupportedError

from .test_fx_hf import _leaves_equal, _logits_loss, _two_steps

transformers = None  # imported when this module's tests run (see tests/test_fx_hf.py)

VOCAB = 64


@pytest.fixture(scope="module", autouse=True)
def _transformers():
    global transformers
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()


def _decoder(**extra):
    return dict(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
        vocab_size=VOCAB, max_position_embeddings=16, bos_token_id=0, eos_token_id=0,
        pad_token_id=0, **extra,
    )  # fmt: skip


def _mixtral():
    # experts through torch._grouped_mm and torch.histc (HF's default on CPU); the router's
    # auxiliary loss installs HF's output-capturing hooks on the first call
    config = transformers.MixtralConfig(
        **_decoder(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
        output_router_logits=True,
    )
    return transformers.MixtralForCausalLM(config)


def _qwen2_moe():
    config = transformers.Qwen2MoeConfig(
        **_decoder(intermediate_size=64, moe_intermediate_size=16, num_experts=4),
        num_experts_per_tok=2, shared_expert_intermediate_size=32,
    )  # fmt: skip
    return transformers.Qwen2MoeForCausalLM(config)


def _bloom():
    # alibi through baddbmm(batch1=, batch2=); GeLU in training as a custom autograd.Function
    config = transformers.BloomConfig(
        n_layer=2, hidden_size=32, n_head=2, vocab_size=VOCAB,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return transformers.BloomForCausalLM(config)


def _wav2vec2():
    # the positional convolution is weight-normed by torch.nn.utils.parametrizations
    config = transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, vocab_size=VOCAB, mask_time_prob=0.0, layerdrop=0.0,
        pad_token_id=0,
    )  # fmt: skip
    return transformers.Wav2Vec2ForCTC(config)


_BUILDERS = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "bloom": _bloom, "wav2vec2": _wav2vec2}
_ALL = [pytest.param(n, marks=pytest.mark.slow) for n in _BUILDERS]
_OWN_LOSS = [pytest.param(n, marks=pytest.mark.slow) for n in ("mixtral", "qwen2_moe", "bloom")]


def _case(name: str):
    """(model, positional inputs, keyword inputs without labels, labels)."""
    torch.manual_seed(0)
    model = _BUILDERS[name]()
    gen = torch.Generator().manual_seed(1)
    if name == "wav2vec2":
        audio = torch.randn(2, 400, generator=gen)
        frames = model.wav2vec2._get_feat_extract_output_lengths(400)
        return model, (audio,), {}, torch.randint(1, VOCAB, (2, int(frames)), generator=gen)
    ids = torch.randint(0, VOCAB, (2, 8), generator=gen)
    return model, (ids,), {"use_cache": False}, ids


@pytest.mark.parametrize("name", _ALL)
def test_inference_returns_the_model_output_bit_for_bit(name):
    model, args, kwargs, _ = _case(name)
    model.eval()
    ref = model(*args, **kwargs)
    out = popxl_fx.inference_model(model)(*args, **kwargs)
    assert type(out) is type(ref)
    _leaves_equal(out, ref)


@pytest.mark.parametrize("name", _OWN_LOSS)
def test_two_adamw_steps_with_the_models_own_loss(name):
    model, args, kwargs, labels = _case(name)
    model.train()

    def step(opt):
        trainer = popxl_fx.training_model(model, opt)
        return lambda: trainer(*args, labels=labels, **kwargs)

    _two_steps(model, step, lambda eager: eager(*args, labels=labels, **kwargs).loss)


@pytest.mark.parametrize("name", _ALL)
def test_two_adamw_steps_with_a_loss_fn_on_the_logits(name):
    model, args, kwargs, labels = _case(name)
    model.train()

    def step(opt):
        trainer = popxl_fx.training_model(model, opt, _logits_loss)
        return lambda: trainer(*args, labels, **kwargs)

    _two_steps(model, step, lambda eager: _logits_loss(eager(*args, **kwargs), labels))


@pytest.mark.slow
def test_wav2vec2_ctc_loss_is_refused_at_its_data_dependent_shape():
    model, args, _, labels = _case("wav2vec2")
    trainer = popxl_fx.training_model(model.train(), torch.optim.AdamW(model.parameters()))
    with pytest.raises(UnsupportedError, match=r"loss_ctc\.py:\d+: data-dependent shape") as err:
        trainer(*args, labels=labels[:, :5])
    assert "masked_select" in str(err.value)
    assert "control flow" not in str(err.value)  # its label check is a run-time check


@pytest.mark.slow
def test_mixtral_router_logits_and_auxiliary_loss_bit_for_bit():
    model, args, kwargs, labels = _case("mixtral")
    model.eval()
    ref = model(*args, labels=labels, **kwargs)
    out = popxl_fx.inference_model(model)(*args, labels=labels, **kwargs)
    assert torch.equal(out.aux_loss, ref.aux_loss) and torch.equal(out.loss, ref.loss)
    assert len(out.router_logits) == len(ref.router_logits) == 2
    _leaves_equal(out, ref)
    assert F.softmax(out.router_logits[0], -1).shape == (16, 4)
