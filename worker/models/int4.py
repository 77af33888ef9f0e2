"""GPTQ and AWQ int4 checkpoints, served on the GGUF kernels.

A Hugging Face folder whose ``config.json`` carries a GPTQ or AWQ
``quantization_config`` (4 bits, groups of 32, 64 or 128 inputs, GPTQ without
``desc_act``) stores each projection as 4-bit values ``q``, a fp16 scale ``s`` and
a 4-bit zero ``z`` per group: ``w = s * (q - z)``. That is GGUF's Q4_1 exactly
(``w = d * q + m`` per 32 inputs) with ``d = s`` and ``m = -s * z``, so each
projection is re-packed at load into Q4_1 blocks and runs on the same kernels.
The one rounding: ``m`` is stored in fp16, off by at most half its ulp: 2^-11 of
``s * z``, and since ``z <= 15`` under 0.8 % of a quantization step ``s``.

Packings, as the formats' writers lay them out:
- GPTQ: ``qweight`` int32 [in / 8, out], 8 inputs per word (input 8i + j in
  bits 4j); ``qzeros`` int32 [groups, out / 8], 8 outputs per word; stored zeros
  are ``z - 1`` (``checkpoint_format`` gptq; ``gptq_v2`` stores ``z``).
- AWQ (GEMM): ``qweight`` int32 [in, out / 8] and ``qzeros`` [groups, out / 8],
  8 outputs per word in the order 0, 2, 4, 6, 1, 3, 5, 7 (nibble i holds output
  ``AWQ_ORDER[i]`` of the eight).
"""

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kernels.quantized_weight import QuantizedWeight
from worker.models.decoder import CausalLM
from worker.models.fused import checkpoint_parts
from worker.models.linear import Linear
from worker.models.sharding import Split

BLOCK = 32  # Q4_1's block of inputs
GROUP_SIZES = (32, 64, 128)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")


@dataclass(frozen=True)
class Int4Scheme:
    method: str  # "gptq" or "awq"
    group_size: int
    zeros_minus_one: bool  # GPTQ's "gptq" checkpoint format

    @property
    def name(self) -> str:
        return f"{self.method.upper()} int4 g{self.group_size}"


def int4_scheme(config: Any) -> Int4Scheme | None:
    """The checkpoint's int4 scheme, None without a quantization config; ValueError for
    one that cannot run here, saying why."""
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return None
    if not isinstance(quantization, Mapping):
        quantization = quantization.to_dict()
    method = str(quantization.get("quant_method", "")).lower()
    if method not in ("gptq", "awq"):
        raise ValueError(f"quantization {method!r} is not supported; supported: gptq, awq")
    if quantization.get("bits", quantization.get("w_bit")) != 4:
        raise ValueError(f"{method} checkpoints run with 4 bits, not {quantization.get('bits')}")
    group_size = quantization.get("group_size", quantization.get("q_group_size"))
    if group_size not in GROUP_SIZES:
        raise ValueError(f"{method} group_size must be one of {GROUP_SIZES}, not {group_size}")
    if method == "gptq" and quantization.get("desc_act"):
        raise ValueError("gptq checkpoints with desc_act (reordered groups) are not supported")
    if method == "awq" and (
        str(quantization.get("version", "gemm")).lower() != "gemm"
        or not quantization.get("zero_point", True)
    ):
        raise ValueError("awq checkpoints run in the GEMM packing with zero points")
    zeros_minus_one = method == "gptq" and quantization.get("checkpoint_format", "gptq") == "gptq"
    return Int4Scheme(method, int(group_size), zeros_minus_one)


