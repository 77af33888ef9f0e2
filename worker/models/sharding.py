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

Each rank reads only its part of the checkpoint (``split_of``, ``Split.take``), so its
weights take about 1/size of the memory.
"""

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
# Split by attention heads: q, and multi-head latent attention's q_b and kv_b (each
# head's rows together; its latent projection is whole on every rank).
HEAD_PARALLEL = ("q_proj", "q_b_proj", "kv_b_proj")


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

    def split_of(self, name: str, shape: list[int], config: PretrainedConfig) -> "Split | None":
        """This rank's part of checkpoint tensor ``name`` (of ``shape``, out features
        first); None: the whole tensor (replicated, or no parallelism)."""
        if self.size == 1:
            return None
        parts = name.split(".")
        module = parts[-2] if len(parts) >= 2 else ""
        if module in VOCAB_PARALLEL:
            first, _, real = self.vocab_rows(shape[0])
            return Split(0, first, real)
        if module in ROW_PARALLEL:
            if parts[-1] == "bias":  # added once, after the all-reduce: rank 0's
                return None if self.rank == 0 else Split(0, 0, shape[0], zeros=True)
            local = self.split(shape[1], f"{module} input features")
            return Split(1, self.rank * local, local)
        if module in HEAD_PARALLEL:
            head_dim = shape[0] // config.num_attention_heads
            local = self.split(config.num_attention_heads, "attention heads") * head_dim
            return Split(0, self.rank * local, local)
        if module in ("k_proj", "v_proj"):
            kv_dim = shape[0] // config.num_key_value_heads
            heads, first = self.kv_heads(config.num_key_value_heads)
            return Split(0, first * kv_dim, heads * kv_dim)
        if module in COLUMN_PARALLEL:
            local = self.split(shape[0], f"{module} output features")
            return Split(0, self.rank * local, local)
        return None


@dataclass(frozen=True)
class Split:
    """``length`` entries from ``start`` along ``dim`` (0: output features, 1: input
    features); ``zeros``: this rank holds zeros of the tensor's shape."""

    dim: int
    start: int
    length: int
    zeros: bool = False

    def take(self, view: Any) -> torch.Tensor:
        """This part of ``view``, a safetensors slice or a tensor."""
        if self.zeros:
            return torch.zeros(self.length)
        end = self.start + self.length
        return view[self.start : end] if self.dim == 0 else view[:, self.start : end]

    def take_blocks(self, data: torch.Tensor, block_size: int, block_bytes: int) -> torch.Tensor:
        """This part of a quantized weight's bytes ``[out_features, row bytes]``: whole
        rows, or whole blocks of each row (ValueError where a block would be cut)."""
        if self.dim == 0:
            return data[self.start : self.start + self.length]
        if self.start % block_size or self.length % block_size:
            raise ValueError(
                f"{self.length} input features per rank do not split into whole blocks of "
                f"{block_size}: choose a tensor_parallel_size that does"
            )
        first = self.start // block_size * block_bytes
        return data[:, first : first + self.length // block_size * block_bytes]
