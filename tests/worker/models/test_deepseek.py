"""DeepSeek V2/V3 beyond the parity of ``test_families``: each of what sets them apart
changes the tokens (so that parity shows it is applied), the cache holds one latent row
per token, and the multi-token-prediction layer of a V3 checkpoint is skipped."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import build_model, hf_greedy
from tests.worker.models.families import FAMILY_MODELS
from tests.worker.models.test_families import MAX_TOKENS, _greedy, _prompts
from tests.worker.models.test_family_features import assert_fp8_picks_near_best
from worker import LLM, SamplingParams
from worker.execution.model_runner import kv_bytes_per_block


def _variant(folder: Path, tmp_path: Path, config: dict | None = None, zero: str = "") -> Path:
    """A copy of the model with ``config`` merged into its config.json and the tensors
    whose names end with ``zero`` set to zeros."""
    copy = tmp_path / "variant"
    shutil.copytree(folder, copy)
    settings = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**settings, **(config or {})}))
    if zero:
        tensors = load_file(copy / "model.safetensors")
        tensors = {n: torch.zeros_like(t) if n.endswith(zero) else t for n, t in tensors.items()}
        save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    return copy


YARN_WITHOUT_MSCALE = {**FAMILY_MODELS["deepseek-v3"][2]["rope_parameters"], "mscale_all_dim": 0}
VARIANTS = {
    "router bias zeroed": ("deepseek-v3", {}, "e_score_correction_bias"),
    "rotary over halves": ("deepseek-v3", {"rope_interleave": False}, ""),
    "no yarn mscale": ("deepseek-v3", {"rope_parameters": YARN_WITHOUT_MSCALE}, ""),
    "no group limit": ("deepseek-v2", {"topk_method": "greedy"}, ""),
}  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_deepseek_detail_changes_the_tokens(family_models, tmp_path, variant) -> None:
    kind, config, zero = VARIANTS[variant]
    folder, hf_model = family_models(kind)
    prompts = _prompts()
    expected = [hf_greedy(hf_model, prompt, MAX_TOKENS) for prompt in prompts]
    assert _greedy(_variant(folder, tmp_path, config, zero), prompts) != expected


@pytest.mark.parametrize("kind", ["deepseek-v2", "deepseek-v3"])
def test_the_cache_holds_one_latent_row_per_token(family_models, kind) -> None:
    """Per token and layer: the 32-feature latent and 8 rotary features (fp32), not
    4 heads' keys (16 + 8 features) and values (16): 160 bytes, not 640."""
    folder, _ = family_models(kind)
    with LLM(str(folder)) as llm:
        model, config = llm.engine.runner.model, llm.engine.config
        per_token = kv_bytes_per_block(model, config) // config.block_size
        shape = tuple(llm.engine.runner.kv_cache.shape)
    assert per_token == 2 * (32 + 8) * 4
    assert shape[:1] == (1,) and shape[-2:] == (1, 40)


def test_the_multi_token_prediction_layer_is_skipped(family_models, tmp_path) -> None:
    """V3 checkpoints carry a layer past ``num_hidden_layers`` that predicts further
    tokens in training; served, the model is the same without it."""
    folder, hf_model = family_models("deepseek-v3")
    copy = _variant(folder, tmp_path)
    tensors = load_file(copy / "model.safetensors")
    extra = {
        name.replace("model.layers.1.", "model.layers.2."): tensor.clone()
        for name, tensor in tensors.items()
        if name.startswith("model.layers.1.")
    }
    save_file({**tensors, **extra}, copy / "model.safetensors", metadata={"format": "pt"})
    prompts = _prompts()[:2]
    expected = [hf_greedy(hf_model, prompt, MAX_TOKENS) for prompt in prompts]
    assert _greedy(copy, prompts) == expected


def test_an_fp8_latent_cache_picks_what_exact_attention_ranks_near_best(tmp_path) -> None:
    """The latent rows in fp8 (the bound of the dense families), on a V2 whose layers are
    all dense: a router's choice, discontinuous, is no part of what is bounded."""
    dense = {**FAMILY_MODELS["deepseek-v2"][2], "first_k_dense_replace": 2}
    config_class, model_class, _ = FAMILY_MODELS["deepseek-v2"]
    assert_fp8_picks_near_best(tmp_path, build_model((config_class, model_class, dense), tmp_path))


def test_latent_rows_serve_the_prefix_cache(family_models) -> None:
    """Prompts sharing a 40-token prefix: the later ones read its latent rows from
    cached blocks and still decode as transformers does."""
    folder, hf_model = family_models("deepseek-v3")
    shared = _prompts()[3][:40]
    prompts = [shared + tail for tail in ([5, 6], [7, 8, 9], [10])]
    expected = [hf_greedy(hf_model, prompt, MAX_TOKENS) for prompt in prompts]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLM(str(folder), block_size=8, enable_prefix_caching=True) as llm:
        outputs = [llm.generate([{"prompt_token_ids": p}], params)[0] for p in prompts]
        assert llm.engine.block_manager.prefix_cache_hits > 0
    assert [o.outputs[0].token_ids for o in outputs] == expected
