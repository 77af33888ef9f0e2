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
    # (old, new) substitutions, in order, from the checkpoint's tensor names to the
    # engine's (Mixtral's ``block_sparse_moe.experts.{e}.w1`` is ``mlp.experts.{e}.gate_proj``).
    checkpoint_renames: tuple[tuple[str, str], ...] = ()

    def engine_name(self, name: str) -> str:
        for old, new in self.checkpoint_renames:
            name = name.replace(old, new)
        return name
