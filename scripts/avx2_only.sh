#!/usr/bin/env bash
# Run a command as on an AVX2-only CPU, on a host with AVX-512: torch's kernels, oneDNN
# and MKL capped at AVX2, torch's CPU queries answering no AVX-512/AVX512-BF16/AMX
# (scripts/avx2_only/sitecustomize.py), the native kernels built for x86-64-v3.
# What it cannot emulate: an AVX-512 core runs AVX2 at its own speed, which an older
# AVX2-only CPU may not. Usage: scripts/avx2_only.sh make test
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export ATEN_CPU_CAPABILITY=avx2
export ONEDNN_MAX_CPU_ISA=AVX2
export MKL_ENABLE_INSTRUCTIONS=AVX2
export GENFLEET_NATIVE_MARCH=x86-64-v3
export PYTHONPATH="$here/avx2_only${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
