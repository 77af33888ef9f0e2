#!/usr/bin/env bash
# Run here, before the GPU check: what scripts/gpu_check.py needs that the GPU
# machine lacks goes into .gpu_check/ (ignored by git, carried by the run):
# pydantic's and jsonschema's wheels (the wire schemas the engine imports, and
# their check of a structured-output JSON Schema), pydantic-settings' (the bench's
# flags are made from the engine's settings), gguf's and pyyaml's (quantized
# weights' formats), and SmolLM2's config and tokenizer files (its weights are
# too large to travel; the check builds random weights of its architecture).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .gpu_check/whl .gpu_check/smollm2
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx "/.gpu_check/" "$EXCLUDE" 2>/dev/null || echo /.gpu_check/ >> "$EXCLUDE"
for spec in "pydantic==$($PY -c 'import pydantic; print(pydantic.VERSION)')" \
            "pydantic-core==$($PY -c 'import pydantic_core; print(pydantic_core.__version__)')" \
            annotated-types typing-inspection \
            "pydantic-settings==$($PY -c 'import importlib.metadata as m; print(m.version("pydantic-settings"))')" \
            python-dotenv \
            "jsonschema==$($PY -c 'import importlib.metadata as m; print(m.version("jsonschema"))')" \
            jsonschema-specifications referencing rpds-py \
            "gguf==$($PY -c 'import importlib.metadata as m; print(m.version("gguf"))')" pyyaml; do
  $PY -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu_check/whl "$spec"
done
MODEL=$($PY -m genfleet.cli model fetch 2>/dev/null | tail -1)
for name in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "$MODEL/$name" ] && cp "$MODEL/$name" .gpu_check/smollm2/
done
du -sh .gpu_check
cat <<'CMD'
On the GPU machine (device run, carry [".gpu_check"], timeout_s 540):
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu_check/whl/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py
CMD
