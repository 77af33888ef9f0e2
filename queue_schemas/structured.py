"""A job's output constraint: a JSON Schema, any JSON object, a regex, a choice or a grammar.

The names are vLLM's ``structured_outputs`` fields. What can be checked
without a tokenizer is checked here, where every producer's job is parsed: one
kind at a time, and a JSON Schema that is valid JSON Schema. Whether a regex or
an EBNF grammar compiles is known only to a worker, which fails the job with
the compiler's reason.
"""

import hashlib
import json
from typing import Annotated, Any, Literal

from jsonschema import SchemaError
from jsonschema.validators import validator_for
from pydantic import Field, field_validator, model_validator

from queue_schemas.bounds import MAX_CHOICE_OPTION_CHARS, MAX_CHOICE_OPTIONS
from queue_schemas.versioning import WireModel

ConstraintKind = Literal["json", "json_object", "regex", "choice", "grammar"]
KINDS: tuple[ConstraintKind, ...] = ("json", "json_object", "regex", "choice", "grammar")

ChoiceText = Annotated[str, Field(min_length=1, max_length=MAX_CHOICE_OPTION_CHARS)]
ChoiceList = Annotated[list[ChoiceText], Field(min_length=1, max_length=MAX_CHOICE_OPTIONS)]


def check_json_schema(schema: object) -> dict[str, Any]:
    """The schema as an object, or ValueError naming what is wrong with it."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (json.JSONDecodeError, RecursionError) as error:
            raise ValueError(f"the JSON Schema is not JSON: {error}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON Schema must be an object, not {type(schema).__name__}")
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as error:
        where = "/".join(str(part) for part in error.path)
        raise ValueError(
            f"not a valid JSON Schema{f' at {where}' if where else ''}: {error.message}"
        ) from None
    except RecursionError:
        raise ValueError("the JSON Schema is nested too deeply") from None
    return schema


class StructuredOutputs(WireModel):
    """Exactly one constraint; the output is generated so that it matches it."""

    json_schema: dict[str, Any] | None = Field(
        default=None,
        alias="json",
        description="a JSON Schema (an object, or its text) the output must validate against",
    )
    json_object: bool | None = Field(default=None, description="true: any JSON object")
    regex: Annotated[str, Field(min_length=1)] | None = Field(
        default=None, description="a regular expression the whole output must match"
    )
    choice: ChoiceList | None = Field(
        default=None, description="the output is exactly one of these strings"
    )
    grammar: Annotated[str, Field(min_length=1)] | None = Field(
        default=None, description="an EBNF grammar (GBNF style, start rule `root`)"
    )

    model_config = WireModel.model_config | {"populate_by_name": True, "serialize_by_alias": True}

    @field_validator("json_schema", mode="before")
    @classmethod
    def _valid_json_schema(cls, schema: object) -> object:
        return None if schema is None else check_json_schema(schema)

    @model_validator(mode="after")
    def _exactly_one(self) -> "StructuredOutputs":
        given = [kind for kind in KINDS if self._value(kind) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"structured outputs take exactly one of {', '.join(KINDS)}; "
                f"got {', '.join(given) or 'none'}"
            )
        return self

    def _value(self, kind: ConstraintKind) -> object:
        return self.json_schema if kind == "json" else getattr(self, kind)

    @property
    def kind(self) -> ConstraintKind:
        return next(kind for kind in KINDS if self._value(kind) not in (None, False))

    @property
    def spec(self) -> str:
        """The constraint as one text: the schema in compact JSON (keys in their order,
        which is the order the output's properties take), the choices as a JSON list,
        the regex or the grammar as given."""
        value = self._value(self.kind)
        if isinstance(value, str):
            return value
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    @property
    def digest(self) -> str:
        """Equal for equal constraints: what compiled grammars are cached by."""
        return hashlib.sha256(f"{self.kind}\0{self.spec}".encode()).hexdigest()
