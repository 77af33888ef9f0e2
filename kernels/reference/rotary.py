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
    cos, sin = cos_sin_cache.index_select(0, positions).to(query.dtype).unsqueeze(1).chunk(2, -1)
    rotary_dim = cos_sin_cache.shape[-1]
    for x in (query, key):
        rot = x.view(x.shape[0], -1, head_size)[..., :rotary_dim]
        x1, x2 = rot.chunk(2, dim=-1) if is_neox else (rot[..., 0::2], rot[..., 1::2])
        out1 = x1 * cos - x2 * sin
        out2 = x2 * cos + x1 * sin
        x1.copy_(out1)
        x2.copy_(out2)
