import torch


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each token's K/V at its slot; a slot of -1 marks padding and is skipped.

    key, value: [num_tokens, num_kv_heads, head_size]
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size]
    slot_mapping: [num_tokens], slot = block_id * block_size + offset
    """
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    num_kv_heads, head_size = key_cache.shape[-2:]
    key_cache.view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, value)
