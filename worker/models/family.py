"""A decoder family as the registry knows it."""

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PretrainedConfig

from worker.models.traits import Traits


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]  # config.json's ``architectures``
    model_types: tuple[str, ...]  # its ``model_type``
    traits: Callable[[PretrainedConfig], Traits]
    gguf_architecture: str | None = None  # llama.cpp's ``general.architecture``
    # Why tensor parallelism is refused for this family (None: it splits).
    no_tensor_parallel: str | None = None
