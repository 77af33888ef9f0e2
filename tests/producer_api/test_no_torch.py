"""The API never needs torch: it imports, builds its app and its OpenAPI document without it."""

from tests.no_torch import run_without


def test_api_imports_and_builds_without_torch_or_worker() -> None:
    code = (
        "from producer_api.app import create_app\n"
        "import genfleet.submit\n"
        "app = create_app()\n"
        "paths = app.openapi()['paths']\n"
        "print(sorted(paths))\n"
    )
    result = run_without(("torch", "transformers", "worker", "kernels"), code)
    assert result.returncode == 0, result.stderr
    for path in ("/v1/jobs", "/v1/chat/completions", "/v1/completions", "/v1/models", "/readyz"):
        assert f"'{path}'" in result.stdout
