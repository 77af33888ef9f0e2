"""The model's tokenizer and end-of-sequence ids, read from its folder or GGUF file."""

from pathlib import Path

from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from worker.engine.generation_config import generation_config_folder
from worker.models.gguf import is_gguf_file, load_gguf_tokenizer
from worker.models.loader import load_config


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


def longest_token_bytes(tokenizer: PreTrainedTokenizerBase) -> int:
    """UTF-8 length of the vocabulary's longest token string. Each token's string takes
    at least as many bytes as the text it stands for, so a text of B bytes needs at
    least B / this many tokens."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max(len(str(token).encode()) for token in tokens if token is not None)
