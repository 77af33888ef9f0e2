"""The decoder families the engine serves, found by a config's ``architectures`` (or
its ``model_type``); anything else is refused at start with the list."""

from transformers import PretrainedConfig

from worker.models.families import (
    deepseek,
    gemma2,
    gemma3,
    granite,
    llama,
    mistral,
    mixtral,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen_moe,
    smollm3,
)
from worker.models.family import Family

FAMILIES: tuple[Family, ...] = (
    *(
        module.FAMILY
        for module in (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, olmo2, granite, smollm3)
    ),
    mixtral.FAMILY,
    qwen_moe.QWEN2_MOE,
    qwen_moe.QWEN3_MOE,
    deepseek.DEEPSEEK_V2,
    deepseek.DEEPSEEK_V3,
)
SUPPORTED_ARCHITECTURES = tuple(a for family in FAMILIES for a in family.architectures)


def family_of(config: PretrainedConfig) -> Family:
    """The family that serves ``config``, or ValueError naming what is supported."""
    for architecture in getattr(config, "architectures", None) or []:
        for family in FAMILIES:
            if architecture in family.architectures:
                return family
    for family in FAMILIES:
        if config.model_type in family.model_types:
            return family
    named = ", ".join(getattr(config, "architectures", None) or [config.model_type])
    raise ValueError(
        f"model architecture {named} is not supported; supported: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)}"
    )
