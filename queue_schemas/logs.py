"""How every fleet process logs: human lines on a terminal, JSON lines elsewhere.

A JSON line is one object with ``time``, ``level``, ``logger`` and ``message``,
plus the fields a call passes in ``extra`` (a finished job's id, tenant,
tokens and times), so a log shipper indexes them without parsing the text.
The same call prints the human line. Shared by the API and the worker, as
their settings are; prompt and output text are never logged.
"""

import logging
import sys
from typing import Literal

from pythonjsonlogger.json import JsonFormatter

LogFormat = Literal["auto", "json", "text"]
HUMAN_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure_logging(log_format: LogFormat = "auto") -> None:
    """``auto``: JSON unless standard error is a terminal."""
    json_lines = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler()
    if json_lines:
        handler.setFormatter(
            JsonFormatter(
                "{asctime}{levelname}{name}{message}",
                style="{",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter(HUMAN_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