def _nibbles(words: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """int32 words -> their 8 nibbles each along a new last axis, nibble ``order[i]`` i-th."""
    shifts = torch.tensor([4 * i for i in order], dtype=torch.int32)
    return (words.to(torch.int32)[..., None] >> shifts) & 0xF


def unpack(
    scheme: Int4Scheme, tensors: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q [out, in], z [out, groups], s [out, groups])`` from one module's tensors."""
    scales = tensors["scales"].to(torch.float16)
    groups, out_features = scales.shape
    if scheme.method == "gptq":
        g_idx = tensors.get("g_idx")
        in_features = tensors["qweight"].shape[0] * 8
        if g_idx is not None and not torch.equal(
            g_idx.to(torch.int64), torch.arange(in_features) // scheme.group_size
        ):
            raise ValueError("gptq g_idx reorders the groups (desc_act): not supported")
        q = _nibbles(tensors["qweight"]).permute(0, 2, 1).reshape(in_features, out_features)
        zeros = _nibbles(tensors["qzeros"]).reshape(groups, out_features)
        zeros = zeros + 1 if scheme.zeros_minus_one else zeros
    else:
        inverse = tuple(AWQ_ORDER.index(i) for i in range(8))
        q = _nibbles(tensors["qweight"], inverse).reshape(-1, out_features)
        zeros = _nibbles(tensors["qzeros"], inverse).reshape(groups, out_features)
    return q.T.contiguous(), zeros.T.contiguous(), scales.T.contiguous()


def to_q4_1(
    q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> QuantizedWeight:
    """``w = s * (q - z)`` per group as Q4_1 blocks (``d = s``, ``m = -s z`` in fp16)."""
    out_features, in_features = q.shape
    if in_features % group_size:
        raise ValueError(f"{in_features} inputs are not whole groups of {group_size}")
    blocks = in_features // BLOCK
    group = torch.arange(blocks) * BLOCK // group_size  # each block's group
    d = scales[:, group]
    m = (-(scales.float() * zeros.float())[:, group]).to(torch.float16)
    values = q.to(torch.uint8).view(out_features, blocks, BLOCK)
    nibbles = values[..., :16] | (values[..., 16:] << 4)
    halves = torch.stack([d, m], dim=-1).view(torch.uint8).view(out_features, blocks, 4)
    data = torch.cat([halves, nibbles], dim=-1).reshape(out_features, -1)
    return QuantizedWeight(GGMLQuantizationType.Q4_1, data, out_features, in_features)


def _shape(scheme: Int4Scheme, tensors: Mapping[str, torch.Tensor]) -> list[int]:
    """A quantized projection's ``[out_features, in_features]``."""
    groups, out_features = tensors["scales"].shape
    return [int(out_features), int(groups) * scheme.group_size]


def load_int4(
    scheme: Int4Scheme,
    parts: Sequence[Mapping[str, torch.Tensor]],
    splits: Sequence[Split | None],
) -> QuantizedWeight:
    """One engine projection from its checkpoint parts (q/k/v or gate/up fused by rows);
    with ``splits``, each part's share for this tensor-parallel rank, in whole Q4_1
    blocks (exact: each block has its own scale and min, whatever the group size)."""
    weights = [to_q4_1(*unpack(scheme, part), scheme.group_size) for part in parts]
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType.Q4_1][1]
    blocks = [
        weight.data if split is None else split.take_blocks(weight.data, BLOCK, block_bytes)
        for weight, split in zip(weights, splits, strict=True)
    ]
    data = torch.cat(blocks)
    in_features = data.shape[1] // block_bytes * BLOCK
    return QuantizedWeight(GGMLQuantizationType.Q4_1, data, data.shape[0], in_features)


def use_int4(
    model: CausalLM,
    scheme: Int4Scheme,
    tensors: Iterable[tuple[str, torch.Tensor]],
    device: torch.device,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Put every quantized projection of the checkpoint in place (as Q4_1 blocks on
    ``device``; this rank's blocks under tensor parallelism, the packed tensors read
    whole); the checkpoint's other tensors follow, for the caller to copy in."""
    quantized: dict[str, dict[str, torch.Tensor]] = {}
    rest = []
    for name, tensor in tensors:
        module, _, suffix = name.rpartition(".")
        if suffix in SUFFIXES:
            quantized.setdefault(module, {})[suffix] = tensor
        else:
            rest.append((name, tensor))
    tp, config = model.tp, model.config
    for name, linear in model.named_modules():
        parts = checkpoint_parts(name)
        if isinstance(linear, Linear) and all(part in quantized for part in parts):
            found = [quantized.pop(part) for part in parts]
            shapes = [_shape(scheme, part) for part in found]
            splits = [
                tp.split_of(f"{part}.weight", shape, config)
                for part, shape in zip(parts, shapes, strict=True)
            ]
            linear.use_quantized(load_int4(scheme, found, splits).to(device))
    if quantized:
        raise ValueError(
            f"{scheme.method} tensors with no projection to fill: {sorted(quantized)[:3]}"
        )
    return iter(rest)
