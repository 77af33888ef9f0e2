"""A model's sampling defaults, read as vLLM reads them (``--generation-config``).

The model folder's ``generation_config.json`` says how its makers sample it
(SmolLM2-Instruct: temperature 0.2, top_p 0.9). vLLM applies those values to
every request that leaves the field unset, and so does the engine here:
``auto`` reads the model folder, a folder path reads that folder, ``vllm``
reads nothing (the neutral values). ``override_generation_config`` is laid over
whichever was read. Only the fields a request can leave unset are taken
(``queue_schemas.sampling.MODEL_DEFAULTED``; ``max_new_tokens`` is
``max_tokens``), and only those the file sets, not transformers' own defaults.
"""

from pathlib import Path
from typing import Any

from pydantic import ValidationError
from transformers import GenerationConfig

from queue_schemas.sampling import MODEL_DEFAULTED, SamplingOptions

FILE_NAME = "generation_config.json"
NEUTRAL = "vllm"  # vLLM's name for "no model defaults"


def generation_config_folder(model: Path) -> Path:
    """Where a model's generation config lives: its folder, or for a GGUF file (which
    carries none) the folder the file is in."""
    return model.parent if model.is_file() else model


def read_generation_config(folder: Path) -> dict[str, Any]:
    """What the folder's generation config sets (nothing without one)."""
    if not (folder / FILE_NAME).is_file():
        return {}
    config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    return config.to_diff_dict()


def sampling_defaults(
    model_folder: Path, source: str = "auto", override: dict[str, Any] | None = None
) -> SamplingOptions:
    """The defaults for requests' unset fields: set exactly where the source sets them.
    Raises ValueError naming the source when a value is out of bounds."""
    if source == NEUTRAL:
        config: dict[str, Any] = {}
    else:
        folder = model_folder if source == "auto" else Path(source).expanduser()
        if source != "auto" and not folder.is_dir():
            raise ValueError(f"generation_config must be auto, vllm or a folder; got {source!r}")
        config = read_generation_config(folder)
    config = {**config, **(override or {})}
    if "max_new_tokens" in config:
        config["max_tokens"] = config.pop("max_new_tokens")
    picked = {name: config[name] for name in MODEL_DEFAULTED if config.get(name) is not None}
    try:
        return SamplingOptions.model_validate(picked)
    except ValidationError as error:
        raise ValueError(
            f"the generation config ({source}, override {override}) sets sampling defaults a "
            f"request may not have: {error}; choose others with --override-generation-config "
            "or none with --generation-config vllm"
        ) from None


def describe(defaults: SamplingOptions) -> str:
    """The defaults as the engine's log line says them."""
    if not defaults.model_fields_set:
        return "sampling defaults: none from the model (the neutral values)"
    values = ", ".join(
        f"{name}={getattr(defaults, name)}" for name in sorted(defaults.model_fields_set)
    )
    return f"sampling defaults for requests that leave them unset: {values}"
