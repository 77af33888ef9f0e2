"""A stream reader's cursor: which events are new to it, whatever their grouping."""

from queue_schemas import JobResult, JobStatus, TokenEvent
from queue_schemas.redis_records import EventCursor


def _event(index: int, count: int) -> TokenEvent:
    ids = list(range(index, index + count))
    return TokenEvent(job_id="j", token_index=index, text="x" * count, token_ids=ids)


def test_events_of_several_tokens_are_new_once_and_move_the_cursor_past_their_last() -> None:
    cursor = EventCursor()
    assert cursor.is_new(_event(0, 1)) and cursor.is_new(_event(1, 3))
    assert cursor.last_index == 3
    # The same events again (history read after live ones, a regenerated job): dropped.
    assert not cursor.is_new(_event(1, 3)) and not cursor.is_new(_event(0, 1))
    assert cursor.is_new(_event(4, 4)) and cursor.last_index == 7


def test_a_reader_resuming_after_an_index_gets_only_later_events() -> None:
    cursor = EventCursor(last_index=3)  # Last-Event-ID: 3, the last token of [1, 3]
    assert not cursor.is_new(_event(1, 3))
    assert cursor.is_new(_event(4, 4))


def test_text_released_without_a_token_counts_as_its_index_and_results_always_pass() -> None:
    cursor = EventCursor(last_index=4)
    released = TokenEvent(job_id="j", token_index=5, text="!", token_ids=[])
    assert cursor.is_new(released) and not cursor.is_new(released)
    result = JobResult(job_id="j", status=JobStatus.COMPLETED)
    assert cursor.is_new(result) and cursor.is_new(result)
