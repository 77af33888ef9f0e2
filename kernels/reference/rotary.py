import torch


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool = True,
) -> None:
    """Rotate q and k in place by their positions.

    positions: [num_tokens]
    query: [num_tokens, num_heads * head_size] (or [..., num_heads, head_size])
    key: [num_tokens, num_kv_heads * head_size]
    cos_sin_cache: [max_position, rotary_dim], cos in the first half, sin in the second
    is_neox: rotate the two halves of the head (Llama); otherwise even/odd pairs (GPT-J)
    """
    cos_sin = cos_sin_cache.index_select(0, positions)
    cos, sin = cos_sin.chunk(2, dim=-1)
    rotary_dim = cos_sin_cache.shape[-1]
    for x in (query, key):
        heads = x.view(x.shape[0], -1, head_size)
        rot = heads[..., :rotary_dim]
        if is_neox:
            x1, x2 = rot.chunk(2, dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
        c = cos.unsqueeze(1).to(x.dtype)
        s = sin.unsqueeze(1).to(x.dtype)
        out1 = x1 * c - x2 * s
        out2 = x2 * c + x1 * s
        if is_neox:
            rot.copy_(torch.cat((out1, out2), dim=-1))
        else:
            rot.copy_(torch.stack((out1, out2), dim=-1).flatten(-2))
