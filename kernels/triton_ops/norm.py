"""RMSNorm with an optional fused residual add; one program per row."""

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    out_ptr,  # [rows, hidden]
    residual_out_ptr,  # [rows, hidden], written when HAS_RESIDUAL
    x_ptr,  # [rows, hidden]
    residual_ptr,  # [rows, hidden], read when HAS_RESIDUAL
    weight_ptr,  # [hidden]
    eps,
    hidden,
    stride_out, stride_res_out, stride_x, stride_res,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    dtype = x_ptr.dtype.element_ty
    # All arithmetic in fp32, rounded to the activation dtype where the unfused
    # model rounds (the residual sum, the normalized value, the output).
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x + residual.to(tl.float32)).to(dtype)
        tl.store(residual_out_ptr + row * stride_res_out + cols, x, mask=mask)
        x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
    normed = (x * rstd).to(dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (weight * normed).to(dtype), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same contract as ``kernels.reference.rms_norm``."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    out = torch.empty_like(x2)
    residual_in = residual.reshape(-1, hidden) if residual is not None else x2
    residual_out = torch.empty_like(x2) if residual is not None else out
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            out, residual_out, x2, residual_in, weight, eps, hidden,
            out.stride(0), residual_out.stride(0), x2.stride(0), residual_in.stride(0),
            HAS_RESIDUAL=residual is not None,
            BLOCK=triton.next_power_of_2(hidden),
        )  # fmt: skip
    new_residual = residual_out.view(x.shape) if residual is not None else None
    return out.view(x.shape), new_residual
