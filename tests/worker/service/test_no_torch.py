"""The worker's service process never loads torch: every module of ``worker.service``
imports without it (the engine process alone imports torch, transformers and the
kernels)."""

import pkgutil

import worker.service
from tests.no_torch import run_without


def test_every_service_module_imports_without_torch() -> None:
    names = [m.name for m in pkgutil.iter_modules(worker.service.__path__, "worker.service.")]
    assert "worker.service.app" in names
    code = "import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names)
    code += "from worker.service.app import WorkerService\nprint('imported')\n"
    result = run_without(("torch", "transformers", "kernels", "triton"), code)
    assert result.returncode == 0, result.stderr
    assert "imported" in result.stdout


def test_the_check_fails_when_a_module_needs_torch() -> None:
    result = run_without(("torch",), "import worker.engine.llm_engine\n")
    assert result.returncode != 0
    assert "must not be imported here" in result.stderr
