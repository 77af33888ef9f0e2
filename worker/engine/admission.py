"""The one check a request passes before it joins the engine: its prompt as token
ids, its sampling with the model's defaults, and whether the two fit the model's
context and the KV cache. Every refusal is a ValueError naming the problem; a
refused request leaves the engine as it was."""

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from queue_schemas.sampling import SamplingOptions
from worker.engine.block_manager import cdiv

Prompt = str | list[int] | dict


@dataclass
class Admitted:
    """A request as the engine takes it."""

    token_ids: list[int]
    params: SamplingOptions
    resumed_token_ids: list[int]


@dataclass
class Admission:
    max_model_len: int
    vocab_size: int
    tokenizer: PreTrainedTokenizerBase | None
    sampling_defaults: SamplingOptions
    # KV blocks a request may hold at most: the pool less the admission watermark.
    usable_blocks: int
    block_size: int
    has_grammars: bool
    # A text longer than this cannot fit the context in tokens: refused before it is
    # tokenized (None without a tokenizer).
    max_prompt_bytes: int | None

    def admit(
        self, prompt: Prompt, params: SamplingOptions | None, resumed_token_ids: list[int] | None
    ) -> Admitted:
        token_ids = self.tokenize(prompt)
        self._check_ids("prompt", token_ids)
        if not token_ids:
            raise ValueError("the prompt is empty")
        resumed = list(resumed_token_ids or [])
        self._check_ids("resumed", resumed)
        resolved = self.resolve(params or SamplingOptions(), len(token_ids))
        self._check_features(resolved)
        return Admitted(token_ids, resolved, resumed)

    def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return list(prompt["prompt_token_ids"])
            prompt = prompt["prompt"]
        if isinstance(prompt, list):
            return list(prompt)
        if not isinstance(prompt, str):
            raise ValueError("a prompt is text, token ids, or a dict with either")
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: send prompt_token_ids")
        text_bytes = len(prompt.encode())
        if self.max_prompt_bytes is not None and text_bytes > self.max_prompt_bytes:
            raise ValueError(
                f"the prompt has {text_bytes} bytes of text, more than the model's context "
                f"can hold in tokens (at most {self.max_prompt_bytes} bytes)"
            )
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def resolve(self, params: SamplingOptions, prompt_tokens: int) -> SamplingOptions:
        """The request's sampling with every unset field filled from the model's defaults,
        checked against the room its prompt leaves: the one place the prompt-plus-output
        limit is checked. An explicit ``max_tokens`` must fit the context (vLLM's words);
        a default one is cut to that room; either must fit the KV cache."""
        room = self.max_model_len - prompt_tokens
        if room < 1:
            raise ValueError(
                f"the prompt has {prompt_tokens} tokens; the model's context is "
                f"{self.max_model_len}, which must also leave room for one output token"
            )
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
        longest = prompt_tokens + (room if resolved.max_tokens is None else resolved.max_tokens)
        needed = cdiv(longest, self.block_size)
        # Admission keeps the watermark free, so a request must fit below it even alone.
        if needed > self.usable_blocks:
            raise ValueError(
                f"the request may need {needed} KV blocks; the cache has "
                f"{self.usable_blocks} usable: lower max_tokens or grow the cache"
            )
        return resolved

    def _check_ids(self, what: str, token_ids: list[int]) -> None:
        if any(t < 0 or t >= self.vocab_size for t in token_ids):
            raise ValueError(f"{what} token ids must be in [0, {self.vocab_size})")

    def _check_features(self, params: SamplingOptions) -> None:
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none")
        if params.structured_outputs is not None and not self.has_grammars:
            raise ValueError("structured outputs need a tokenizer; this model has none")
