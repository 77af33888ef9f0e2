"""The API never needs torch: it imports, builds its app and its OpenAPI document without it."""

import subprocess
import sys

BLOCK_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "worker", "kernels"):
            raise ImportError(f"{name} must not be imported by the API")
        return None

sys.meta_path.insert(0, NoTorch())
"""


def test_api_imports_and_builds_without_torch_or_worker() -> None:
    code = BLOCK_TORCH + (
        "from producer_api.app import create_app\n"
        "import genfleet.submit\n"
        "app = create_app()\n"
        "paths = app.openapi()['paths']\n"
        "print(sorted(paths))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for path in ("/v1/jobs", "/v1/chat/completions", "/v1/completions", "/v1/models", "/readyz"):
        assert f"'{path}'" in result.stdout
