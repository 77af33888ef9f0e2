"""``SamplingParams``: vLLM's name for a request's sampling settings, offline.

It is the wire's ``SamplingOptions`` (one definition of every knob, its bounds and
its neutral default) with two conveniences of vLLM's class: a misspelt field
raises instead of being ignored, and ``stop`` may be one string. Fields left
unset take the model's defaults when the engine adds the request
(``--generation-config``), as they do for jobs from the fleet.
"""

from typing import Any

from pydantic import ConfigDict, model_validator

from queue_schemas.sampling import SamplingOptions


class SamplingParams(SamplingOptions):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _one_stop_string(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("stop"), str):
            return {**data, "stop": [data["stop"]]}
        return data
