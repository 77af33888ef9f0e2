"""Chat prompts with tools: a template that takes them renders them (and the history's
calls, arguments as objects); one that does not (SmolLM2's) gets genfleet's tool prompt;
the tool-call parser follows the template's format."""

import copy

import pytest
from transformers import AutoTokenizer

from queue_schemas import JobRequest
from worker.engine_process.prompts import engine_prompt, template_tool_parser

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
]  # fmt: skip
# A template that takes tools, as Qwen's does (shortened).
WITH_TOOLS = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}"
    "{% endfor %}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.arguments | tojson }}"
    "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


def _with_template(tokenizer, template: str):
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    return other


def _job(**fields) -> JobRequest:
    return JobRequest(job_id="j", messages=HISTORY, tools=[WEATHER], **fields)


def test_a_template_without_tools_gets_the_tool_prompt(smollm2_tokenizer) -> None:
    text = engine_prompt(_job(), smollm2_tokenizer)
    assert '"name": "get_weather"' in text and "<tool_call>" in text
    # The earlier call as a block with its arguments as an object; the result a user turn.
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<|im_start|>user\n<tool_response>\n21 C\n</tool_response>" in text
    assert template_tool_parser(smollm2_tokenizer) == "hermes"


def test_a_template_with_tools_renders_them_its_own_way(smollm2_tokenizer) -> None:
    tokenizer = _with_template(smollm2_tokenizer, WITH_TOOLS)
    text = engine_prompt(_job(), tokenizer)
    assert text.startswith("<|im_start|>system\nTools: get_weather")
    assert '<tool_call>{"city": "Paris"}</tool_call>' in text  # not a JSON string
    assert "You can call functions" not in text
    assert template_tool_parser(tokenizer) == "hermes"


def test_tool_choice_none_renders_no_tools(smollm2_tokenizer) -> None:
    text = engine_prompt(_job(tool_choice="none"), smollm2_tokenizer)
    assert "You can call functions" not in text and "get_weather" in text  # the history's


def test_auto_is_refused_where_the_worker_does_not_serve_it(smollm2_tokenizer) -> None:
    with pytest.raises(ValueError, match="--enable-auto-tool-choice"):
        engine_prompt(_job(), smollm2_tokenizer, auto_tool_choice=False)
    assert engine_prompt(_job(tool_choice="required"), smollm2_tokenizer, auto_tool_choice=False)


@pytest.mark.parametrize(
    ("marker", "parser"),
    [("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json"),
     ("[func_name1(params_name1=params_value1)]", "pythonic"), ("<tool_call>", "hermes")],
)  # fmt: skip
def test_the_parser_follows_the_template_s_format(smollm2_tokenizer, marker, parser) -> None:
    template = "{% if tools %}" + marker + "{% endif %}{{ messages[0].content }}"
    assert template_tool_parser(_with_template(smollm2_tokenizer, template)) == parser
