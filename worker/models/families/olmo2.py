"""OLMo 2: norms after attention and after the MLP (none before), and an RMSNorm of
q and k over the whole projection."""

import dataclasses

from transformers import PretrainedConfig

from worker.models.family import Family
from worker.models.traits import Traits, llama_traits


def olmo2_traits(config: PretrainedConfig) -> Traits:
    return dataclasses.replace(llama_traits(config), norms="post", qk_norm="whole")


FAMILY = Family(
    name="olmo2",
    architectures=("Olmo2ForCausalLM",),
    model_types=("olmo2",),
    traits=olmo2_traits,
    gguf_architecture="olmo2",
    # Each rank would hold part of q's and k's norm: their mean of squares spans ranks.
    no_tensor_parallel="OLMo 2 normalises q and k over all heads at once",
)
