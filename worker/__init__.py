"""The inference engine and, in later modules, the service that joins it to Kafka and Redis."""

from worker.config import EngineConfig
from worker.engine import LLMEngine
from worker.llm import LLM
from worker.outputs import CompletionOutput, RequestDelta, RequestOutput
from worker.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "RequestDelta",
    "RequestOutput",
    "SamplingParams",
]
