"""Small modules with one job each: no file over 300 lines and no function over 60
outside the kernels (whose C++ and Triton sources follow their own shape) and the tests."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("queue_schemas", "worker", "producer_api", "genfleet", "scripts")
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(path for folder in CHECKED for path in (ROOT / folder).rglob("*.py"))


def test_no_file_is_over_300_lines() -> None:
    sources = _sources()
    assert len(sources) > 100  # the walk found the code
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sources
        if (lines := len(path.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, long


def test_no_function_is_over_60_lines() -> None:
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, long
