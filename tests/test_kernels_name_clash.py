"""Our top-level ``kernels`` package must not be mistaken for Hugging Face's ``kernels``.

transformers probes for an installed distribution named ``kernels`` to swap in
hub-downloaded kernels; ours is an import package of the genfleet
distribution, so the probe must keep answering "not installed".
"""

import subprocess
import sys
from pathlib import Path

PROBE = (
    "import importlib.util, kernels, torch\n"
    "from transformers import LlamaConfig, LlamaForCausalLM\n"
    "from transformers.utils import import_utils\n"
    "torch.manual_seed(0)\n"
    "model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,"
    " num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))\n"
    "logits = model(torch.tensor([[1, 2, 3]])).logits\n"
    "print(import_utils.is_kernels_available(), kernels.__file__ is not None,"
    " model.config._attn_implementation, round(float(logits.sum()), 4))\n"
)


# Makes ``import kernels`` fail, as on a host where our package is not on the path.
HIDE_OURS = "import sys\nsys.modules['kernels'] = None\n"


def _probe(with_ours: bool) -> subprocess.Popen:
    """The probe in a fresh interpreter, started (the two run side by side)."""
    repo = Path(__file__).resolve().parents[1]
    code = PROBE.replace("kernels.__file__ is not None", "'kernels' in sys.modules")
    code = "import sys\n" + code if with_ours else HIDE_OURS + code.replace(", kernels,", ",")
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=repo
    )


def _printed(probe: subprocess.Popen) -> str:
    out, _ = probe.communicate(timeout=120)
    assert probe.returncode == 0
    return out.strip()


def test_transformers_behaves_the_same_with_our_kernels_importable() -> None:
    probes = _probe(with_ours=True), _probe(with_ours=False)
    with_ours, without_ours = (_printed(probe) for probe in probes)
    assert with_ours.startswith("False True")
    assert with_ours.split()[1:] == without_ours.split()[1:]
    assert without_ours.split()[0] == "False"
