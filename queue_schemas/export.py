"""Write the JSON Schema of every message next to the models: ``python -m queue_schemas.export``."""

import json
from pathlib import Path

from pydantic import BaseModel

from queue_schemas.jobs import JobRequest
from queue_schemas.messages import CancelJob, DeadLetter, JobResult, JobState, TokenEvent

SCHEMA_DIR = Path(__file__).parent / "json"
MODELS: tuple[type[BaseModel], ...] = (
    JobRequest, TokenEvent, JobState, JobResult, DeadLetter, CancelJob,
)  # fmt: skip


def schemas() -> dict[str, str]:
    """File name -> JSON Schema text, as checked in."""
    return {
        f"{model.__name__}.json": json.dumps(model.model_json_schema(), indent=2, sort_keys=True)
        + "\n"
        for model in MODELS
    }


def main() -> None:
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name, text in schemas().items():
        (SCHEMA_DIR / name).write_text(text)
        print(SCHEMA_DIR / name)


if __name__ == "__main__":
    main()
