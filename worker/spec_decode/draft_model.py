"""Speculative decoding with a draft model (vLLM's ``{"model": ..., "num_speculative_tokens": k}``).

The draft is a smaller model with the target's vocabulary, run in the engine's
process with its own KV cache laid out on the *same block ids* as the target's:
a block that holds a sequence's tokens holds both models' K/V, so the block
manager, preemption and the prefix cache serve both unchanged, and a block costs
what both caches take (the KV budget counts it).

After every step the draft catches up: one forward over, for every running
sequence, the tokens the target computed in that step and a decoding sequence's
newest token, so its cache keeps step with the target's (as many tokens as the
step ran, plus one per sequence). For a decoding sequence that speculates, that
forward's last position gives the first draft (the draft's greedy choice), and
k - 1 one-token forwards give the rest. The target verifies them in its next step;
a sampled sequence accepts a draft with the target's probability of it (the draft
is a point mass), so outputs follow the target's distribution whatever the draft
proposes. K/V the draft wrote for tokens that were not kept is written again:
``Sequence.num_draft_computed_tokens`` falls back to the last position whose token
the draft saw (the engine clamps it as tokens are appended).
"""

from pathlib import Path

import torch

from worker.config import EngineConfig, SpeculativeConfig
from worker.engine.block_manager import BlockManager
from worker.engine.sequence import Sequence
from worker.execution.model_runner import ModelRunner, max_step_seqs
from worker.execution.step_buffers import Query
from worker.model_fetch import resolve_model
from worker.models.decoder import CausalLM
from worker.models.loader import load_model
from worker.spec_decode.proposers import draft_room, is_decoding, keep_to_grammar, speculation_off


def load_draft_model(
    config: EngineConfig, max_model_len: int, vocab_size: int
) -> tuple[CausalLM, Path]:
    """The draft model of ``config.speculative_config``, in the engine's dtype and device;
    ValueError when its vocabulary is not the target's."""
    spec = config.speculative_config
    assert spec is not None and spec.model is not None
    device = torch.device(config.device)
    path = resolve_model(spec.model, device.type)
    model = load_model(path, config.torch_dtype, device, max_model_len)
    if model.config.vocab_size != vocab_size:
        raise ValueError(
            f"the draft model {spec.model} has a vocabulary of {model.config.vocab_size} "
            f"tokens, the target's {vocab_size}: a draft must share the target's tokenizer"
        )
    return model, path


class DraftModelProposer:
    def __init__(
        self,
        spec: SpeculativeConfig,
        config: EngineConfig,
        model: CausalLM,
        block_manager: BlockManager,
        reserved_blocks: int,
        max_model_len: int,
    ) -> None:
        self.spec = spec
        self.kv = block_manager
        self.reserved_blocks = reserved_blocks
        self.max_model_len = max_model_len
        # Eager (no CUDA graphs) on the target's blocks; room for a catch-up of a whole
        # step plus every sequence's newest token.
        draft_config = config.model_copy(
            update={"num_gpu_blocks_override": block_manager.num_blocks, "enforce_eager": True}
        )
        extra_rows = max_step_seqs(config, max_model_len)
        self.runner = ModelRunner(draft_config, model, max_model_len, extra_rows=extra_rows)

    def propose(self, running: list[Sequence]) -> None:
        off = speculation_off(self.spec, running)
        queries: list[Query] = []
        proposing: list[tuple[Sequence, int]] = []
        for seq in running:
            if seq.draft_token_ids:
                continue  # left out of the last step: its drafts still stand
            decoding = is_decoding(seq)
            end = seq.num_tokens if decoding else seq.num_computed_tokens
            k = 0 if off or not decoding else draft_room(self.spec, seq, self.max_model_len)
            # Slots for the newest token and the k - 1 drafts the draft model reads back.
            if k and not self._reserve(seq, end + k - 1):
                k = 0
            if decoding and not k and not self._reserve(seq, end):
                end -= 1  # the newest token waits for the target's next step
            start = seq.num_draft_computed_tokens
            if end <= start:
                continue
            queries.append(Query(seq.token_ids[start:end], start, seq.block_ids, 1 if k else 0))
            seq.num_draft_computed_tokens = end
            if k:
                proposing.append((seq, k))
        if not queries:
            return
        choices = self.runner.run(queries).argmax(dim=-1).tolist()
        for (seq, _), choice in zip(proposing, choices, strict=True):
            seq.draft_token_ids = [choice]
        for position in range(1, max((k for _, k in proposing), default=0)):
            extending = [seq for seq, k in proposing if k > position]
            queries = [
                Query([seq.draft_token_ids[-1]], seq.num_tokens + position - 1, seq.block_ids, 1)
                for seq in extending
            ]
            choices = self.runner.run(queries).argmax(dim=-1).tolist()
            for seq, choice in zip(extending, choices, strict=True):
                seq.draft_token_ids.append(choice)
                seq.num_draft_computed_tokens += 1
        for seq, _ in proposing:
            keep_to_grammar(seq)

    def _reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Cache slots for ``num_tokens`` of ``seq``, never from the watermark."""
        if self.kv.blocks_needed(num_tokens) <= len(seq.block_ids):
            return True
        return self.kv.allocate_slots(seq, num_tokens, reserved_blocks=self.reserved_blocks)
