"""The family models, built once per session on first use."""

from pathlib import Path

import pytest
import torch

from tests.conftest import build_model
from tests.worker.models.families import FAMILY_MODELS


@pytest.fixture(scope="session")
def family_models(tmp_path_factory: pytest.TempPathFactory):
    """kind -> (folder, transformers model), each built on first use."""
    root = tmp_path_factory.mktemp("families")
    built: dict[str, tuple[Path, torch.nn.Module]] = {}

    def get(kind: str) -> tuple[Path, torch.nn.Module]:
        if kind not in built:
            built[kind] = (root / kind, build_model(FAMILY_MODELS[kind], root / kind))
        return built[kind]

    return get
