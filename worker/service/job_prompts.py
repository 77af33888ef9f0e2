"""A job as the engine takes it: its prompt, chat-templated, and refused before it is
tokenized when its text cannot fit the model's context. Runs in the engine process,
the one place the tokenizer lives."""

from transformers import PreTrainedTokenizerBase

from queue_schemas import JobRequest
from worker.engine import Prompt


def longest_token_bytes(tokenizer: PreTrainedTokenizerBase) -> int:
    """UTF-8 length of the vocabulary's longest token string. Each token's string takes
    at least as many bytes as the text it stands for, so a text of B bytes needs at
    least B / this many tokens."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max(len(str(token).encode()) for token in tokens if token is not None)


def _check_length(text_bytes: int, max_prompt_bytes: int | None) -> None:
    if max_prompt_bytes is not None and text_bytes > max_prompt_bytes:
        raise ValueError(
            f"the prompt has {text_bytes} bytes of text, more than the model's context "
            f"can hold in tokens (at most {max_prompt_bytes} bytes)"
        )


def engine_prompt(
    job: JobRequest, tokenizer: PreTrainedTokenizerBase | None, max_prompt_bytes: int | None
) -> Prompt:
    """The job's prompt as the engine takes it; chat messages go through the chat template.
    A text too long for the context is refused before it is tokenized."""
    if job.prompt_token_ids is not None:
        return {"prompt_token_ids": list(job.prompt_token_ids)}
    if job.messages is not None:
        if tokenizer is None or tokenizer.chat_template is None:
            raise ValueError("chat messages need a model with a chat template")
        _check_length(sum(len(m.content.encode()) for m in job.messages), max_prompt_bytes)
        messages = [message.model_dump() for message in job.messages]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert isinstance(text, str)  # tokenize=False renders one conversation as text
        return text
    assert job.prompt is not None
    _check_length(len(job.prompt.encode()), max_prompt_bytes)
    return job.prompt
