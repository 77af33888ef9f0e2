"""Models for tests: tiny random Llama-family models built here, and the converted SmolLM2."""

import os
import shutil

# Triton kernels run on CPU tensors in Triton's interpreter, which must be on
# before anything imports triton (torch and transformers may). A GPU run sets
# TRITON_INTERPRET=0 to compile them for real.
os.environ.setdefault("TRITON_INTERPRET", "1")
# A quarter GiB of KV cache per CPU engine (tests' own processes and the workers they
# start), not the default GiB: every engine zeroes its cache, and the suite starts
# hundreds of engines (at a GiB each, minutes of page faults on two cores).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "0.25")

from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from worker.model_fetch import DEFAULT_MODEL, fetch_model

# Under pytest-xdist each test process takes its share of the cores: two OpenMP pools
# of every core on one machine spin against each other (a test's steps 5x slower).
_PROCESSES = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // _PROCESSES))

TINY_VOCAB = 384
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


TINY_COMMON = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    # Larger weights than the default init give peaked logits, so greedy
    # argmax is not decided by rounding noise.
    initializer_range=0.15,
    # No end-of-sequence token: both engines run to max_tokens.
    bos_token_id=1,
    eos_token_id=None,
    pad_token_id=0,
)
# kind -> (config class, model class, what sets the kind apart)
TINY_MODELS = {
    "llama-untied": (LlamaConfig, LlamaForCausalLM, {"tie_word_embeddings": False}),
    # Multi-query attention: one KV head for four query heads.
    "llama-tied": (
        LlamaConfig,
        LlamaForCausalLM,
        {"tie_word_embeddings": True, "num_key_value_heads": 1},
    ),
    "qwen2-bias": (
        Qwen2Config,
        Qwen2ForCausalLM,
        {"tie_word_embeddings": False, "use_sliding_window": False},
    ),
    "mistral": (
        MistralConfig,
        MistralForCausalLM,
        {"tie_word_embeddings": False, "sliding_window": None},
    ),
}
TINY_KINDS = tuple(TINY_MODELS)


def build_tiny_model(
    kind: str, folder: Path, max_shard_size: str | None = None, **overrides: object
) -> torch.nn.Module:
    """A seeded random model of ``kind`` saved as safetensors + config in ``folder``."""
    return build_model(TINY_MODELS[kind], folder, max_shard_size, **overrides)


def build_model(
    spec: tuple[type, type, dict], folder: Path, max_shard_size: str | None = None,
    **overrides: object,
) -> torch.nn.Module:  # fmt: skip
    """A seeded random model of ``spec`` (config class, model class, what sets it
    apart) saved as safetensors + config in ``folder``."""
    config_class, model_class, settings = spec
    torch.manual_seed(1234)
    model = model_class(config_class(**{**TINY_COMMON, **settings, **overrides})).eval()
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return model


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (``pytest.mark.anyio``) run on asyncio's own loop, as the worker does."""
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_models(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Path, torch.nn.Module]]:
    """kind -> (folder with safetensors + config, the transformers model it holds)."""
    root = tmp_path_factory.mktemp("tiny")
    return {kind: (root / kind, build_tiny_model(kind, root / kind)) for kind in TINY_KINDS}


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return fetch_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy generate, one prompt at a time (no padding)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


def hf_greedy_batch(
    model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int
) -> list[list[int]]:
    """transformers' greedy generate over all ``prompts`` at once (left-padded and
    masked: one decode step for all, not one per prompt), each cut after its first
    end-of-sequence token, where a generate of that prompt alone stops."""
    width = max(len(prompt) for prompt in prompts)
    pads = torch.tensor([width - len(prompt) for prompt in prompts])
    ids = torch.tensor([[0] * (width - len(prompt)) + prompt for prompt in prompts])
    mask = (torch.arange(width)[None, :] >= pads[:, None]).long()
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
            pad_token_id=0,
        )  # fmt: skip
    eos = model.generation_config.eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos])
    rows = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, token in enumerate(row) if token in stops), len(row))
        rows.append(row[:end])
    return rows


def build_chat_model(folder: Path, smollm2_path: Path, context: int) -> Path:
    """A tiny random Llama that speaks through SmolLM2's tokenizer: real text, fast steps."""
    build_tiny_model(
        "llama-untied",
        folder,
        vocab_size=49152,
        intermediate_size=128,
        max_position_embeddings=context,
        tie_word_embeddings=True,
        # Peaked logits: greedy choices do not hinge on rounding, so a job
        # regenerated in another batch gives the same text.
        initializer_range=0.3,
    )
    for name in TOKENIZER_FILES:
        if (smollm2_path / name).is_file():
            shutil.copy(smollm2_path / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    return build_chat_model(tmp_path_factory.mktemp("tiny-chat"), smollm2_path, context=1024)


@pytest.fixture(scope="session")
def long_chat_model(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """The chat model with room for jobs of thousands of tokens: seconds long, however
    fast its steps, so a test can act on a job while it runs."""
    return build_chat_model(tmp_path_factory.mktemp("tiny-chat-long"), smollm2_path, 8192)
