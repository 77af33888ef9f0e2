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
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_size], in the
        keys' dtype or an fp8 one
    slot_mapping: [num_tokens], slot = block_id * block_size + offset
    """
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    num_kv_heads, head_size = key_cache.shape[-2:]
    for new, cache in ((key, key_cache), (value, value_cache)):
        # An fp8 cache takes the values rounded to its format (e4m3fn saturates at +-448),
        # copied as bytes: torch has no fp8 index_copy on CPU.
        new = new.to(cache.dtype)
        if cache.element_size() == 1:
            new, cache = new.view(torch.uint8), cache.view(torch.uint8)
        cache.view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, new)
