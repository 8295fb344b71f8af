"""PopART's CTC beam search decoder (``CtcBeamSearchDecoder``, popnn's
``ctc_infer::beamSearchDecoderLogProbabilities``): the most likely label sequences of
log-probabilities ``[T, N, C]``, found by CTC prefix beam search.

A beam is a label sequence (a prefix) with the log-probabilities of its alignments that end
in a blank (``pb``) and in a label (``pnb``). At each step every beam stays (a blank, or its
last label repeated) or grows by one label (a repeated label only after a blank); candidates
that are the same sequence are merged (their probabilities summed), and the ``beam_width``
most likely are kept. The outputs are PopART's: for each batch entry the ``top_paths`` most
likely beams, their log-probabilities ``[N, top_paths]`` (the input's dtype), their lengths
``[N, top_paths]`` and their labels ``[N, top_paths, T]`` (uint32; the IPU leaves the labels
past a beam's length unset, zero here). A path that no beam reached (fewer candidates than
paths) has log-probability -inf and length 0.

No gradient, as in PopART (its op has no grad ops). Computed in float32, popnn's default
partials type; ties between candidates keep the order stay-candidates first, then by beam
and label (a stable sort).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import dtypes
from ..tensor import Tensor
from ._utils import spec
from .registry import Cost, OpDef, create_op, no_grad, register

__all__ = ["ctc_beam_search_decoder"]

_NEG_INF = float("-inf")


def _infer(ins, blank, beam_width, top_paths):
    probs, lengths = ins
    if len(probs.shape) != 3 or not probs.dtype.is_floating_point:
        raise ValueError(
            f"ctc_beam_search_decoder: the log-probabilities must be a float tensor "
            f"[T, N, C], got {probs.dtype} of shape {tuple(probs.shape)}."
        )
    t, n, c = probs.shape
    if tuple(lengths.shape) != (n,) or lengths.dtype.is_floating_point:
        raise ValueError(
            f"ctc_beam_search_decoder: the data lengths must be integers of shape ({n},), "
            f"got {lengths.dtype} of shape {tuple(lengths.shape)}."
        )
    if not 0 <= blank < c or not 1 <= top_paths <= beam_width:
        raise ValueError(
            f"ctc_beam_search_decoder: need 0 <= blank < {c} classes and 1 <= top_paths <= "
            f"beam_width, got blank={blank}, top_paths={top_paths}, beam_width={beam_width}."
        )
    return [spec((n, top_paths), probs.dtype), spec((n, top_paths), dtypes.uint32)] + [
        spec((n, top_paths, t), dtypes.uint32)
    ]


class _Beams:
    """The beams of one batch entry: prefixes and their blank / label log-probabilities."""

    def __init__(self) -> None:
        self.prefixes: list[tuple[int, ...]] = [()]
        self.pb = torch.zeros(1)
        self.pnb = torch.full((1,), _NEG_INF)

    def step(self, lp: torch.Tensor, blank: int, width: int) -> None:
        """Advance by one time step of log-probabilities ``lp`` [C]."""
        total = torch.logaddexp(self.pb, self.pnb)
        last = torch.tensor([p[-1] if p else blank for p in self.prefixes])
        stay_pb = total + lp[blank]
        stay_pnb = torch.where(last != blank, self.pnb + lp[last], _NEG_INF)
        # a label after itself extends only the alignments that end in a blank
        same = torch.arange(lp.numel())[None, :] == last[:, None]
        grow = torch.where(same, self.pb[:, None], total[:, None]) + lp[None, :]
        grow[:, blank] = _NEG_INF
        self._merge(stay_pnb, grow)
        scores = torch.cat([torch.logaddexp(stay_pb, stay_pnb), grow.flatten()])
        order = torch.sort(scores, descending=True, stable=True).indices[:width]
        self._keep(order[scores[order] > _NEG_INF], stay_pb, stay_pnb, grow)

    def _merge(self, stay_pnb: torch.Tensor, grow: torch.Tensor) -> None:
        """A beam that grows into another beam's sequence is that beam: its label
        alignments join the other's."""
        index = {p: i for i, p in enumerate(self.prefixes)}
        for j, prefix in enumerate(self.prefixes):
            i = index.get(prefix[:-1]) if prefix else None
            if i is not None:
                stay_pnb[j] = torch.logaddexp(stay_pnb[j], grow[i, prefix[-1]])
                grow[i, prefix[-1]] = _NEG_INF

    def _keep(self, chosen, stay_pb, stay_pnb, grow) -> None:
        beams, classes = len(self.prefixes), grow.shape[1]
        prefixes, pb, pnb = [], [], []
        for k in chosen.tolist():
            if k < beams:
                prefixes.append(self.prefixes[k])
                pb.append(stay_pb[k])
                pnb.append(stay_pnb[k])
            else:
                beam, label = divmod(k - beams, classes)
                prefixes.append((*self.prefixes[beam], label))
                pb.append(torch.tensor(_NEG_INF))
                pnb.append(grow[beam, label])
        self.prefixes, self.pb, self.pnb = prefixes, torch.stack(pb), torch.stack(pnb)


