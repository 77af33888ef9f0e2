import torch


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm over the last dim, with an optional residual added first.

    Returns ``(normed, new_residual)`` where ``new_residual = x + residual``
    (``None`` when no residual was given). The reduction runs in fp32 and the
    result is cast back before the weight multiply, as Llama defines it.
    """
    if residual is not None:
        x = x + residual
        residual = x
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype), residual
