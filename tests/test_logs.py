"""Log lines: JSON objects off a terminal (with a call's extra fields), human text on one."""

import json
import subprocess
import sys

import pytest

SCRIPT = """
import logging, sys
from queue_schemas.logs import configure_logging
configure_logging(sys.argv[1])
logging.getLogger("genfleet.worker").info(
    "job acme/j1 completed", extra={"job_id": "j1", "output_tokens": 12}
)
"""


def _stderr(log_format: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, log_format], capture_output=True, text=True, check=True
    )
    return result.stderr.strip()


@pytest.mark.parametrize("log_format", ["json", "auto"])  # auto: stderr is a pipe here
def test_json_lines_carry_the_fields(log_format: str) -> None:
    (line,) = _stderr(log_format).splitlines()
    record = json.loads(line)
    assert record["message"] == "job acme/j1 completed"
    assert (record["level"], record["logger"]) == ("INFO", "genfleet.worker")
    assert (record["job_id"], record["output_tokens"]) == ("j1", 12)
    assert "time" in record


def test_text_lines_are_for_people() -> None:
    line = _stderr("text")
    assert line.endswith("INFO genfleet.worker job acme/j1 completed")
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)
