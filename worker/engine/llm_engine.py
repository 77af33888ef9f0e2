"""``LLMEngine``: continuous batching driven one ``step()`` at a time — requests are
added (``add_request``), stepped (schedule, execute, sample, append) and aborted."""

import itertools
import time
from types import TracebackType

import torch

from queue_schemas.sampling import SamplingOptions
from worker.config import EngineConfig
from worker.engine.admission import Admission, Admitted, Prompt
from worker.engine.assembly import assemble
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.output_processor import append_token, text_ready
from worker.engine.scheduler import SchedulerOutput
from worker.engine.sequence import Sequence
from worker.engine.tokenizer import longest_token_bytes
from worker.execution.ranks import DEAD_PEER_WAIT_S
from worker.outputs import RequestDelta, Timings, Usage
from worker.sampling.sampler import sample
from worker.spec_decode.verification import Verifier

__all__ = ["LLMEngine", "Prompt"]


class LLMEngine:
    """Continuous batching over a paged KV cache, driven one ``step()`` at a time.
    ``close()`` (or a ``with`` block) ends what it holds: tensor-parallel ranks and
    their process group, the grammar thread, and torch's thread count as it found it."""

    def __init__(self, config: EngineConfig) -> None:
        self._threads_before = torch.get_num_threads()
        parts = assemble(config)
        self.config = parts.config
        self.max_model_len = parts.max_model_len
        self.sampling_defaults = parts.sampling_defaults
        self.ranks = parts.ranks
        self.runner = parts.runner
        self.vocab_size = parts.vocab_size
        self.tokenizer = parts.tokenizer
        self.eos_token_ids = parts.eos_token_ids
        self.grammars = parts.grammars
        self.weights = parts.weights
        self.block_manager = parts.block_manager
        self.scheduler = parts.scheduler
        self.proposer = parts.proposer
        self.admission = Admission(
            self.max_model_len,
            self.vocab_size,
            self.tokenizer,
            self.sampling_defaults,
            self.block_manager.num_blocks - self.scheduler.reserved_blocks,
            self.config.block_size,
            self.grammars is not None,
            # Measured here, at start (tens of ms over the vocabulary), not on the first
            # text prompt, where it would hold a step.
            None
            if self.tokenizer is None
            else self.max_model_len * longest_token_bytes(self.tokenizer),
        )
        self.verifier = Verifier(self.block_manager, self.eos_token_ids, self.max_model_len)
        # Where every layer slides by one window, blocks wholly before it go back to the
        # pool as a sequence goes on; not with a draft model, whose layers read them.
        with_draft = (
            self.config.speculative_config is not None
            and self.config.speculative_config.method == "draft_model"
        )
        self.released_window = 0 if with_draft else self.runner.model.traits.sliding_everywhere
        self.spec_stats = self.verifier.stats
        # Grammar masks: seconds spent and steps that had any (the bench reports the cost).
        self.mask_seconds = 0.0
        self.masked_steps = 0
        self.last_batch = SchedulerOutput()  # what the latest step ran, for metrics
        self.requests: dict[str, Sequence] = {}
        self._aborted: list[Sequence] = []
        self._arrivals = itertools.count()

    @classmethod
    def from_kwargs(cls, **kwargs: object) -> "LLMEngine":
        return cls(EngineConfig(**kwargs))

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
        Its unset sampling fields take the model's defaults (``Admission.resolve``; the
        request's ``Sequence.params`` holds what was applied). A constrained request's
        grammar is compiled here unless it is cached (the worker's engine process compiles
        in the background first, so its steps never wait).

        ``resumed_token_ids``: output an earlier attempt already streamed (a job taken
        over from a worker that died). They follow the prompt as if sampled here: one
        prefill reads them, outputs go on from the next token index, and stops,
        ``max_tokens``, usage and the grammar count them. A resumed token that would have
        ended the request is dropped with those after it (the engine produces it again);
        a seeded request draws from a generator seeded with its seed plus the tokens
        resumed (reproducible from that point, not the draws an uninterrupted run makes)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        admitted = self.admission.admit(prompt, params, resumed_token_ids)
        resumed = admitted.resumed_token_ids
        seq = self._sequence(request_id, admitted, priority, arrival_time, resumed)
        for index, token in enumerate(resumed):
            if append_token(seq, token, None, self.eos_token_ids, self.max_model_len):
                # It would have ended here: resume before it, on a fresh sequence.
                seq = self._sequence(request_id, admitted, priority, arrival_time, resumed[:index])
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
        admitted: Admitted,
        priority: int,
        arrival_time: float | None,
        resumed: list[int],
    ) -> Sequence:
        params, token_ids = admitted.params, admitted.token_ids
        constraint = None
        if params.structured_outputs is not None:
            assert self.grammars is not None  # admission checked
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
            resumed=bool(resumed),
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

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._aborted)

    def step(self) -> list[RequestDelta]:
        """Run one iteration; return what changed for each request it touched."""
        deltas = [self._delta(seq, []) for seq in self._aborted]
        self._aborted.clear()
        batch = self.last_batch = self.scheduler.schedule()
        if not batch:
            return deltas
        logits = self._execute(batch)
        sampling = [
            seq
            for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
            if seq.num_computed_tokens + n == seq.num_tokens + len(seq.draft_token_ids)
        ]
        plain, plain_rows, verified = self.verifier.split(logits, sampling)
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
            for token, finished in self.verifier.accept(seq, tokens, kept_logprobs):
                if finished:
                    self.scheduler.finish(seq)
                deltas.append(self._delta(seq, [token]))
        if self.released_window:
            self._release_before_windows(batch)
        if self.proposer is not None:
            self.proposer.propose(self.scheduler.running)
        return deltas

    def _release_before_windows(self, batch: SchedulerOutput) -> None:
        """Each running sequence's blocks before the first key its next token sees."""
        for seq in batch.seqs:
            if not seq.is_finished:
                first_key = seq.num_computed_tokens - self.released_window + 1
                self.block_manager.release_before(seq, first_key)

    def _execute(self, batch: SchedulerOutput) -> torch.Tensor:
        if self.ranks is not None:
            self.ranks.check()
        try:
            return self.runner.execute(batch)
        except RuntimeError as error:  # gloo/NCCL say "peer closed": say which rank ended
            ended = None if self.ranks is None else self.ranks.ended(DEAD_PEER_WAIT_S)
            if ended:
                raise RuntimeError(ended) from error
            raise

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

    def close(self, failed: bool = False) -> None:
        """End the tensor-parallel ranks and the grammar thread (once; idempotent).
        After a failed step the followers may wait in a collective rank 0 left:
        ``failed`` kills them rather than telling them to stop."""
        if self.ranks is not None:
            if failed:
                self.ranks.abort()
            else:
                self.ranks.stop()
            self.ranks = None
        if self.grammars is not None:
            self.grammars.close()
        torch.set_num_threads(self._threads_before)

    def __enter__(self) -> "LLMEngine":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
