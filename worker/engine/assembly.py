"""An engine's parts built from its config: the model (sharded over tensor-parallel
ranks when asked), the KV cache and its runner, the tokenizer, the scheduler, the
block pool and the draft proposer."""

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from queue_schemas.sampling import SamplingOptions
from worker.config import EngineConfig
from worker.device import dtype_name
from worker.engine.block_manager import BlockManager
from worker.engine.generation_config import describe as describe_defaults
from worker.engine.generation_config import generation_config_folder, sampling_defaults
from worker.engine.scheduler import Scheduler
from worker.engine.tokenizer import eos_token_ids, load_tokenizer
from worker.execution.kv_sizing import describe
from worker.execution.model_runner import ModelRunner, kv_bytes_per_block
from worker.execution.ranks import Ranks, check_layout, rank_threads
from worker.model_fetch import resolve_model
from worker.models.footprint import WeightFootprint, weight_footprint
from worker.models.loader import load_config, load_model
from worker.sampling.structured_output import Grammars
from worker.spec_decode.draft_model import DraftModelProposer, load_draft_model
from worker.spec_decode.proposers import NgramProposer, Proposer

log = logging.getLogger("genfleet.engine")


@dataclass
class EngineParts:
    config: EngineConfig
    max_model_len: int
    sampling_defaults: SamplingOptions
    ranks: Ranks | None
    runner: ModelRunner
    vocab_size: int
    tokenizer: PreTrainedTokenizerBase | None
    eos_token_ids: set[int]
    grammars: Grammars | None
    weights: WeightFootprint
    block_manager: BlockManager
    scheduler: Scheduler
    proposer: Proposer | None


def assemble(config: EngineConfig) -> EngineParts:
    """Every part, or the error that stopped it with the other ranks ended."""
    config = config.resolved()
    model_path = resolve_model(config.model, torch.device(config.device).type)
    hf_config = load_config(model_path)
    max_model_len = config.max_model_len or hf_config.max_position_embeddings
    if not config.enable_chunked_prefill:
        # Without chunking a whole (recomputed) sequence must fit one step.
        tokens = max(config.max_num_batched_tokens, max_model_len)
        config = config.model_copy(update={"max_num_batched_tokens": tokens})
    torch.manual_seed(config.seed)
    ranks = None
    if config.tensor_parallel_size > 1:
        torch.set_num_threads(rank_threads(config))
        check_layout(hf_config, config.tensor_parallel_size, config.device)
        ranks = Ranks(config, model_path, max_model_len)
    elif config.engine_threads is not None:
        torch.set_num_threads(config.engine_threads)
    try:
        return _build(config, model_path, max_model_len, ranks)
    except BaseException:
        if ranks is not None:
            ranks.abort()  # the followers would wait for a rank 0 that failed
        raise


def _build(
    config: EngineConfig, model_path: Path, max_model_len: int, ranks: Ranks | None
) -> EngineParts:
    tp = None if ranks is None else ranks.tp
    model = load_model(
        model_path,
        config.torch_dtype,
        torch.device(config.device),
        max_model_len,
        tp,
        dense_weights_bytes=config.dense_weights_bytes,
    )
    vocab_size = model.config.vocab_size
    tokenizer = load_tokenizer(model_path)
    eos = eos_token_ids(model_path, tokenizer)
    spec = config.speculative_config
    draft = None
    if spec is not None and spec.method == "draft_model":
        draft, draft_path = load_draft_model(config, max_model_len, vocab_size)
        log.info("draft model: %s (%s)", weight_footprint(draft).describe(), draft_path.name)
    draft_bytes = 0 if draft is None else kv_bytes_per_block(draft, config)
    channel = None if ranks is None else ranks.channel
    runner = ModelRunner(config, model, max_model_len, draft_bytes, tp=tp, channel=channel)
    if ranks is not None:
        ranks.started.set()  # every rank holds its shard and its cache
    defaults = sampling_defaults(
        generation_config_folder(model_path),
        config.generation_config,
        config.override_generation_config,
    )
    weights = weight_footprint(model)
    _log_parts(config, model_path, max_model_len, runner, weights, defaults)
    block_manager = BlockManager(runner.num_blocks, config.block_size, config.enable_prefix_caching)
    scheduler = Scheduler(config, block_manager)
    proposer: Proposer | None = None
    if draft is not None:
        assert spec is not None
        reserved = scheduler.reserved_blocks
        proposer = DraftModelProposer(spec, config, draft, block_manager, reserved, max_model_len)
    elif spec is not None:
        proposer = NgramProposer(spec, max_model_len)
    grammars = None if tokenizer is None else Grammars(tokenizer, vocab_size, eos)
    return EngineParts(
        config,
        max_model_len,
        defaults,
        ranks,
        runner,
        vocab_size,
        tokenizer,
        eos,
        grammars,
        weights,
        block_manager,
        scheduler,
        proposer,
    )


def _log_parts(
    config: EngineConfig,
    model_path: Path,
    max_model_len: int,
    runner: ModelRunner,
    weights: WeightFootprint,
    defaults: SamplingOptions,
) -> None:
    log.info("%s (%s)", weights.describe(), model_path.name)
    kv_dtype = dtype_name(runner.kv_cache.dtype)
    log.info("%s, in %s", describe(runner.num_blocks, config.block_size, max_model_len), kv_dtype)
    log.info("%s on %s, %d CPU threads", config.dtype, config.device, torch.get_num_threads())
    log.info(describe_defaults(defaults))
