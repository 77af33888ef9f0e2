"""Hypothesis strategies for what clients send: job records and OpenAI bodies, each a
valid document with up to two fields set to extreme values (from the chaos pools)."""

from typing import Any

from hypothesis import strategies as st

from genfleet.chaos.records import EXTREME_FLOATS, EXTREME_INTS, EXTREME_STRINGS

# Any JSON value, scalars from the extreme pools included.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(EXTREME_INTS),
    st.integers(),
    st.sampled_from(EXTREME_FLOATS),
    st.floats(),
    st.sampled_from(EXTREME_STRINGS),
    st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=12,
)
extremes = st.one_of(
    st.sampled_from(EXTREME_INTS),
    st.sampled_from(EXTREME_FLOATS),
    st.sampled_from(EXTREME_STRINGS),
    st.lists(st.sampled_from(EXTREME_INTS), max_size=4),
    st.lists(st.sampled_from(EXTREME_STRINGS), max_size=4),
    st.just([f"s{i}" for i in range(1000)]),
    json_values,
)

# Valid values of every field: the base a few corruptions are made to.
token_ids = st.lists(st.integers(0, 400), min_size=1, max_size=8)
texts = st.text(max_size=60) | st.just("word " * 2000)  # the latter: over the context
chats = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": texts}
    ),
    min_size=1,
    max_size=3,
)
VALID_SAMPLING: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 500),
    "min_p": st.floats(0, 1),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "min_tokens": st.integers(0, 2),
    "stop": st.lists(st.text(min_size=1, max_size=5), max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 400), max_size=3),
    "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(),
}
sampling = st.fixed_dictionaries(
    {"max_tokens": st.integers(3, 8)},
    optional={**VALID_SAMPLING, "logprobs": st.integers(0, 5)},
)
valid_jobs = st.fixed_dictionaries(
    {
        "job_id": st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
        "sampling": sampling,
    },
    optional={
        "tenant": st.from_regex(r"[a-z]{1,8}", fullmatch=True),
        "priority": st.integers(-5, 5),
        "metadata": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    },
).flatmap(
    lambda job: st.one_of(
        texts.map(lambda text: {**job, "prompt": text}),
        token_ids.map(lambda ids: {**job, "prompt_token_ids": ids}),
        chats.map(lambda chat: {**job, "messages": chat}),
    )
)
TOP_FIELDS = (
    "job_id", "tenant", "prompt", "prompt_token_ids", "messages", "priority", "deadline",
    "metadata", "schema_version", "sampling",
)  # fmt: skip
SAMPLING_FIELDS = (*VALID_SAMPLING, "max_tokens", "logprobs")


@st.composite
def corrupted(
    draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]], fields: tuple[str, ...]
) -> dict[str, Any]:
    """A valid document with up to two fields (``a.b``: nested) set to extreme values."""
    document = draw(base)
    for _ in range(draw(st.integers(0, 2))):
        *parents, name = draw(st.sampled_from(fields)).split(".")
        target = document
        for parent in parents:
            if not isinstance(target.get(parent), dict):
                target[parent] = {}
            target = target[parent]
        target[name] = draw(extremes)
    return document


job_records = corrupted(
    valid_jobs, (*TOP_FIELDS, *(f"sampling.{name}" for name in SAMPLING_FIELDS))
)
OPENAI_FIELDS = (*SAMPLING_FIELDS, "n", "priority", "stream", "model", "user")
openai_common = st.fixed_dictionaries(
    {"max_tokens": st.integers(3, 8)},
    optional={**VALID_SAMPLING, "n": st.integers(1, 3), "priority": st.integers(-5, 5)},
)
chat_bodies = corrupted(
    st.tuples(openai_common, chats, st.booleans(), st.integers(0, 5)).map(
        lambda b: {
            **b[0],
            "messages": b[1],
            "logprobs": b[2],
            **({"top_logprobs": b[3]} if b[2] else {}),
        }
    ),
    (*OPENAI_FIELDS, "messages", "max_completion_tokens", "top_logprobs"),
)
completion_bodies = corrupted(
    st.tuples(openai_common, texts | token_ids | st.lists(token_ids, min_size=1, max_size=3)).map(
        lambda b: {**b[0], "prompt": b[1]}
    ),
    (*OPENAI_FIELDS, "prompt", "echo", "suffix"),
)

# JSON Schema-like documents: keywords of the spec with schemas, extreme values or junk.
SCHEMA_KEYWORDS = [
    "type", "properties", "items", "required", "enum", "minimum", "maximum", "pattern",
    "$ref", "format", "anyOf", "oneOf", "allOf", "const", "minItems", "maxItems",
    "minLength", "maxLength", "additionalProperties", "prefixItems", "$defs",
    "exclusiveMinimum", "multipleOf", "minProperties", "patternProperties",
]  # fmt: skip
_types = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null"])
json_schemas = st.recursive(
    st.fixed_dictionaries({}, optional={"type": _types | st.lists(_types, max_size=3)}),
    lambda inner: st.dictionaries(
        st.sampled_from(SCHEMA_KEYWORDS),
        inner
        | json_values
        | st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_size=4,
    ),
    max_leaves=10,
)
