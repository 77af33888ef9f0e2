"""A job's prompt as the engine takes it: chat messages through the model's chat
template. Runs in the engine process, the one place the tokenizer lives; the engine's
admission checks the result."""

from transformers import PreTrainedTokenizerBase

from queue_schemas import JobRequest
from worker.engine.admission import Prompt


def engine_prompt(job: JobRequest, tokenizer: PreTrainedTokenizerBase | None) -> Prompt:
    """The job's prompt as the engine takes it; chat messages go through the chat template."""
    if job.prompt_token_ids is not None:
        return {"prompt_token_ids": list(job.prompt_token_ids)}
    if job.messages is not None:
        if tokenizer is None or tokenizer.chat_template is None:
            raise ValueError("chat messages need a model with a chat template")
        messages = [message.model_dump() for message in job.messages]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert isinstance(text, str)  # tokenize=False renders one conversation as text
        return text
    assert job.prompt is not None
    return job.prompt
