"""The engine core: a plain schedule -> execute -> update loop over many requests."""

import itertools
import logging
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from queue_schemas.sampling import SamplingOptions
from worker.block_manager import BlockManager
from worker.config import EngineConfig
from worker.detokenizer import IncrementalDetokenizer
from worker.device import dtype_name
from worker.draft_proposer import DraftModelProposer, load_draft_model
from worker.generation_config import describe as describe_defaults
from worker.generation_config import generation_config_folder, sampling_defaults
from worker.kv_sizing import describe
from worker.model_fetch import resolve_model
from worker.model_runner import ModelRunner, kv_bytes_per_block
from worker.models.footprint import weight_footprint
from worker.models.gguf import is_gguf_file, load_gguf_tokenizer
from worker.models.loader import load_config, load_model
from worker.models.sharding import TensorParallel
from worker.output_processor import append_token, text_ready
from worker.outputs import RequestDelta, Timings, Usage
from worker.ranks import DEAD_PEER_WAIT_S, Ranks, check_layout, rank_threads
from worker.sampler import sample
from worker.scheduler import Scheduler, SchedulerOutput
from worker.sequence import Sequence
from worker.speculative import NgramProposer, Proposer, SpecDecodeStats, verify
from worker.structured_output import Grammars

Prompt = str | list[int] | dict
# A verifying sequence, the tokens it takes, and their logprobs.
Verified = tuple[Sequence, list[int], list[dict[int, float] | None]]
log = logging.getLogger("genfleet.engine")


