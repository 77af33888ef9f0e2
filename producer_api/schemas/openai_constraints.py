"""OpenAI's and vLLM's ways to constrain a request's output, each as the jobs'
``StructuredOutputs``: ``response_format`` and vLLM's older ``guided_*`` fields."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from queue_schemas import StructuredOutputs
from queue_schemas.bounds import MAX_CHOICE_OPTIONS
from queue_schemas.structured import check_json_schema


class JsonSchemaFormat(BaseModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    # Accepted as OpenAI has it; the output follows the schema either way.
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        return check_json_schema(schema)


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs a json_schema object")
        return self

    def constraint(self) -> StructuredOutputs | None:
        if self.type == "json_object":
            return StructuredOutputs(json_object=True)
        if self.type == "json_schema" and self.json_schema is not None:
            return StructuredOutputs(json=self.json_schema.schema_)
        return None


GuidedChoice = Annotated[list[str], Field(min_length=1, max_length=MAX_CHOICE_OPTIONS)]
# vLLM's older names for the fields of structured_outputs.
GUIDED_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
