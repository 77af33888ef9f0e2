"""SiLU-and-mul for the gated MLP; programs over (rows, column blocks)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(
    out_ptr,  # [rows, d]
    x_ptr,  # [rows, 2 * d]: gate | up
    d,
    stride_out, stride_x,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * stride_out + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


BLOCK = 1024


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Same contract as ``kernels.reference.silu_and_mul``."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    out = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        grid = (x2.shape[0], triton.cdiv(d, BLOCK))
        _silu_and_mul_kernel[grid](out, x2, d, out.stride(0), x2.stride(0), BLOCK=BLOCK)
    return out.view(*x.shape[:-1], d)
