"""Affinity keys: the turns of one conversation alike, other conversations apart."""

from hypothesis import given
from hypothesis import strategies as st

from producer_api.services.affinity import OPENING_CHARS, OPENING_TOKENS, affinity_key
from queue_schemas import JobRequest
from queue_schemas.jobs import ChatMessage


def chat(*turns: tuple[str, str], tenant: str = "default") -> JobRequest:
    messages = [ChatMessage(role=role, content=content) for role, content in turns]  # type: ignore[arg-type]
    return JobRequest(job_id="j", tenant=tenant, messages=messages)


SYSTEM = ("system", "You are terse.")


def test_every_turn_of_a_chat_has_its_first_turns_key() -> None:
    opening = [SYSTEM, ("user", "Plan a trip to Lyon.")]
    first = chat(*opening)
    second = chat(*opening, ("assistant", "Day 1: ..."), ("user", "And day 2?"))
    assert affinity_key(second) == affinity_key(first)
    # Another conversation: another first question, or another system prompt.
    assert affinity_key(chat(SYSTEM, ("user", "Plan a trip to Nice."))) != affinity_key(first)
    assert affinity_key(chat(("system", "Be kind."), ("user", "Plan a trip to Lyon."))) != (
        affinity_key(first)
    )
    # The same words from another tenant are another tenant's conversation.
    assert affinity_key(chat(SYSTEM, ("user", "Plan a trip to Lyon."), tenant="acme")) != (
        affinity_key(first)
    )


def test_a_hint_names_the_conversation_whatever_its_prompts() -> None:
    a = chat(("user", "one"))
    b = chat(("user", "two"))
    assert affinity_key(a, "session-7") == affinity_key(b, "session-7")
    assert affinity_key(a, "session-7") != affinity_key(a, "session-8")
    assert affinity_key(a, None) == affinity_key(a, "") != affinity_key(a, "session-7")


@given(st.text(min_size=OPENING_CHARS), st.text())
def test_a_text_prompt_keys_by_its_opening(prompt: str, more: str) -> None:
    turn = JobRequest(job_id="j", prompt=prompt)
    later = JobRequest(job_id="k", prompt=prompt + more)
    assert affinity_key(later) == affinity_key(turn)


@given(st.lists(st.integers(0, 50_000), min_size=OPENING_TOKENS, max_size=200))
def test_a_token_prompt_keys_by_its_first_tokens(ids: list[int]) -> None:
    turn = JobRequest(job_id="j", prompt_token_ids=ids)
    later = JobRequest(job_id="k", prompt_token_ids=[*ids, 1, 2, 3])
    assert affinity_key(later) == affinity_key(turn)
    changed = [(ids[0] + 1) % 50_000, *ids[1:]]
    assert affinity_key(JobRequest(job_id="x", prompt_token_ids=changed)) != affinity_key(turn)
