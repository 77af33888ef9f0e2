"""A mixture of experts in place of a layer's MLP: a router picks each token's top-k
experts, their gated MLPs run on the rows that chose them (``kernels.grouped_experts``
over experts re-laid out for the host's linear, ``kernels.fused_experts`` over the
stacked weights otherwise), and a shared expert, where the family has one, adds what
every token gets.

Checkpoints store each expert apart (``experts.{e}.gate_proj`` / ``up_proj`` /
``down_proj``, Mixtral's ``w1`` / ``w3`` / ``w2``); the engine holds them stacked, gate
and up fused as in the dense MLP. Under tensor parallelism each rank holds every
expert's share of the intermediate features (vLLM's default split), the router is
replicated, and the routed and shared outputs are summed over ranks once.
"""

from collections.abc import Callable

import torch
from torch import nn

from kernels import PackedLinear, fused_experts, grouped_experts
from kernels.quantized_weight import QuantizedWeight
from worker.models.layers import GATED_ACTIVATIONS, MLP
from worker.models.linear import Linear, pack_for_cpu
from worker.models.sharding import TensorParallel
from worker.models.traits import Activation, MoETraits


def route(
    logits: torch.Tensor, moe: MoETraits, correction_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top-k experts and their weights, as the families' routers pick
    them: scores (a softmax over every expert, or sigmoids) in fp32; where experts are
    grouped, only the token's best groups open; the top k by score (plus DeepSeek V3's
    ``correction_bias``, which picks but does not weigh); their scores rescaled to sum
    to 1 where the family does, times ``routed_scaling``."""
    logits = logits.float()
    if moe.scoring == "softmax" and moe.groups == 1 and correction_bias is None:
        return _softmax_top_k(logits, moe)
    scores = logits.sigmoid() if moe.scoring == "sigmoid" else torch.softmax(logits, dim=-1)
    choice = scores if correction_bias is None else scores + correction_bias
    if moe.groups > 1:
        grouped = choice.view(-1, moe.groups, moe.experts // moe.groups)
        if moe.group_score == "top2_sum":
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:
            group_scores = grouped.max(dim=-1).values
        best = torch.topk(group_scores, moe.top_groups, dim=-1).indices
        open_groups = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        closed = ~open_groups.repeat_interleave(moe.experts // moe.groups, dim=-1)
        choice = choice.masked_fill(closed, float("-inf"))
    ids = torch.topk(choice, moe.top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if moe.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scaling, ids


def _softmax_top_k(logits: torch.Tensor, moe: MoETraits) -> tuple[torch.Tensor, torch.Tensor]:
    """``route`` for a plain softmax router in two ops where it can: the top k of the
    logits are those of the softmax, and rescaled to sum to 1 their weights are the
    softmax of the k alone (Mixtral, Qwen3-MoE; a batch-1 decode step pays for every op)."""
    top, ids = torch.topk(logits, moe.top_k, dim=-1)
    if moe.renormalize:
        weights = torch.softmax(top, dim=-1)
    else:  # each over the whole softmax's sum
        weights = torch.exp(top - torch.logsumexp(logits, dim=-1, keepdim=True))
    return weights * moe.routed_scaling if moe.routed_scaling != 1.0 else weights, ids


class Experts(nn.Module):
    """Every expert's gate/up and down weights, stacked; or, from a GGUF file's blocks
    (``use_quantized``), one block layer per expert and projection, as the dense
    projections' (re-laid out, de-quantized tiles or copies for many rows). On a CPU
    the stacked weights are also re-laid out per expert for the fastest linear the
    host has (``pack``), as the dense layers are."""

    # Each expert's (gate/up, down) as callables on its rows, where they run apart.
    per_expert: list[tuple[Callable[[torch.Tensor], torch.Tensor], ...]] | None = None

    def __init__(self, moe: MoETraits, hidden: int, tp: TensorParallel) -> None:
        super().__init__()
        size = tp.split(moe.intermediate, "expert intermediate features")
        self.gate_up_proj = nn.Parameter(torch.empty(moe.experts, 2 * size, hidden))
        self.down_proj = nn.Parameter(torch.empty(moe.experts, hidden, size))
        self.gate_up_blocks = nn.ModuleList()
        self.down_blocks = nn.ModuleList()

    def use_quantized(self, gate_up: list[QuantizedWeight], down: list[QuantizedWeight]) -> None:
        """Serve expert e from ``gate_up[e]`` and ``down[e]``; the stacked floats are dropped."""
        self.gate_up_blocks.extend(_block_layer(weight) for weight in gate_up)
        self.down_blocks.extend(_block_layer(weight) for weight in down)
        self.register_parameter("gate_up_proj", None)
        self.register_parameter("down_proj", None)

    def pack(self) -> None:
        """After the model's block layers are packed (``CausalLM.pack_weights``)."""
        if len(self.gate_up_blocks):
            self.per_expert = list(zip(self.gate_up_blocks, self.down_blocks, strict=True))
            return
        forms = [
            (pack_for_cpu(gate_up), pack_for_cpu(down))
            for gate_up, down in zip(self.gate_up_proj, self.down_proj, strict=True)
        ]
        if all(gate_up and down for gate_up, down in forms):
            self.per_expert = [(_unbiased(gate_up), _unbiased(down)) for gate_up, down in forms]

    def run_expert(
        self, expert: int, rows: torch.Tensor, act_and_mul: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        assert self.per_expert is not None
        gate_up, down = self.per_expert[expert]
        return down(act_and_mul(gate_up(rows)))


def _block_layer(weight: QuantizedWeight) -> Linear:
    layer = Linear(weight.in_features, weight.out_features, bias=False, device="meta")
    layer.use_quantized(weight)
    return layer


def _unbiased(linear: PackedLinear | None) -> Callable[[torch.Tensor], torch.Tensor]:
    assert linear is not None
    return lambda rows: linear(rows, None)


class SparseMoE(nn.Module):
    def __init__(
        self, hidden: int, moe: MoETraits, activation: Activation, tp: TensorParallel
    ) -> None:
        super().__init__()
        self.moe = moe
        self.tp = tp
        self.activation = activation
        self.gate = Linear(hidden, moe.experts, bias=False)  # the router
        self.experts = Experts(moe, hidden, tp)
        if moe.shared_intermediate:
            self.shared_expert = MLP(hidden, moe.shared_intermediate, False, activation, tp)
        if moe.shared_gate:
            self.shared_expert_gate = Linear(hidden, 1, bias=False)
        self.e_score_correction_bias = (
            nn.Parameter(torch.empty(moe.experts)) if moe.correction_bias else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.moe, self.e_score_correction_bias)
        experts = self.experts
        if experts.per_expert is not None:
            gated = GATED_ACTIVATIONS[self.activation]
            out = grouped_experts(
                x, weights, ids, lambda e, rows: experts.run_expert(e, rows, gated)
            )
        else:
            out = fused_experts(
                x, experts.gate_up_proj, experts.down_proj, weights, ids, self.activation
            )
        if self.moe.shared_intermediate:
            shared = self.shared_expert.partial(x)
            if self.moe.shared_gate:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return self.tp.all_reduce(out)
