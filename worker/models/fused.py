"""Checkpoint projections the engine stores fused (q/k/v, gate/up), in fusing order."""

from transformers import PretrainedConfig

from worker.models.traits import head_dim_of

# Checkpoint name -> (fused name, shard index).
FUSED_SHARDS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def checkpoint_parts(module: str) -> list[str]:
    """The checkpoint modules that engine module ``module`` is made of, in order."""
    *parent, leaf = module.split(".")
    parts = sorted((shard, name) for name, (fused, shard) in FUSED_SHARDS.items() if fused == leaf)
    return [".".join([*parent, name]) for _, name in parts] or [module]


def part_rows(module: str, config: PretrainedConfig) -> list[tuple[str, slice]]:
    """A checkpoint that stores ``module`` fused as the engine does (Phi-3's
    ``qkv_proj`` and ``gate_up_proj``): each part and its rows in the whole tensor,
    so that it is split over ranks and checked as the separate parts are; [] for a
    module the engine does not fuse."""
    parts = checkpoint_parts(module)
    if len(parts) == 1:
        return []
    if module.endswith("qkv_proj"):
        head_dim = head_dim_of(config)
        q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
        sizes = [q, kv, kv]
    else:
        sizes = [config.intermediate_size] * 2
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [
        (part, slice(start, start + size))
        for part, start, size in zip(parts, starts, sizes, strict=True)
    ]
