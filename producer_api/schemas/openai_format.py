"""OpenAI's response, chunk and logprobs shapes, built from the fleet's events and results.

A ``Shape`` knows one route's choice objects (chat's ``message``/``delta``,
completions' ``text``); everything else about a response is shared.
"""

import time
from typing import Any, Protocol

from producer_api.schemas.reply_stream import ReplyStream
from queue_schemas import JobResult, TokenEvent

Choice = dict[str, Any]


def created() -> int:
    return int(time.time())


def usage_body(results: list[JobResult], choices_per_prompt: int) -> dict[str, Any]:
    """The request's usage: each prompt once (its choices share it), every completion.
    ``results`` lie in order, ``choices_per_prompt`` consecutive ones per prompt."""
    firsts = results[::choices_per_prompt]
    prompt = sum(result.usage.prompt_tokens for result in firsts)
    cached = sum(result.usage.cached_tokens for result in firsts)
    completion = sum(result.usage.completion_tokens for result in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _tokens(events: list[TokenEvent], top: int):
    """Per generated token: its text, its logprob, and the ``top`` best alternatives."""
    for event in events:
        texts = event.token_texts or {}
        for token_id, entry in zip(event.token_ids, event.logprobs or [], strict=False):
            ranked = sorted(entry.items(), key=lambda item: -item[1])[:top]
            alternatives = [(texts.get(alt, ""), value) for alt, value in ranked]
            yield texts.get(token_id, ""), entry.get(token_id, float("-inf")), alternatives


class Shape(Protocol):
    object: str
    chunk_object: str
    top: int | None  # logprob alternatives per token; None: no logprobs

    def opening(self, index: int) -> Choice | None: ...
    def delta(self, index: int, event: TokenEvent) -> Choice | None: ...
    def closing(self, index: int, result: JobResult) -> list[Choice]: ...
    def whole(self, index: int, result: JobResult, events: list[TokenEvent]) -> Choice: ...


class ChatShape:
    """Chat's choices; each choice's text read as reasoning, content and tool calls as
    its ``ReplyStream`` reads it (one per choice, in order)."""

    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, top_logprobs: int | None, streams: list[ReplyStream]) -> None:
        self.top = top_logprobs
        self.streams = streams

    def _logprobs(self, events: list[TokenEvent]) -> dict[str, Any] | None:
        if self.top is None:
            return None
        content = [
            {
                "token": text, "logprob": logprob, "bytes": list(text.encode()),
                "top_logprobs": [
                    {"token": alt, "logprob": value, "bytes": list(alt.encode())}
                    for alt, value in alternatives
                ],
            }
            for text, logprob, alternatives in _tokens(events, self.top)
        ]  # fmt: skip
        return {"content": content}

    def opening(self, index: int) -> Choice | None:
        # OpenAI's first chunk of a choice names the role.
        delta = {"role": "assistant", "content": ""}
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}

    def delta(self, index: int, event: TokenEvent) -> Choice | None:
        delta = self.streams[index].delta(event.text)
        logprobs = self._logprobs([event])
        if delta is None and logprobs is None:
            return None
        return {"index": index, "delta": delta or {}, "logprobs": logprobs,
                "finish_reason": None}  # fmt: skip

    def closing(self, index: int, result: JobResult) -> list[Choice]:
        rest = self.streams[index].closing(result)
        last = {"index": index, "delta": {}, "logprobs": None,
                "finish_reason": result.finish_reason}  # fmt: skip
        if rest is None:
            return [last]
        return [{"index": index, "delta": rest, "logprobs": None, "finish_reason": None}, last]

    def whole(self, index: int, result: JobResult, events: list[TokenEvent]) -> Choice:
        content: str | None = result.text if result.content is None else result.content
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if result.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in result.tool_calls]
            message["content"] = content or None  # OpenAI's: null beside calls
        if result.reasoning is not None:
            message["reasoning_content"] = result.reasoning
        return {"index": index, "message": message, "logprobs": self._logprobs(events),
                "finish_reason": result.finish_reason}  # fmt: skip


class TextShape:
    object = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, top_logprobs: int | None) -> None:
        self.top = top_logprobs

    def _logprobs(self, events: list[TokenEvent]) -> dict[str, Any] | None:
        if self.top is None:
            return None
        tokens, logprobs, tops, offsets = [], [], [], []
        offset = 0
        for text, logprob, alternatives in _tokens(events, self.top):
            tokens.append(text)
            logprobs.append(logprob)
            tops.append(dict(alternatives))
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
                "text_offset": offsets}  # fmt: skip

    def opening(self, index: int) -> Choice | None:
        return None

    def delta(self, index: int, event: TokenEvent) -> Choice:
        return {"index": index, "text": event.text, "logprobs": self._logprobs([event]),
                "finish_reason": None}  # fmt: skip

    def closing(self, index: int, result: JobResult) -> list[Choice]:
        return [{"index": index, "text": "", "logprobs": None,
                 "finish_reason": result.finish_reason}]  # fmt: skip

    def whole(self, index: int, result: JobResult, events: list[TokenEvent]) -> Choice:
        return {"index": index, "text": result.text, "logprobs": self._logprobs(events),
                "finish_reason": result.finish_reason}  # fmt: skip
