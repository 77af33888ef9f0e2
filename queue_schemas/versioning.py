"""How messages evolve.

``schema_version`` is an integer major version. Within a version, fields are
only ever added, each optional with a default, so a reader ignores fields it
does not know (every model is ``extra="ignore"``) and a writer may omit any
field it does not use. A change that would make an old reader wrong (a
removed or renamed field, a new meaning) bumps the version; a reader refuses
versions it does not support, and a worker sends such a job to the
dead-letter topic with that reason.

A message is written at the lowest version that carries its meaning, so
readers that know only version 1 go on reading everything they can serve:

- 1: every message.
- 2: a job constrained by ``sampling.structured_outputs``. A version-1 reader
  would ignore the constraint and generate free text; it refuses the job instead.
- 3: a job whose unset sampling fields take the served model's defaults (its
  generation config; before 3 they take the neutral values), or that carries a
  ``timeout_s``; and a result whose status is ``expired``. Version 3 is never
  chosen for a record that does not say it: a job written without a version
  keeps the meaning it had.
- 4: a job with ``tools`` (or a conversation carrying tool calls), which a version-3
  reader would answer with prose, unaware of them; and a result that carries what its
  text was read as (``content``, ``reasoning``, ``tool_calls``; finish reason
  ``tool_calls``).
"""

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1
STRUCTURED_OUTPUTS_VERSION = 2
MODEL_DEFAULTS_VERSION = 3
TOOLS_VERSION = 4
SUPPORTED_VERSIONS = frozenset(
    {SCHEMA_VERSION, STRUCTURED_OUTPUTS_VERSION, MODEL_DEFAULTS_VERSION, TOOLS_VERSION}
)


class UnsupportedVersion(ValueError):
    pass


def check_version(version: int) -> None:
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersion(
            f"schema_version {version} is not supported; this reader knows "
            f"{sorted(SUPPORTED_VERSIONS)}"
        )


class WireModel(BaseModel):
    """Base of every message: unknown fields are ignored, per the versioning rules."""

    model_config = ConfigDict(extra="ignore", frozen=True)
