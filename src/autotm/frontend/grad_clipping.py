"""Gradient clipping inside the compiled step, kernel for kernel like torch.nn.utils.

A compiled step runs forward, backward and update as one graph, so the user's loop has no
place between backward and step for `clip_grad_norm_(model.parameters(), max_norm)` or
`clip_grad_value_`. `autotm.compile(..., clip_grad_norm=max_norm)` (or `clip_grad_value=`)
traces the clip into the graph instead, between the gradients and the optimizer update.

Eager's default (foreach=None) on CPU runs `_foreach_norm` and `_foreach_mul_` (or
`_foreach_clamp_min_`/`_foreach_clamp_max_`), whose CPU kernels are loops of the single-tensor
kernels (`linalg_vector_norm`, `mul`, `clamp_min`, `clamp_max`). The clip here calls those
single-tensor kernels one gradient at a time: the same kernels on the same values, and each
one needs only its own gradient in fast memory (a foreach kernel would need all of them at
once, raising the smallest feasible budget to the sum of the gradients).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import CaptureError


@dataclass(frozen=True)
class GradClip:
    """What `clip_grad_norm_(params, max_norm, norm_type)` or `clip_grad_value_(params,
    clip_value)` would do between backward and step; at most one of the two."""

    max_norm: float | None = None
    norm_type: float = 2.0
    clip_value: float | None = None

    def __post_init__(self):
        if self.max_norm is not None and self.clip_value is not None:
            raise CaptureError("clip_grad_norm and clip_grad_value together: eager code would call one after the "
                               "other in an order autotm cannot know; pass one")
        for name, v in (("clip_grad_norm", self.max_norm), ("clip_grad_value", self.clip_value),
                        ("clip_norm_type", self.norm_type)):
            if v is not None and not isinstance(v, (int, float)):
                raise CaptureError(f"{name} must be a number, not {type(v).__name__}")
        if self.max_norm is not None and not (self.norm_type > 0 or math.isinf(self.norm_type)):
            raise CaptureError(f"clip_norm_type must be positive or inf, not {self.norm_type}")

    def apply(self, grads: list[torch.Tensor], params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The clipped gradients, new tensors. `grads`: every trainable parameter's gradient in
        `model.parameters()` order (eager's order for the total norm); `params`: the
        parameters, whose strides eager's `.grad` has (AccumulateGrad lays it out so)."""
        if not grads:
            return grads
        if len({(g.device, g.dtype) for g in grads}) > 1:
            # eager groups the norms by device and dtype first, in an order of its own
            raise CaptureError("clip_grad_norm/clip_grad_value over gradients of several dtypes is not supported")
        if self.clip_value is not None:
            v = float(self.clip_value)
            return [g.clamp_min(-v).clamp_max(v) for g in grads]
        # a reduction's order follows the memory layout: reduce eager's .grad layout
        grads = [g if g.stride() == p.stride() else _like(g, p) for g, p in zip(grads, params)]
        norm_type = float(self.norm_type)
        norms = [torch.linalg.vector_norm(g, norm_type) for g in grads]
        total_norm = torch.linalg.vector_norm(torch.stack(norms), norm_type)
        clip_coef = float(self.max_norm) / (total_norm + 1e-6)  # type: ignore[arg-type]
        clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
        return [g.mul(clip_coef_clamped) for g in grads]


def _like(g: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`g` copied into `p`'s layout, as AccumulateGrad's clone_obey_contract lays out `.grad`:
    `p`'s strides where `p` is dense, else contiguous. (A copy: exact.)"""
    from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

    if not is_non_overlapping_and_dense(p):
        return g.contiguous()
    # p's dims from outermost to innermost in memory; g in that order, made contiguous
    strides = p.stride()
    order = sorted(range(p.dim()), key=lambda d: -strides[d])
    inverse = sorted(range(p.dim()), key=lambda d: order[d])
    return g.permute(order).contiguous().permute(inverse)
