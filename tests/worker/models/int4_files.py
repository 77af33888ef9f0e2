"""GPTQ and AWQ int4 checkpoints written here from tiny random models, as their
quantizers pack them (round-to-nearest, asymmetric, per group of inputs), and the
fp32 twin holding exactly the weights they encode."""

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def round_to_nearest(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, ...]:
    """``(q [out, in], zeros [out, groups], scales fp16 [out, groups])``; zeros kept in
    1..15 (a GPTQ "gptq"-format checkpoint cannot store a zero of 0)."""
    rows, columns = weight.shape
    groups = weight.view(rows, columns // group_size, group_size)
    low, high = groups.amin(-1), groups.amax(-1)
    scales = ((high - low) / 15).clamp(min=1e-4).to(torch.float16)
    zeros = (-low / scales.float()).round().clamp(1, 15)
    q = (groups / scales.float()[..., None] + zeros[..., None]).round().clamp(0, 15)
    return q.reshape(rows, columns).to(torch.int64), zeros.to(torch.int64), scales


def _words(nibbles: torch.Tensor) -> torch.Tensor:
    """[..., 8] values 0..15 -> int32 words, value i in bits 4i."""
    shifts = torch.arange(8) * 4
    return (nibbles.to(torch.int64) << shifts).sum(-1).to(torch.int32)


def pack(method: str, q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> dict:
    out_features, in_features = q.shape
    if method == "gptq":
        qweight = _words(q.T.reshape(in_features // 8, 8, out_features).transpose(1, 2))
        qzeros = _words((zeros - 1).T.reshape(zeros.shape[1], out_features // 8, 8))
        return {"qweight": qweight, "qzeros": qzeros, "scales": scales.T.contiguous()}
    order = list(AWQ_ORDER)
    qweight = _words(q.T.reshape(in_features, out_features // 8, 8)[..., order])
    qzeros = _words(zeros.T.reshape(zeros.shape[1], out_features // 8, 8)[..., order])
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales.T.contiguous()}


def write_int4(
    model: torch.nn.Module, folder: Path, method: str, group_size: int
) -> torch.nn.Module:
    """Save ``model`` quantized as a ``method`` checkpoint; return its fp32 twin."""
    twin = copy.deepcopy(model)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    twin_state = twin.state_dict()
    for name in list(state):
        module = name.removesuffix(".weight")
        if not name.endswith(".weight") or module.rsplit(".", 1)[-1] not in PROJECTIONS:
            continue
        q, zeros, scales = round_to_nearest(state.pop(name).float(), group_size)
        for suffix, tensor in pack(method, q, zeros, scales).items():
            state[f"{module}.{suffix}"] = tensor
        if method == "gptq":
            in_features = q.shape[1]
            state[f"{module}.g_idx"] = torch.arange(in_features, dtype=torch.int32) // group_size
        group = torch.arange(q.shape[1]) // group_size
        exact = scales.float()[:, group] * (q - zeros[:, group]).float()
        twin_state[name].copy_(exact)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, folder / "model.safetensors")
    model.config.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = (
        {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": False,
         "sym": False, "checkpoint_format": "gptq"}
        if method == "gptq"
        else {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
              "version": "gemm"}
    )  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return twin.eval()
