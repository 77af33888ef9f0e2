"""The inference engine, and the service that joins it to Kafka and Redis.

The public names load on first use, so that light modules of this package
(settings, model fetching) import without torch.
"""

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "LLM": "worker.llm",
    "CompletionOutput": "worker.outputs",
    "EngineConfig": "worker.config",
    "LLMEngine": "worker.engine.llm_engine",
    "RequestDelta": "worker.outputs",
    "RequestOutput": "worker.outputs",
    "SamplingParams": "worker.sampling_params",
    # vLLM's name for the constraint of SamplingParams.structured_outputs.
    "StructuredOutputsParams": "queue_schemas.structured",
}

if TYPE_CHECKING:
    from queue_schemas.structured import StructuredOutputs
    from worker.config import EngineConfig
    from worker.engine.llm_engine import LLMEngine
    from worker.llm import LLM
    from worker.outputs import CompletionOutput, RequestDelta, RequestOutput
    from worker.sampling_params import SamplingParams

    StructuredOutputsParams = StructuredOutputs


_RENAMED = {"StructuredOutputsParams": "StructuredOutputs"}


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'worker' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), _RENAMED.get(name, name))


__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "RequestDelta",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
]
