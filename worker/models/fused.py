"""Checkpoint projections the engine stores fused (q/k/v, gate/up), in fusing order."""

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
