"""Compile the native CPU kernels once per source version and machine, then load them.

The library is built with the system C++ compiler (``$CXX``, else ``g++``) for
this CPU (``-march=native``, or ``$GENFLEET_NATIVE_MARCH``) into the genfleet
cache folder, under a name that hashes the sources, the flags, the compiler and
the CPU's feature flags, so a changed source or another machine sharing the
folder gets its own build.
Every entry point exists once per element type: ``<op>_float32``, ``<op>_bfloat16``.
"""

import ctypes
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch  # loaded first: the library then links the libgomp torch already uses

HERE = Path(__file__).parent
SOURCES = tuple(
    HERE / name
    for name in (
        "paged_attention.cpp",
        "layer_ops.cpp",
        "linear.cpp",
        "quantized_linear.cpp",
        "decoder_chain.cpp",
    )
)
HEADERS = (HERE / "dtypes.h",)
# -ffast-math lets the compiler vectorise reductions and exp(). It is given only
# when compiling: linked with it, a shared library turns on flush-to-zero for the
# whole process as it loads, which would change torch's own arithmetic.
COMPILE_FLAGS = ("-O3", "-ffast-math", "-fopenmp", "-fPIC", "-std=c++17")
LINK_FLAGS = ("-shared", "-fopenmp")


def _target() -> str:
    """``-march`` for the build: this CPU unless ``GENFLEET_NATIVE_MARCH`` names another
    (a fleet's common baseline, say ``x86-64-v3``, which has no AVX-512)."""
    return os.environ.get("GENFLEET_NATIVE_MARCH") or "native"


class NativeKernelsUnavailable(RuntimeError):
    """No compiler, or the build failed: CPU hosts then run the torch references."""


def _build_dir() -> Path:
    root = os.environ.get("GENFLEET_CACHE_DIR") or Path.home() / ".cache" / "genfleet"
    return Path(root) / "kernels"


def _cpu_flags() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")


def _run(commands: list[list[str]]) -> None:
    """Run the commands at once (one compiler per source: a build takes the longest
    source's time, not their sum), each to completion."""
    try:
        running = [
            subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for c in commands
        ]
    except OSError as error:
        message = f"cannot run the C++ compiler {commands[0][0]!r}: {error}"
        raise NativeKernelsUnavailable(message) from None
    failures = []
    for process in running:
        _, stderr = process.communicate()
        if process.returncode != 0:
            failures.append(stderr)
    if failures:
        raise NativeKernelsUnavailable(
            f"{commands[0][0]} failed to build the kernels:\n" + "\n".join(failures)
        )


def _compile(compiler: str, flags: list[str], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        objects = [str(Path(work) / f"{source.stem}.o") for source in SOURCES]
        _run(
            [
                [compiler, *flags, "-c", str(source), "-o", obj]
                for source, obj in zip(SOURCES, objects, strict=True)
            ]
        )
        # Link beside the target and rename: processes starting together never load half a file.
        partial = str(Path(work) / target.name)
        _run([[compiler, *LINK_FLAGS, "-o", partial, *objects]])
        os.replace(partial, target)


@cache
def load_library() -> ctypes.CDLL:
    compiler = os.environ.get("CXX", "g++")
    flags = [f"-march={_target()}", *COMPILE_FLAGS]
    texts = [path.read_text() for path in (*SOURCES, *HEADERS)]
    key = hashlib.sha256("\0".join([*texts, *flags, *LINK_FLAGS, compiler, _cpu_flags()]).encode())
    target = _build_dir() / f"genfleet_native_{key.hexdigest()[:16]}.so"
    if not target.exists():
        _compile(compiler, flags, target)
    return ctypes.CDLL(str(target))


DTYPE_SUFFIXES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


class NativeOp:
    """One C entry point per element type (``<name>_float32``, ``<name>_bfloat16``),
    typed for ctypes and looked up on first use."""

    def __init__(self, name: str, *argtypes: type) -> None:
        self.name = name
        self.argtypes = list(argtypes)
        self._by_dtype: dict[torch.dtype, Callable[..., None]] = {}

    def __call__(self, dtype: torch.dtype, *args: object) -> None:
        function = self._by_dtype.get(dtype)
        if function is None:
            function = getattr(load_library(), f"{self.name}_{DTYPE_SUFFIXES[dtype]}")
            function.argtypes = self.argtypes
            function.restype = None
            self._by_dtype[dtype] = function
        function(*args)
