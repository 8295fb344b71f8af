"""Nll and NllGrad with data-parallel replicas folded (sim/fold.py): every replica's rows in one
tensor, ``(R * n, C)`` log-probabilities and ``(R * n,)`` labels.

- ``reduction="none"``: row-wise, the kernel on all rows.
- NllGrad, mean or sum, with the loss gradient the same on every replica (a scalar): eager's
  kernel writes ``-g / count`` (``-g``) at each row's label, the count being one replica's
  labels (no class ignored): one call over all rows with that count.
- Nll, mean or sum: eager's kernel sums its rows in a cascade whose grouping depends on the
  row count, so each replica's loss is its own call on its rows; the labels are checked
  once for all replicas (one ``aminmax``), not once per replica.

Both only for eager's own kernels (log-probabilities of rank 2); elsewhere they raise
``ValueError``, and the fold site runs each replica's own call. A label out of range is
reported by the replica's own check (its index among its own rows).
"""

from __future__ import annotations

from typing import Callable

import torch

from ._nll_labels import _aten_nll, _in_range, aten_nll_backward, check_labels, reduction_code

__all__ = ["folded_nll", "folded_nll_grad", "nll_rows", "nll_grad_rows"]

_nll = torch._C._nn.nll_loss


def nll_rows(attrs, shapes, per) -> bool:
    """Both inputs per replica (the labels are the replica's data)."""
    return all(per)


def nll_grad_rows(attrs, shapes, per) -> bool:
    """Log-probabilities and labels per replica; the loss gradient per replica for
    ``"none"`` (a value per row), else one scalar shared by the replicas."""
    return per[0] and per[1] and per[2] == (attrs["reduction"] == "none")


def _checked(lab: torch.Tensor, replicas: int, classes: int, ignore_index) -> None:
    """All replicas' labels in one check; where one fails, each replica's own check raises,
    naming the label's index among that replica's rows."""
    if _in_range(lab, classes):
        return
    for part in lab.split(lab.shape[0] // replicas):
        check_labels(part, None, classes, ignore_index)


def folded_nll(kernel: Callable) -> Callable:
    """Nll over all replicas' rows: ``(R * n,)`` for ``"none"``, else ``(R,)``."""

    def folded(args, replicas, dead, buffers, reduction, ignore_index, log_prob):
        probs, labels = args
        if reduction == "none":
            return kernel(probs, labels, reduction, ignore_index, log_prob)
        if not _aten_nll(probs, log_prob):
            raise ValueError("Nll folds its mean or sum only for eager's kernel")
        lab = labels.long()
        _checked(lab, replicas, probs.shape[-1], ignore_index)
        red, ignore = reduction_code(reduction, ignore_index)
        n = lab.shape[0] // replicas
        # each replica's rows as views (unbind: no Python of Tensor.split)
        parts = zip(probs.view(replicas, n, -1).unbind(), lab.view(replicas, n).unbind())
        # at::nll_loss: aten.nll_loss_forward's loss in one C++ call (no Python dispatch
        # of `torch.ops` per replica)
        return torch.stack([_nll(p, t, None, red, ignore) for p, t in parts])

    return folded


def folded_nll_grad(kernel: Callable) -> Callable:
    """NllGrad over all replicas' rows, ``(R * n, C)``."""

    def folded(args, replicas, dead, buffers, reduction, ignore_index, log_prob):
        probs, labels, g = args
        if reduction == "none":
            return kernel(probs, labels, g, reduction, ignore_index, log_prob)
        if not _aten_nll(probs, log_prob) or g.dim() != 0:
            raise ValueError("NllGrad folds its mean or sum only for eager's kernel")
        lab = labels.long()
        _checked(lab, replicas, probs.shape[-1], ignore_index)
        return aten_nll_backward(probs, lab, g, reduction, ignore_index, replicas)

    return folded
