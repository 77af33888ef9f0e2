"""How a model splits across tensor-parallel ranks (Megatron-style), and the
collectives its forward needs.

Per decoder layer: q/k/v and gate/up are split by output features (column
parallel: each rank holds its attention heads and its share of the MLP's
intermediate features), o_proj and down_proj by input features (row parallel:
each rank's partial sums meet in one all-reduce each). KV heads are divided too;
where ranks outnumber them, each KV head is replicated on ``size / num_kv_heads``
ranks, as vLLM does. The embedding and the output layer are split by vocabulary
(padded to a multiple of the ranks): a lookup outside a rank's rows gives zeros
and an all-reduce sums the one rank that has it; logits come together in one
all-gather. A row-parallel bias is added once: rank 0 holds it, the others zeros.
Norms are replicated.

Each rank reads only its slices of the checkpoint (``checkpoint_slice``), so its
weights take about 1/size of the memory.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from transformers import PretrainedConfig

# Checkpoint module name -> the dimension its weight is split along (0: output
# features, 1: input features), for the projections inside a decoder layer.
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
VOCAB_PARALLEL = ("embed_tokens", "lm_head")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class TensorParallel:
    """This process's place among ``size`` ranks (size 1: no parallelism, no group)."""

    rank: int = 0
    size: int = 1

    def split(self, total: int, what: str) -> int:
        """This rank's share of ``total`` ``what``; ValueError where it does not divide."""
        if total % self.size:
            raise ValueError(
                f"tensor_parallel_size {self.size} does not divide the model's {total} {what}"
            )
        return total // self.size

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """(KV heads on this rank, index of its first): a share of them, or one
        replicated head where ranks outnumber them."""
        if num_kv_heads >= self.size:
            local = self.split(num_kv_heads, "KV heads")
            return local, self.rank * local
        if self.size % num_kv_heads:
            raise ValueError(
                f"tensor_parallel_size {self.size} is neither a divisor nor a multiple of the "
                f"model's {num_kv_heads} KV heads"
            )
        return 1, self.rank * num_kv_heads // self.size

    def vocab_rows(self, vocab_size: int) -> tuple[int, int, int]:
        """(first vocabulary row of this rank, rows it holds, rows that are real)."""
        local = _cdiv(vocab_size, self.size)
        first = self.rank * local
        return first, local, max(0, min(local, vocab_size - first))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in place."""
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` side by side along the last dimension."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def minimum(self, value: int) -> int:
        """The least of every rank's ``value`` (the KV blocks all ranks can hold)."""
        if self.size == 1:
            return value
        tensor = torch.tensor([value])
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
        return int(tensor.item())

    def checkpoint_slice(
        self, name: str, shape: list[int], config: PretrainedConfig
    ) -> Callable[[Any], torch.Tensor] | None:
        """How this rank takes checkpoint tensor ``name`` (of ``shape``) from a
        safetensors slice, reading only its part; None: whole (replicated)."""
        if self.size == 1:
            return None
        parts = name.split(".")
        module = parts[-2] if len(parts) >= 2 else ""
        is_bias = parts[-1] == "bias"
        head_dim = shape[0] // config.num_attention_heads if module == "q_proj" else None
        if module in VOCAB_PARALLEL:
            first, _, real = self.vocab_rows(shape[0])
            return lambda view: view[first : first + real]
        if module in ROW_PARALLEL:
            if is_bias:  # added once, after the all-reduce: rank 0's
                keep = self.rank == 0
                return lambda view: view[:] if keep else torch.zeros(shape)
            local = self.split(shape[1], f"{module} input features")
            start = self.rank * local
            return lambda view: view[:, start : start + local]
        if module not in COLUMN_PARALLEL:
            return None
        if module == "q_proj":
            assert head_dim is not None
            local = self.split(config.num_attention_heads, "attention heads") * head_dim
            start = self.rank * local
        elif module in ("k_proj", "v_proj"):
            kv_dim = shape[0] // config.num_key_value_heads
            heads, first = self.kv_heads(config.num_key_value_heads)
            local, start = heads * kv_dim, first * kv_dim
        else:
            local = self.split(shape[0], f"{module} output features")
            start = self.rank * local
        return lambda view: view[start : start + local]
