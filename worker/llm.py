"""Offline batch generation, shaped like vLLM's ``LLM`` class."""

import itertools
from collections.abc import Sequence as Many

from rich.progress import Progress
from transformers import PreTrainedTokenizerBase

from queue_schemas.sampling import SamplingOptions
from worker.config import EngineConfig
from worker.engine.admission import Prompt
from worker.engine.llm_engine import LLMEngine
from worker.model_fetch import DEFAULT_MODEL
from worker.outputs import CompletionOutput, RequestDelta, RequestOutput
from worker.sampling_params import SamplingParams


def _as_lists(
    prompts: Prompt | Many[Prompt], sampling_params: SamplingOptions | Many[SamplingOptions] | None
) -> tuple[list[Prompt], list[SamplingOptions]]:
    """One prompt or many, one params for all or one each: two lists of equal length."""
    single = isinstance(prompts, str | dict) or (
        isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], int)
    )
    prompt_list: list[Prompt] = [prompts] if single else list(prompts)  # type: ignore[list-item, arg-type]
    if sampling_params is None or isinstance(sampling_params, SamplingOptions):
        params = [sampling_params or SamplingParams()] * len(prompt_list)
    else:
        params = list(sampling_params)
    if len(params) != len(prompt_list):
        raise ValueError(f"{len(prompt_list)} prompts but {len(params)} sampling params")
    return prompt_list, params


def _apply(out: RequestOutput, delta: RequestDelta) -> None:
    completion = out.outputs[0]
    completion.token_ids.extend(delta.new_token_ids)
    completion.text += delta.new_text
    if delta.new_logprobs:
        completion.logprobs = completion.logprobs or []
        completion.logprobs.extend(delta.new_logprobs)
    if delta.finished:
        completion.finish_reason = delta.finish_reason
        completion.stop_reason = delta.stop_reason
        out.finished, out.usage, out.timings = True, delta.usage, delta.timings


class LLM:
    """``LLM(model=...).generate(prompts, params)``: all prompts, one engine, outputs in order.

    ``kwargs`` are ``EngineConfig``'s fields (``generation_config``,
    ``override_generation_config``, ``max_num_seqs``, ...). The dtype is fp32 unless
    asked, so that offline output matches transformers' on every machine."""

    def __init__(self, model: str = DEFAULT_MODEL, dtype: str = "float32", **kwargs: object):
        self.engine = LLMEngine(EngineConfig(model=str(model), dtype=dtype, **kwargs))
        self._ids = itertools.count()

    def close(self) -> None:
        """End what the engine holds (tensor-parallel ranks, threads); see ``LLMEngine``."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def get_tokenizer(self) -> PreTrainedTokenizerBase | None:
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """The model's sampling defaults (vLLM's name): what unset fields become."""
        defaults = self.engine.sampling_defaults
        return SamplingParams(
            **{name: getattr(defaults, name) for name in defaults.model_fields_set}
        )

    def generate(
        self,
        prompts: Prompt | Many[Prompt],
        sampling_params: SamplingOptions | Many[SamplingOptions] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt; a refused prompt raises and leaves nothing queued."""
        outputs = self._submit(*_as_lists(prompts, sampling_params))
        with Progress(disable=not use_tqdm, transient=True) as progress:
            task = progress.add_task("generating", total=len(outputs))
            while self.engine.has_unfinished_requests():
                for delta in self.engine.step():
                    _apply(outputs[delta.request_id], delta)
                    progress.advance(task, int(delta.finished))
        return list(outputs.values())

    def _submit(
        self, prompts: list[Prompt], params: list[SamplingOptions]
    ) -> dict[str, RequestOutput]:
        outputs: dict[str, RequestOutput] = {}
        try:
            for prompt, p in zip(prompts, params, strict=True):
                request_id = str(next(self._ids))
                self.engine.add_request(request_id, prompt, p)
                outputs[request_id] = RequestOutput(
                    request_id=request_id,
                    prompt=prompt if isinstance(prompt, str) else None,
                    prompt_token_ids=self.engine.requests[request_id].prompt_token_ids,
                    outputs=[CompletionOutput(0, "", [], None)],
                )
        except ValueError:
            for request_id in outputs:
                self.engine.abort_request(request_id)
            while self.engine.has_unfinished_requests():
                self.engine.step()
            raise
        return outputs
