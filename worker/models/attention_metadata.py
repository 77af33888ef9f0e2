from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """The flattened step, as the attention kernels read it.

    slot_mapping: [num_tokens] cache slot of each new token
    block_tables: [num_seqs, max_blocks] block ids of each sequence
    seq_lens: [num_seqs] tokens in cache per sequence after this step
    query_start_loc: [num_seqs + 1] where each sequence's tokens start
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
