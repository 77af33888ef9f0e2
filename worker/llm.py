"""Offline batch generation, shaped like vLLM's ``LLM`` class."""

import itertools
from collections.abc import Sequence as Many

from rich.progress import Progress
from transformers import PreTrainedTokenizerBase

from worker.config import EngineConfig
from worker.engine import LLMEngine, Prompt
from worker.model_fetch import DEFAULT_MODEL
from worker.outputs import CompletionOutput, RequestOutput
from worker.sampling_params import SamplingParams


class LLM:
    """``LLM(model=...).generate(prompts, params)``: all prompts, one engine, outputs in order."""

    def __init__(self, model: str = DEFAULT_MODEL, dtype: str = "float32", **kwargs: object):
        self.engine = LLMEngine(EngineConfig(model=model, dtype=dtype, **kwargs))  # type: ignore[arg-type]
        self._ids = itertools.count()

    def get_tokenizer(self) -> PreTrainedTokenizerBase | None:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Many[Prompt],
        sampling_params: SamplingParams | Many[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")

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
        with Progress(disable=not use_tqdm, transient=True) as progress:
            task = progress.add_task("generating", total=len(outputs))
            while self.engine.has_unfinished_requests():
                for delta in self.engine.step():
                    out = outputs[delta.request_id]
                    completion = out.outputs[0]
                    completion.token_ids.extend(delta.new_token_ids)
                    completion.text += delta.new_text
                    if delta.new_logprobs:
                        completion.logprobs = (completion.logprobs or []) + delta.new_logprobs
                    if delta.finished:
                        completion.finish_reason = delta.finish_reason
                        completion.stop_reason = delta.stop_reason
                        out.finished, out.usage, out.timings = True, delta.usage, delta.timings
                        progress.advance(task)
        return list(outputs.values())
