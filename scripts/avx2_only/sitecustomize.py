"""On ``PYTHONPATH`` (``scripts/avx2_only.sh``): torch's CPU queries answer as an AVX2-only
CPU's would, so that ``auto`` picks what it picks there (fp32, no AVX512-BF16 paths)."""

import importlib.abc
import importlib.util
import sys


def _answer_as_avx2(torch_cpu: object) -> None:
    for name in (
        "_is_avx512_supported",
        "_is_avx512_bf16_supported",
        "_is_vnni_supported",
        "_is_amx_tile_supported",
        "_is_amx_fp16_supported",
    ):
        if hasattr(torch_cpu, name):
            setattr(torch_cpu, name, lambda: False)


class _PatchTorchCpu(importlib.abc.MetaPathFinder):
    """Patches ``torch.cpu`` as soon as it is imported, whoever imports it first."""

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != "torch.cpu":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        load = spec.loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            load(module)
            _answer_as_avx2(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _PatchTorchCpu())
