"""SiLU- and GeLU(tanh)-and-mul for the gated MLPs; programs over (rows, column blocks)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _gated_kernel(
    out_ptr,  # [rows, d]
    x_ptr,  # [rows, 2 * d]: gate | up
    d,
    stride_out, stride_x,
    GELU_TANH: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU_TANH:  # 0.5 g (1 + tanh(u)) = g * sigmoid(2u), u = sqrt(2 / pi) (g + 0.044715 g^3)
        u = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = gate / (1.0 + tl.exp(-2.0 * u))
    else:
        act = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * stride_out + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


BLOCK = 1024


def _gated(x: torch.Tensor, gelu_tanh: bool) -> torch.Tensor:
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    out = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        grid = (x2.shape[0], triton.cdiv(d, BLOCK))
        _gated_kernel[grid](
            out, x2, d, out.stride(0), x2.stride(0), GELU_TANH=gelu_tanh, BLOCK=BLOCK
        )
    return out.view(*x.shape[:-1], d)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Same contract as ``kernels.reference.silu_and_mul``."""
    return _gated(x, gelu_tanh=False)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Same contract as ``kernels.reference.gelu_tanh_and_mul``."""
    return _gated(x, gelu_tanh=True)
