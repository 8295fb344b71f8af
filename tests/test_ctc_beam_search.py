"""PopART's CTC beam search decoder (popxl_core's ``CtcBeamSearchDecoder``, popxl_fx's
lowering and ``poptorch.ctc_beam_search_decoder``) against two references written here: the
exhaustive sum over every alignment (exact, for tiny inputs) and the textbook prefix beam
search (for beams too narrow to keep every prefix)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import popxl_fx.poptorch as poptorch
from popxl_core import ops
from popxl_core.ops.ctc_decoder import CTC_BEAM_SEARCH_DECODER
from popxl_core.ops.registry import Sample

from .op_harness import run_sample


def _logsumexp(values) -> float:
    values = [v for v in values if v != -math.inf]
    if not values:
        return -math.inf
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def _collapse(path, blank: int) -> tuple[int, ...]:
    """An alignment's label sequence: repeats merged, then blanks removed."""
    return tuple(k for i, k in enumerate(path) if k != blank and (i == 0 or path[i - 1] != k))


def _exhaustive(lp: np.ndarray, blank: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every label sequence of ``lp`` [T, C] with its log-probability, most likely first."""
    per_sequence: dict[tuple[int, ...], list[float]] = {}
    for path in itertools.product(range(lp.shape[1]), repeat=lp.shape[0]):
        score = sum(float(lp[t, k]) for t, k in enumerate(path))
        per_sequence.setdefault(_collapse(path, blank), []).append(score)
    ranked = [(_logsumexp(scores), seq) for seq, scores in per_sequence.items()]
    return sorted(ranked, key=lambda r: -r[0])


def _textbook(lp: np.ndarray, blank: int, width: int) -> list[tuple[float, tuple[int, ...]]]:
    """Prefix beam search as textbooks write it, in float64: the beams, most likely first."""
    beams = {(): (0.0, -math.inf)}  # prefix -> (ends in blank, ends in a label)
    for row in lp.astype(np.float64):
        grown: dict[tuple[int, ...], tuple[list, list]] = {}
        for prefix, (pb, pnb) in beams.items():
            total = _logsumexp([pb, pnb])
            grown.setdefault(prefix, ([], []))[0].append(total + row[blank])
            if prefix:
                grown[prefix][1].append(pnb + row[prefix[-1]])
            for k in range(len(row)):
                if k != blank:
                    start = pb if prefix and prefix[-1] == k else total
                    grown.setdefault((*prefix, k), ([], []))[1].append(start + row[k])
        scored = {p: (_logsumexp(b), _logsumexp(n)) for p, (b, n) in grown.items()}
        best = sorted(scored, key=lambda p: -_logsumexp(scored[p]))[:width]
        beams = {p: scored[p] for p in best}
    return sorted(((_logsumexp(v), p) for p, v in beams.items()), key=lambda r: -r[0])


def _as_outputs(found, steps: int, top: int):
    """References' results as the op's outputs of one batch entry."""
    probs = [s for s, _ in found[:top]]
    lengths = [len(p) for _, p in found[:top]]
    labels = [list(p) + [0] * (steps - len(p)) for _, p in found[:top]]
    return probs, lengths, labels


def _reference(search, data, lengths, top):
    """``search(lp [t, C])`` on each batch entry's valid steps, stacked as the op's outputs."""
    outs = [
        _as_outputs(search(data[: int(n), b]), data.shape[0], top) for b, n in enumerate(lengths)
    ]
    probs, sizes, labels = (torch.tensor([o[i] for o in outs]) for i in range(3))
    return probs.float(), sizes, labels


def _log_softmax(rng, shape) -> np.ndarray:
    return torch.log_softmax(torch.tensor(rng.standard_normal(shape) * 2), -1).float().numpy()


def test_the_op_finds_the_exhaustive_searchs_paths():
    rng = np.random.default_rng(7)
    data, lengths = _log_softmax(rng, (4, 3, 3)), np.array([4, 3, 1], np.uint32)
    blank, width, top = 1, 64, 3  # a beam per prefix: the search is exact
    sample = Sample(
        [data, lengths],
        lambda x, n: ops.ctc_beam_search_decoder(x, n, blank, width, top),
        lambda x, n: _reference(lambda lp: _exhaustive(lp.numpy(), blank), x, n.numpy(), top),
        grad=False,
    )
    run_sample(CTC_BEAM_SEARCH_DECODER, sample)  # also checks the outputs' specs


@pytest.mark.parametrize("width", [1, 2, 5])
def test_narrow_beams_keep_the_textbook_searchs_beams(width):
    rng = np.random.default_rng(width)
    data, lengths = _log_softmax(rng, (6, 2, 4)), np.array([6, 4], np.uint32)
    top = min(width, 2)
    sample = Sample(
        [data, lengths],
        lambda x, n: ops.ctc_beam_search_decoder(x, n, 0, width, top),
        lambda x, n: _reference(lambda lp: _textbook(lp.numpy(), 0, width), x, n.numpy(), top),
        grad=False,
    )
    run_sample(CTC_BEAM_SEARCH_DECODER, sample)


def test_unreached_paths_have_no_probability():
    data = np.log(np.full((1, 1, 2), 0.5, np.float32))  # one step: "" or "1" only
    lengths = np.array([1], np.uint32)

    def want(x, n):
        return (
            torch.tensor([[math.log(0.5)] * 2 + [-math.inf]]),
            torch.tensor([[0, 1, 0]]),
            torch.tensor([[[0], [1], [0]]]),
        )

    sample = Sample([data, lengths], lambda x, n: ops.ctc_beam_search_decoder(x, n, 0, 4, 3), want)
    run_sample(CTC_BEAM_SEARCH_DECODER, sample)


class _Decoder(torch.nn.Module):
    def forward(self, log_probs, lengths):
        return poptorch.ctc_beam_search_decoder(log_probs, lengths, beam_width=6, top_paths=2)


def test_poptorch_decodes_as_the_textbook_search():
    torch.manual_seed(42)
    log_probs = torch.randn(7, 3, 5).log_softmax(-1)
    lengths = torch.randint(3, 7, (3,), dtype=torch.int)
    probs, sizes, labels = poptorch.inferenceModel(_Decoder())(log_probs, lengths)
    assert (sizes.dtype, labels.dtype, labels.shape) == (torch.int32, torch.int32, (3, 2, 7))
    want = _reference(lambda lp: _textbook(lp, 0, 6), log_probs.numpy(), lengths.numpy(), 2)
    torch.testing.assert_close(probs, want[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(sizes, want[1].int()) and torch.equal(labels, want[2].int())


def test_poptorch_refuses_arguments_that_are_not_tensors():
    with pytest.raises(poptorch.Error, match="lengths must be a torch.tensor"):
        poptorch.ctc_beam_search_decoder(torch.zeros(2, 1, 3), [2])