def load_tokenizer(model: Path) -> PreTrainedTokenizerBase | None:
    """The model's tokenizer, or None when it ships none (token-id prompts only)."""
    if is_gguf_file(model):
        return load_gguf_tokenizer(model)
    if not any((model / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    return AutoTokenizer.from_pretrained(model, local_files_only=True)


def eos_token_ids(model: Path, tokenizer: PreTrainedTokenizerBase | None) -> set[int]:
    """End-of-sequence ids as transformers' generate sees them, plus the tokenizer's."""
    folder = generation_config_folder(model)
    if (folder / "generation_config.json").is_file():
        generation = GenerationConfig.from_pretrained(folder, local_files_only=True)
    else:
        generation = GenerationConfig.from_model_config(load_config(model))
    eos = generation.eos_token_id
    ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class LLMEngine:
    """Continuous batching over a paged KV cache, driven one ``step()`` at a time."""

    def __init__(self, config: EngineConfig) -> None:
        config = config.resolved()
        model_path = resolve_model(config.model, torch.device(config.device).type)
        hf_config = load_config(model_path)
        self.max_model_len = config.max_model_len or hf_config.max_position_embeddings
        if not config.enable_chunked_prefill:
            # Without chunking a whole (recomputed) sequence must fit one step.
            tokens = max(config.max_num_batched_tokens, self.max_model_len)
            config = config.model_copy(update={"max_num_batched_tokens": tokens})
        self.config = config
        self.sampling_defaults = sampling_defaults(
            generation_config_folder(model_path),
            config.generation_config,
            config.override_generation_config,
        )
        torch.manual_seed(config.seed)
        split = config.tensor_parallel_size > 1
        if split:
            torch.set_num_threads(rank_threads(config))
        elif config.engine_threads is not None:
            torch.set_num_threads(config.engine_threads)
        device = torch.device(config.device)
        self.ranks: Ranks | None = None
        tp = None
        if split:
            check_layout(hf_config, config.tensor_parallel_size, config.device)
            self.ranks = Ranks(config, model_path, self.max_model_len)
            tp = self.ranks.tp
        try:
            self._build(config, model_path, device, tp)
        except BaseException:
            if self.ranks is not None:
                self.ranks.abort()  # the followers would wait for a rank 0 that failed
            raise

    def _build(
        self,
        config: EngineConfig,
        model_path: Path,
        device: torch.device,
        tp: TensorParallel | None,
    ) -> None:
        """The model, the cache, the scheduler and the proposer (``__init__``'s rest)."""
        model = load_model(
            model_path,
            config.torch_dtype,
            device,
            self.max_model_len,
            tp,
            dense_weights_bytes=config.dense_weights_bytes,
        )
        self.vocab_size = model.config.vocab_size
        self.tokenizer = load_tokenizer(model_path)
        self.eos_token_ids = eos_token_ids(model_path, self.tokenizer)
        self.grammars = (
            None
            if self.tokenizer is None
            else Grammars(self.tokenizer, self.vocab_size, self.eos_token_ids)
        )
        # Grammar masks: seconds spent and steps that had any (the bench reports the cost).
        self.mask_seconds = 0.0
        self.masked_steps = 0
        spec = config.speculative_config
        draft = None
        if spec is not None and spec.method == "draft_model":
            draft, draft_path = load_draft_model(config, self.max_model_len, self.vocab_size)
            log.info("draft model: %s (%s)", weight_footprint(draft).describe(), draft_path.name)
        draft_bytes = 0 if draft is None else kv_bytes_per_block(draft, config)
        self.runner = ModelRunner(
            config,
            model,
            self.max_model_len,
            draft_bytes,
            tp=tp,
            channel=None if self.ranks is None else self.ranks.channel,
        )
        if self.ranks is not None:
            self.ranks.started.set()  # every rank holds its shard and its cache
        self.weights = weight_footprint(model)
        log.info("%s (%s)", self.weights.describe(), model_path.name)
        log.info(
            "%s, in %s",
            describe(self.runner.num_blocks, config.block_size, self.max_model_len),
            dtype_name(self.runner.kv_cache.dtype),
        )
        log.info("%s on %s, %d CPU threads", config.dtype, config.device, torch.get_num_threads())
        log.info(describe_defaults(self.sampling_defaults))
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(config, self.block_manager)
        self.proposer: Proposer | None = None
        if draft is not None:
            assert spec is not None
            self.proposer = DraftModelProposer(
                spec,
                config,
                draft,
                self.block_manager,
                self.scheduler.reserved_blocks,
                self.max_model_len,
            )
        elif spec is not None:
            self.proposer = NgramProposer(spec, self.max_model_len)
        self.spec_stats = SpecDecodeStats()
        self.last_batch = SchedulerOutput()  # what the latest step ran, for metrics
        self.requests: dict[str, Sequence] = {}
        self._aborted: list[Sequence] = []
        self._arrivals = itertools.count()

    @classmethod
    def from_kwargs(cls, **kwargs: object) -> "LLMEngine":
        return cls(EngineConfig(**kwargs))

    def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"])
            prompt = prompt["prompt"]
        if isinstance(prompt, list):
            return list(prompt)
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: send prompt_token_ids")
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def resolve(self, params: SamplingOptions, prompt_tokens: int) -> SamplingOptions:
        """The request's sampling with every unset field filled from the model's defaults.
        An explicit ``max_tokens`` must fit the context with the prompt (ValueError, with
        vLLM's words); a default one is cut to the room the prompt leaves."""
        room = self.max_model_len - prompt_tokens
        if params.max_tokens is not None and params.max_tokens > room:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {prompt_tokens + params.max_tokens} tokens "
                f"({prompt_tokens} in the messages, {params.max_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        resolved = params.with_defaults(self.sampling_defaults)
        if resolved.max_tokens is not None and resolved.max_tokens > room:
            resolved = resolved.model_copy(update={"max_tokens": room})
        return resolved

    def _check_prompt(self, request_id: str, token_ids: list[int]) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not token_ids:
            raise ValueError("the prompt is empty")
        if any(t < 0 or t >= self.vocab_size for t in token_ids):
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens; the model's context is "
                f"{self.max_model_len}, which must also leave room for one output token"
            )

    def _validate(self, token_ids: list[int], params: SamplingOptions) -> None:
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none")
        if params.structured_outputs is not None and self.grammars is None:
            raise ValueError("structured outputs need a tokenizer; this model has none")
        longest = (
            self.max_model_len if params.max_tokens is None else len(token_ids) + params.max_tokens
        )
        needed = self.block_manager.blocks_needed(longest)
        # Admission keeps the watermark free, so a request must fit below it even alone.
        usable = self.block_manager.num_blocks - self.scheduler.reserved_blocks
        if needed > usable:
            raise ValueError(
                f"the request may need {needed} KV blocks; the cache has {usable} "
                "usable: lower max_tokens or grow the cache"
            )

    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingOptions | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        resumed_token_ids: list[int] | None = None,
    ) -> None:
        """Queue a request; raises ValueError naming the problem, leaving the engine as it was.
        Its unset sampling fields take the model's defaults (``resolve``; the request's
        ``Sequence.params`` holds what was applied). A constrained request's grammar is
        compiled here unless it is cached (the worker's engine process compiles in the
        background first, so its steps never wait).

        ``resumed_token_ids``: output an earlier attempt already streamed (a job taken
        over from a worker that died). They follow the prompt as if sampled here: one
        prefill reads them, outputs go on from the next token index, and stops,
        ``max_tokens``, usage and the grammar count them. A resumed token that would have
        ended the request is dropped with those after it (the engine produces it again);
        a seeded request draws from a generator seeded with its seed plus the tokens
        resumed (reproducible from that point, not the draws an uninterrupted run makes)."""
        token_ids = self.tokenize(prompt)
        self._check_prompt(request_id, token_ids)
        params = self.resolve(params or SamplingOptions(), len(token_ids))
        self._validate(token_ids, params)
        resumed = resumed_token_ids or []
        if any(t < 0 or t >= self.vocab_size for t in resumed):
            raise ValueError(f"resumed token ids must be in [0, {self.vocab_size})")
        seq = self._sequence(request_id, token_ids, params, priority, arrival_time, resumed)
        for index, token in enumerate(resumed):
            if append_token(seq, token, None, self.eos_token_ids, self.max_model_len):
                # It would have ended here: resume before it, on a fresh sequence.
                seq = self._sequence(
                    request_id, token_ids, params, priority, arrival_time, resumed[:index]
                )
                for kept in resumed[:index]:
                    append_token(seq, kept, None, self.eos_token_ids, self.max_model_len)
                break
        seq.num_emitted_tokens = seq.num_output_tokens
        seq.first_token_time = None  # this attempt's first token is still to come
        text_ready(seq, finished=False)  # what the earlier attempt streamed is emitted
        self.requests[request_id] = seq
        self.scheduler.add(seq)

    def _sequence(
        self,
        request_id: str,
        token_ids: list[int],
        params: SamplingOptions,
        priority: int,
        arrival_time: float | None,
        resumed: list[int],
    ) -> Sequence:
        constraint = None
        if params.structured_outputs is not None:
            assert self.grammars is not None  # _validate checked
            constraint = self.grammars.state(params.structured_outputs)
        generator = None
        if params.seed is not None:
            seed = (params.seed + len(resumed)) % 2**63
            generator = torch.Generator(device=self.config.device).manual_seed(seed)
        detokenizer = None
        if self.tokenizer is not None:
            detokenizer = IncrementalDetokenizer(
                self.tokenizer, token_ids, params.skip_special_tokens
            )
        return Sequence(
            request_id=request_id,
            prompt_token_ids=token_ids,
            params=params,
            arrival_index=next(self._arrivals),
            priority=priority,
            arrival_time=arrival_time or time.time(),
            detokenizer=detokenizer,
            generator=generator,
            constraint=constraint,
        )

    def abort_request(self, request_id: str) -> bool:
        """Stop a request and free its blocks now; its final delta comes with the next step."""
        seq = self.requests.get(request_id)
        if seq is None or seq.is_finished:
            return False
        self.scheduler.finish(seq)
        seq.finish_reason = "abort"
        seq.finished_time = time.time()
        self._aborted.append(seq)
        return True

    def shutdown(self) -> None:
        """Stop the other tensor-parallel ranks (nothing to do without them)."""
        if self.ranks is not None:
            self.ranks.stop()
            self.ranks = None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._aborted)

    def step(self) -> list[RequestDelta]:
        """Run one iteration; return what changed for each request it touched."""
        deltas = [self._delta(seq, []) for seq in self._aborted]
        self._aborted.clear()
        batch = self.last_batch = self.scheduler.schedule()
        if not batch:
            return deltas
        if self.ranks is not None:
            self.ranks.check()
        try:
            logits = self.runner.execute(batch)
        except RuntimeError as error:  # gloo/NCCL say "peer closed": say which rank ended
            ended = None if self.ranks is None else self.ranks.ended(DEAD_PEER_WAIT_S)
            if ended:
                raise RuntimeError(ended) from error
            raise
        sampling = [
            seq
            for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
            if seq.num_computed_tokens + n == seq.num_tokens + len(seq.draft_token_ids)
        ]
        plain, plain_rows, verified = self._split_rows(logits, sampling)
        result = sample(logits[plain_rows] if verified else logits, plain, self.eos_token_ids)
        if result.mask_seconds:
            self.mask_seconds += result.mask_seconds
            self.masked_steps += 1
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            if not seq.draft_token_ids:
                self.block_manager.register_computed_blocks(seq)
        for seq, token, logprobs in zip(plain, result.token_ids, result.logprobs, strict=True):
            seq.num_draft_computed_tokens = min(seq.num_draft_computed_tokens, seq.num_tokens)
            finished = append_token(seq, token, logprobs, self.eos_token_ids, self.max_model_len)
            if finished:
                self.scheduler.finish(seq)
            deltas.append(self._delta(seq, [token]))
        for seq, tokens, kept_logprobs in verified:
            deltas += self._accept(seq, tokens, kept_logprobs)
        if self.proposer is not None:
            self.proposer.propose(self.scheduler.running)
        return deltas

    def _split_rows(
        self, logits: torch.Tensor, sampling: list[Sequence]
    ) -> tuple[list[Sequence], list[int], list[Verified]]:
        """The sequences that sample one token, and their logits rows; and those that
        verify drafts, with the tokens they take (drafts kept, then the model's own) and
        their logprobs."""
        plain: list[Sequence] = []
        plain_rows: list[int] = []
        verifying: list[tuple[Sequence, int]] = []
        row = 0
        for seq in sampling:
            if seq.draft_token_ids:
                verifying.append((seq, row))
            else:
                plain.append(seq)
                plain_rows.append(row)
            row += 1 + len(seq.draft_token_ids)
        if not verifying:
            return plain, plain_rows, []
        # One argmax over every row: a greedy row without penalties or grammar chooses it.
        choices = logits.argmax(dim=-1).tolist()
        verified = []
        for seq, first in verifying:
            width = 1 + len(seq.draft_token_ids)
            rows = logits[first : first + width]
            choice = choices[first : first + width]
            verified.append((seq, *verify(rows, seq, choice, self.eos_token_ids)))
        return plain, plain_rows, verified

    def _accept(
        self, seq: Sequence, tokens: list[int], logprobs: list[dict[int, float] | None]
    ) -> list[RequestDelta]:
        """Append a verifying sequence's tokens (the drafts it kept, then one of the
        model's own) up to where it stops, one delta each: every delta downstream
        carries one token, so a regenerated job's events group its tokens as any other
        attempt's do. The rejected drafts' cache slots are the next step's to write."""
        drafts, seq.draft_token_ids = seq.draft_token_ids, []
        self.spec_stats.record(len(drafts), len(tokens) - 1)
        computed = seq.num_tokens + len(tokens) - 1  # the last token and the kept drafts
        # A draft model saw the drafts: its cache stands up to the last one kept.
        seq.num_draft_computed_tokens = min(seq.num_draft_computed_tokens, computed)
        deltas = []
        for position, (token, chosen) in enumerate(zip(tokens, logprobs, strict=True)):
            finished = append_token(seq, token, chosen, self.eos_token_ids, self.max_model_len)
            if finished or position == len(tokens) - 1:
                seq.num_computed_tokens = min(computed, seq.num_tokens)
                self.block_manager.register_computed_blocks(seq)
            if finished:
                self.scheduler.finish(seq)
            deltas.append(self._delta(seq, [token]))
            if finished:
                break
        return deltas

    def _delta(self, seq: Sequence, new_tokens: list[int]) -> RequestDelta:
        if seq.is_finished:
            self.requests.pop(seq.request_id, None)
        first_index = seq.num_emitted_tokens
        seq.num_emitted_tokens += len(new_tokens)
        return RequestDelta(
            request_id=seq.request_id,
            token_index=first_index,
            new_token_ids=new_tokens,
            new_text=text_ready(seq, seq.is_finished),
            new_logprobs=seq.logprobs[first_index:] if seq.params.logprobs is not None else [],
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            usage=Usage(seq.num_prompt_tokens, seq.num_output_tokens, seq.num_cached_prompt_tokens),
            timings=Timings(
                seq.arrival_time, seq.first_token_time, seq.finished_time, seq.scheduled_time
            ),
        )
