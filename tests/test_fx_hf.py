"""HuggingFace transformers models as they come: built from tiny configs (random init), passed
to popxl_fx raw (no wrapper), compared with eager PyTorch bit for bit (torch.equal on every
output, loss and parameter; tolerance 0).

Each model is run three ways: inference (eval, the ``ModelOutput`` back with every field
equal), 2 AdamW steps in train mode (dropout on, drawn from torch's generator as eager draws
it) with the model's own loss (``labels=``), and 2 AdamW steps with a ``loss_fn`` on its
logits. Decoder models are called with ``use_cache=False``: a KV cache object is no tensor
(without it popxl_fx names the cache and says so: `test_kv_cache_output_is_named`).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import popxl_fx

transformers = None  # imported by `_transformers` when this module's tests run


@pytest.fixture(scope="module", autouse=True)
def _transformers():
    """transformers is imported when the first test here runs, not when pytest collects the
    module: both xdist workers collect every module (0.6 s of CPU each), one runs these."""
    global transformers
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()


VOCAB = 64


def _gpt2():
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=16,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _bert():
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=16,
    )  # fmt: skip
    return transformers.BertForMaskedLM(config)


def _llama():
    # grouped-query attention (2 query heads share 1 key/value head), RMSNorm, rotary, SiLU
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=16,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _t5():
    # relative position bias as SDPA's float mask, label shifting by item assignment
    config = transformers.T5Config(
        num_layers=2, num_decoder_layers=2, d_model=32, d_kv=16, num_heads=2, d_ff=64,
        vocab_size=VOCAB, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return transformers.T5ForConditionalGeneration(config)


def _vit():
    config = transformers.ViTConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        image_size=16, patch_size=8, num_labels=5,
    )  # fmt: skip
    return transformers.ViTForImageClassification(config)


_BUILDERS = {"gpt2": _gpt2, "bert": _bert, "llama": _llama, "t5": _t5, "vit": _vit}
_DECODERS = {"gpt2", "llama", "t5"}  # called with use_cache=False


def _case(name: str):
    """(model, positional inputs, keyword inputs without labels, labels)."""
    torch.manual_seed(0)
    model = _BUILDERS[name]()
    gen = torch.Generator().manual_seed(1)
    if name == "vit":
        return model, (torch.randn(2, 3, 16, 16, generator=gen),), {}, torch.tensor([1, 4])
    ids = torch.randint(0, VOCAB, (2, 8), generator=gen)
    kwargs = {"use_cache": False} if name in _DECODERS else {}
    labels = ids
    if name == "t5":
        labels = torch.randint(0, VOCAB, (2, 6), generator=gen)
    return model, (ids,), kwargs, labels


# the cheap ones in the fast tier, one of each architecture family's extras in the slow tier
_FAST = ["gpt2", "bert", "vit"]
_ALL = _FAST + [pytest.param(n, marks=pytest.mark.slow) for n in ("llama", "t5")]


def _leaves_equal(out, ref) -> None:
    leaves, spec = torch.utils._pytree.tree_flatten(out)
    ref_leaves, ref_spec = torch.utils._pytree.tree_flatten(ref)
    assert spec == ref_spec
    for a, b in zip(leaves, ref_leaves):
        assert torch.equal(a, b), (a - b).abs().max()


@pytest.mark.parametrize("name", _ALL)
def test_inference_returns_the_model_output_bit_for_bit(name):
    model, args, kwargs, labels = _case(name)
    model.eval()
    if name == "t5":
        kwargs = {**kwargs, "decoder_input_ids": labels}
    # eager with autograd on: see test_t5_inference_under_no_grad for eager under no_grad
    ref = model(*args, **kwargs)
    out = popxl_fx.inference_model(model)(*args, **kwargs)
    assert type(out) is type(ref)
    assert torch.equal(out.logits, ref.logits)
    _leaves_equal(out, ref)


@pytest.mark.slow
def test_t5_inference_under_no_grad():
    """Eager T5's logits under torch.no_grad differ from its logits with autograd on by up to
    1.1e-6: T5's float attention mask (the position bias, from an Embedding) requires grad with
    autograd on, and torch's CPU SDPA then runs `_scaled_dot_product_attention_math`; under
    no_grad the bias is a plain tensor and torch runs `_scaled_dot_product_flash_attention_for_cpu`.
    The inference program follows the caller's grad mode (part of its signature): both equal
    eager bit for bit."""
    model, args, kwargs, labels = _case("t5")
    kwargs = {**kwargs, "decoder_input_ids": labels}
    sim = popxl_fx.inference_model(model.eval())
    with torch.no_grad():
        ref = model(*args, **kwargs)
        assert torch.equal(sim(*args, **kwargs).logits, ref.logits)
    # and back under autograd: the other program, eager's math-kernel numbers
    assert torch.equal(sim(*args, **kwargs).logits, model(*args, **kwargs).logits)


def _two_steps(model, step, eager_loss) -> None:
    """2 AdamW steps on the simulator and in eager from the same weights and seeds."""
    eager = copy.deepcopy(model)
    trainer_opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    trainer = step(trainer_opt)
    for seed in range(2):
        torch.manual_seed(seed)  # dropout masks: drawn from torch's generator on both sides
        loss = trainer()
        torch.manual_seed(seed)
        eager_opt.zero_grad()
        ref = eager_loss(eager)
        ref.backward()
        eager_opt.step()
        assert torch.equal(loss, ref.detach()), (seed, loss.item(), ref.item())
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        assert torch.equal(p, q), (n, (p - q).abs().max().item())


@pytest.mark.parametrize("name", _ALL)
def test_two_adamw_steps_with_the_models_own_loss(name):
    model, args, kwargs, labels = _case(name)
    model.train()

    def step(opt):
        trainer = popxl_fx.training_model(model, opt)
        return lambda: trainer(*args, labels=labels, **kwargs)

    _two_steps(model, step, lambda eager: eager(*args, labels=labels, **kwargs).loss)


def _logits_loss(out, target):
    logits = out.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


@pytest.mark.parametrize("name", _ALL)
def test_two_adamw_steps_with_a_loss_fn_on_the_logits(name):
    model, args, kwargs, labels = _case(name)
    model.train()
    if name == "t5":
        kwargs = {**kwargs, "decoder_input_ids": labels}

    def step(opt):
        trainer = popxl_fx.training_model(model, opt, _logits_loss)
        return lambda: trainer(*args, labels, **kwargs)

    _two_steps(model, step, lambda eager: _logits_loss(eager(*args, **kwargs), labels))


def test_kv_cache_output_is_named():
    model, args, _, _ = _case("gpt2")
    report = popxl_fx.check(model.eval(), *args)
    assert [i.kind for i in report.issues] == ["non-tensor output"]
    assert "DynamicCache" in report.issues[0].what
    assert "use_cache=False" in report.issues[0].hint
    assert "rewrite" not in str(report)
    assert popxl_fx.check(model, *args, use_cache=False).ok


def test_assert_matches_eager_with_keyword_labels():
    """The testing helper takes forward's keyword arguments: outputs (the ModelOutput's
    logits), gradients, parameters and AdamW state equal eager's at tolerance 0."""
    model, args, kwargs, labels = _case("bert")
    errors = popxl_fx.testing.assert_matches_eager(
        model.train(), args, kwargs={**kwargs, "labels": labels}, steps=2, rtol=0, atol=0,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    )  # fmt: skip
    assert set(errors.values()) == {0.0}
