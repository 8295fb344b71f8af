"""Which OpInfo samples test each core ATen packet (tests/test_fx_core_aten.py).

A packet is tested by the OpInfo of the same name unless `OPINFO` names another: the torch
function whose decomposition reaches the packet. ``grad_of`` cases call the backward of the
forward OpInfo inside the function (so the backward ATen op itself is what lowers). `CUSTOM`
holds the packets no OpInfo reaches, with a function and inputs of their own.
"""

from __future__ import annotations

import torch

__all__ = ["CUSTOM", "GRAD_OF", "OPINFO", "TOLERANCE"]

aten = torch.ops.aten

# packet name -> OpInfo "name" or "name:variant"
OPINFO = {
    "_adaptive_avg_pool2d": "nn.functional.adaptive_avg_pool2d",
    "_adaptive_avg_pool3d": "nn.functional.adaptive_avg_pool3d",
    "_cdist_forward": "cdist",
    "_embedding_bag": "nn.functional.embedding_bag",
    "_fft_r2c": "fft.rfft",
    "_fft_c2r": "fft.irfft",
    "_log_softmax": "log_softmax",
    "_native_batch_norm_legit_no_training": "nn.functional.batch_norm",
    "_pdist_forward": "nn.functional.pdist",
    "_softmax": "softmax",
    "adaptive_avg_pool1d": "nn.functional.adaptive_avg_pool1d",
    "addmm": "addmm",
    "avg_pool1d": "nn.functional.avg_pool1d",
    "avg_pool2d": "nn.functional.avg_pool2d",
    "avg_pool3d": "nn.functional.avg_pool3d",
    "bmm": "bmm",
    "constant_pad_nd": "constant_pad_nd",
    "convolution": "nn.functional.conv2d",
    "div": "div:floor_rounding",
    "elu": "nn.functional.elu",
    "embedding": "nn.functional.embedding",
    "gelu": "nn.functional.gelu",
    "hardtanh": "nn.functional.hardtanh",
    "leaky_relu": "nn.functional.leaky_relu",
    "max": "max:reduction_with_dim",
    "max_pool2d_with_indices": "nn.functional.max_pool2d",
    "max_pool3d_with_indices": "nn.functional.max_pool3d",
    "min": "min:reduction_with_dim",
    "reflection_pad1d": "nn.functional.pad:reflect",
    "reflection_pad2d": "nn.functional.pad:reflect",
    "reflection_pad3d": "nn.functional.pad:reflect",
    "relu": "nn.functional.relu",
    "replication_pad2d": "nn.functional.pad:replicate",
    "replication_pad3d": "nn.functional.pad:replicate",
    "round": "round",
    "scatter_reduce": "scatter_reduce:sum",
    "upsample_bilinear2d": "nn.functional.interpolate:bilinear",
    "upsample_nearest2d": "nn.functional.interpolate:nearest",
    "var": "var",
}

