"""The native library built for another CPU level, checked in a process of its own."""

import os
import subprocess
import sys
from pathlib import Path


def run_built_for(march: str, script: str, cache_dir: Path) -> subprocess.CompletedProcess:
    """``script`` in a fresh Python whose native library is built with ``-march=<march>``
    into ``cache_dir`` (the library is loaded once per process)."""
    env = {**os.environ, "GENFLEET_CACHE_DIR": str(cache_dir), "GENFLEET_NATIVE_MARCH": march}
    return subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
