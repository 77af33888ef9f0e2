"""Run Python code in a fresh interpreter where some top-level packages cannot be imported."""

import subprocess
import sys

BLOCKER = """
import importlib.abc, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} must not be imported here")
        return None

sys.meta_path.insert(0, Blocked())
"""


def run_without(blocked: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    script = BLOCKER.format(blocked=blocked) + code
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