# backward packet name -> the OpInfo whose gradient calls it
GRAD_OF = {
    "_adaptive_avg_pool2d_backward": "nn.functional.adaptive_avg_pool2d",
    "avg_pool2d_backward": "nn.functional.avg_pool2d",
    "convolution_backward": "nn.functional.conv2d",
    "embedding_dense_backward": "nn.functional.embedding",
    "max_pool2d_with_indices_backward": "nn.functional.max_pool2d",
    "native_group_norm_backward": "native_group_norm",
    "native_layer_norm_backward": "native_layer_norm",
}


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _i(*shape: int, high: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


_MEAN, _VAR = _x(3, seed=3), _x(3, seed=4).abs()  # running statistics (constants)


def _layer_norm_backward(g, x, w, b):
    _, mean, rstd = aten.native_layer_norm.default(x, [5], w, b, 1e-5)
    return aten.native_layer_norm_backward.default(g, x, [5], mean, rstd, w, b, [True] * 3)


def _group_norm_backward(g, x, w, b):
    _, mean, rstd = aten.native_group_norm.default(x, w, b, 2, 4, 3, 2, 1e-5)
    return aten.native_group_norm_backward.default(g, x, mean, rstd, w, 2, 4, 3, 2, [True] * 3)


# packet name -> (function of tensors, tensors, direct): a direct case calls the ATen op
# itself in the model (torch's core decompositions would decompose it before the fallback)
CUSTOM = {
    "alias": (lambda x: aten.alias.default(x) * 2, [_x(3, 4)], False),
    "copy": (lambda x, y: aten.copy.default(x, y) + x, [_x(3, 4), _x(4, seed=1)], False),
    "index": (lambda x, i: x[i, 1:] * 2, [_x(5, 4), torch.tensor([3, 0, 3])], False),
    "_to_copy": (lambda x: x.to(torch.float16).to(torch.float32) * 3, [_x(3, 4)], False),
    "empty": (lambda x: aten.copy.default(aten.empty.memory_format([3, 4]), x), [_x(3, 4)], True),
    "empty_strided": (
        lambda x: aten.copy.default(aten.empty_strided.default([3, 4], [4, 1]), x) + 1,
        [_x(3, 4)],
        True,
    ),
    "arange": (lambda x: x * torch.arange(4.0) + torch.arange(1, 9, 2), [_x(3, 4)], False),
    "full": (lambda x: x + torch.full((3, 4), 2.5), [_x(3, 4)], False),
    "full_like": (lambda x: torch.full_like(x, 7.0) * x, [_x(3, 4)], False),
    "scalar_tensor": (
        lambda x: torch.where(x > 0, x, torch.scalar_tensor(0.5)),
        [_x(3, 4)],
        False,
    ),
    "as_strided": (
        lambda x: torch.as_strided(x * 1, (2, 2), (1, 2), 1) * 2,
        [_x(3, 4)],
        False,
    ),
    "lift_fresh_copy": (
        lambda x: x * torch.tensor([1.0, 2.0, 3.0, 4.0]),
        [_x(3, 4)],
        False,
    ),
    "fill": (lambda x: aten.fill.Scalar(x, 2.5) * x, [_x(3, 4)], True),
    "col2im": (
        lambda x: aten.col2im.default(x, [4, 4], [2, 2], [1, 1], [0, 0], [1, 1]),
        [_x(1, 12, 9)],
        True,
    ),
    "reflection_pad1d": (lambda x: aten.reflection_pad1d.default(x, [1, 2]), [_x(2, 3, 5)], True),
    "reflection_pad2d": (
        lambda x: aten.reflection_pad2d.default(x, [1, 2, 2, 1]),
        [_x(2, 3, 4, 5)],
        True,
    ),
    "reflection_pad3d": (
        lambda x: aten.reflection_pad3d.default(x, [1, 1, 2, 1, 1, 2]),
        [_x(1, 2, 3, 4, 5)],
        True,
    ),
    "replication_pad2d": (
        lambda x: aten.replication_pad2d.default(x, [1, 2, 2, 1]),
        [_x(2, 3, 4, 5)],
        True,
    ),
    "replication_pad3d": (
        lambda x: aten.replication_pad3d.default(x, [1, 1, 2, 1, 1, 2]),
        [_x(1, 2, 3, 4, 5)],
        True,
    ),
    "upsample_nearest2d": (
        lambda x: aten.upsample_nearest2d.default(x, [6, 8]),
        [_x(1, 2, 3, 4)],
        True,
    ),
    "avg_pool1d": (lambda x: aten.avg_pool1d.default(x, [2]), [_x(2, 3, 8)], True),
    "adaptive_avg_pool1d": (
        lambda x: aten.adaptive_avg_pool1d.default(x, [4]),
        [_x(2, 3, 8)],
        True,
    ),
    "_embedding_bag": (
        lambda w, i, o: aten._embedding_bag.default(w, i, o)[0],
        [_x(10, 3), _i(6, high=10), torch.tensor([0, 2, 5])],
        True,
    ),
    "embedding_dense_backward": (
        lambda g, i: aten.embedding_dense_backward.default(g, i, 10, -1, False),
        [_x(4, 3), _i(4, high=10)],
        True,
    ),
    "_native_batch_norm_legit": (
        lambda x, w, b: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5),
        [_x(4, 3, 2), _x(3, seed=1), _x(3, seed=2)],
        True,
    ),
    "_native_batch_norm_legit_no_training": (
        lambda x, w, b: aten._native_batch_norm_legit_no_training.default(
            x, w, b, _MEAN, _VAR, 0.1, 1e-5
        ),
        [_x(4, 3, 2), _x(3, seed=1), _x(3, seed=2)],
        True,
    ),
    "native_layer_norm_backward": (
        _layer_norm_backward,
        [_x(3, 5), _x(3, 5, seed=1), _x(5, seed=2), _x(5, seed=3)],
        True,
    ),
    "native_group_norm_backward": (
        _group_norm_backward,
        [_x(2, 4, 3), _x(2, 4, 3, seed=1), _x(4, seed=2), _x(4, seed=3)],
        True,
    ),
    "select_scatter": (
        lambda x, s: aten.select_scatter.default(x, s, 0, 1),
        [_x(3, 4), _x(4, seed=1)],
        True,
    ),
    "bitwise_and": (lambda a, b: a & b, [_i(3, 4), _i(3, 4, seed=1)], False),
    "bitwise_or": (lambda a, b: a | b, [_i(3, 4), _i(3, 4, seed=1)], False),
    "bitwise_xor": (lambda a, b: a ^ b, [_i(3, 4), _i(3, 4, seed=1)], False),
    "bitwise_not": (lambda a: ~a, [_i(3, 4)], False),
}

# packet name -> (rtol, atol) where a lowering is not eager's own kernel; the reason beside it
TOLERANCE: dict[str, tuple[float, float]] = {}