def _kernel(probs, lengths, blank, beam_width, top_paths):
    t, n, _ = probs.shape
    log_p = torch.full((n, top_paths), _NEG_INF)
    out_len = torch.zeros((n, top_paths), dtype=torch.int64)
    labels = torch.zeros((n, top_paths, t), dtype=torch.int64)
    for b in range(n):
        beams = _Beams()
        for step in range(min(int(lengths[b]), t)):
            beams.step(probs[step, b].float(), blank, beam_width)
        totals = torch.logaddexp(beams.pb, beams.pnb)
        for k, prefix in enumerate(beams.prefixes[:top_paths]):
            log_p[b, k] = totals[k]
            out_len[b, k] = len(prefix)
            labels[b, k, : len(prefix)] = torch.tensor(prefix, dtype=torch.int64)
    return log_p.to(probs.dtype), out_len.to(torch.uint32), labels.to(torch.uint32)


def _cost(ins, outs, attrs) -> Cost:
    """Per step and batch entry, each of ``beam_width x C`` candidates is scored (a few
    flops) and sorted; the input is read and the outputs written once."""
    t, n, c = ins[0].shape
    candidates = attrs["beam_width"] * c
    flops = 4 * t * n * candidates * max(1, int(np.log2(candidates)))
    return Cost(flops, ins[0].nbytes + ins[1].nbytes + sum(o.nbytes for o in outs))


CTC_BEAM_SEARCH_DECODER = register(
    OpDef(
        "CtcBeamSearchDecoder",
        _infer,
        _kernel,
        grad=no_grad,
        cost=_cost,
        fp16_in_fp32=False,  # the kernel computes in float32 itself
        out_name="ctc_beam_search_decoder_out",
        tested_by="tests/test_ctc_beam_search.py::test_the_op_finds_the_exhaustive_searchs_paths",
    )
)


def ctc_beam_search_decoder(
    data: Tensor, data_lengths: Tensor, blank: int = 0, beam_width: int = 100, top_paths: int = 1
) -> tuple[Tensor, Tensor, Tensor]:
    """PopART's ``ctcbeamsearchdecoder``: ``(label_probs, label_lengths, decoded_labels)``
    of log-probabilities ``data`` [T, N, C] with ``data_lengths`` [N] valid steps each.

    Example:
        >>> import popxl_core as popxl
        >>> ir = popxl.Ir()
        >>> with ir.main_graph:
        ...     x = popxl.variable(np.log(np.full((2, 1, 3), 1 / 3, np.float32)))
        ...     n = popxl.variable(np.array([2], np.uint32), popxl.uint32)
        ...     probs, lengths, labels = ctc_beam_search_decoder(x, n, beam_width=4)
        >>> labels.shape
        (1, 1, 2)
    """
    attrs = {"blank": int(blank), "beam_width": int(beam_width), "top_paths": int(top_paths)}
    outs = create_op(CTC_BEAM_SEARCH_DECODER, [data, data_lengths], attrs)
    return outs[0], outs[1], outs[2]
