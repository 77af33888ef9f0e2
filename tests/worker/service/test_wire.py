"""Engine outputs to wire messages, without a broker: the pure part of the worker."""

import subprocess
import sys
from datetime import UTC, datetime

from aiokafka.structs import TopicPartition

from queue_schemas import JobRequest, JobStatus
from worker.engine_process.protocol import Output
from worker.outputs import FinishReason, RequestDelta, Timings, Usage
from worker.service.flights import Attempts, InFlight, Record
from worker.service.records import Rejected
from worker.service.wire import (
    cancelled_result,
    finished_line,
    finished_result,
    refusal,
    rejected_result,
    token_event,
)


def _flight() -> InFlight:
    job = JobRequest(job_id="j1", tenant="acme", prompt="hi", metadata={"k": "v"})
    record = Record(TopicPartition("jobs", 0), 7)
    return InFlight(job, record, datetime(2026, 1, 1, tzinfo=UTC), "w-0")


def _output(index: int, ids: list[int], text: str, finish: FinishReason | None = None) -> Output:
    delta = RequestDelta(
        request_id="w-0",
        token_index=index,
        new_token_ids=ids,
        new_text=text,
        new_logprobs=[],
        finished=finish is not None,
        finish_reason=finish,
        stop_reason=None,
        usage=Usage(3, index + len(ids), 1),
        timings=Timings(100.0, 101.5, 102.0 if finish else None),
    )
    return Output(delta)


def test_events_number_tokens_and_the_result_carries_them_all() -> None:
    flight = _flight()
    first = token_event(flight, _output(0, [5, 6], "He"))
    assert token_event(flight, _output(2, [], "")) is None  # a step that added nothing
    last = _output(2, [7], "llo", finish="length")
    second = token_event(flight, last)
    assert first is not None and second is not None
    assert (first.token_index, second.token_index) == (0, 2)
    assert len(flight.events) == 2
    result = finished_result(flight, last, "w")
    assert result.status is JobStatus.COMPLETED
    assert (result.text, result.token_ids) == ("Hello", [5, 6, 7])
    assert result.finish_reason == "length"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 3)
    assert result.usage.cached_tokens == 1
    assert result.first_token_at == datetime.fromtimestamp(101.5, UTC)
    assert result.metadata == {"k": "v"} and result.tenant == "acme"


def _published(flight: InFlight, steps: list[Output], interval: int) -> list[tuple[int, str]]:
    events = [token_event(flight, step, interval) for step in steps]
    return [(e.token_index, e.text) for e in events if e is not None]


def test_a_stream_interval_groups_tokens_within_fixed_bounds() -> None:
    flight = _flight()
    steps = [_output(i, [100 + i], f"t{i} ") for i in range(10)]
    steps.append(_output(10, [110], "end", finish="stop"))
    published = _published(flight, steps, interval=4)
    # The first token at once; then up to each multiple of 4; the rest at the finish.
    assert published == [
        (0, "t0 "),
        (1, "t1 t2 t3 "),
        (4, "t4 t5 t6 t7 "),
        (8, "t8 t9 end"),
    ]
    assert [e.token_ids for e in flight.events][-1] == [108, 109, 110]
    assert [e.last_index for e in flight.events] == [0, 3, 7, 10]
    assert flight.pending is None
    assert finished_result(flight, steps[-1], "w").text == "".join(t for _, t in published)
    # Every attempt at the job groups alike: a reader drops a regenerated event whole.
    again = _flight()
    assert _published(again, steps, interval=4) == published
    # The default publishes every step.
    assert len(_published(_flight(), steps, interval=1)) == len(steps)


def test_an_abort_publishes_the_tokens_held_back() -> None:
    flight = _flight()
    steps = [_output(0, [5], "a"), _output(1, [6], "b"), _output(2, [], "", finish="abort")]
    assert _published(flight, steps, interval=8) == [(0, "a"), (1, "b")]


def test_grouped_events_keep_each_tokens_logprobs_and_texts() -> None:
    flight = _flight()
    steps = []
    for i in range(3):
        step = _output(i, [10 + i], f"x{i}")
        step.delta.new_logprobs = [{10 + i: -0.5 * i}]
        step.token_texts = {10 + i: f"x{i}"}
        steps.append(step)
    published = [token_event(flight, step, 4) for step in steps]
    grouped = token_event(flight, _output(3, [], "", finish="stop"), 4)
    assert published[0] is not None and published[1:] == [None, None] and grouped is not None
    assert grouped.token_ids == [11, 12]
    assert grouped.logprobs == [{11: -0.5}, {12: -1.0}]
    assert grouped.token_texts == {11: "x1", 12: "x2"}


def test_an_aborted_run_is_a_cancelled_result() -> None:
    flight = _flight()
    result = finished_result(flight, _output(0, [], "", finish="abort"), "w")
    assert result.status is JobStatus.CANCELLED and result.finish_reason == "abort"
    before = cancelled_result(flight.job, "w")
    assert before.status is JobStatus.CANCELLED and before.worker == "w"


def test_a_rejected_record_fails_visibly_only_when_it_names_a_job() -> None:
    assert rejected_result(Rejected("not JSON", "unreadable"), "not JSON", "w") is None
    failure = rejected_result(Rejected("bad", "invalid", "j9", "acme"), "bad: reason", "w")
    assert failure is not None
    assert (failure.job_id, failure.tenant, failure.status) == ("j9", "acme", JobStatus.FAILED)
    assert failure.error == "bad: reason" and failure.finish_reason == "error"


def test_refusals_name_the_engine_reason() -> None:
    job = _flight().job
    assert refusal(job, ValueError("the prompt is empty")).reason == "the prompt is empty"
    assert "KeyError" in refusal(job, KeyError("x")).reason


def test_attempts_are_never_reused() -> None:
    attempts = Attempts("w")
    names = {attempts.next() for _ in range(100)}
    assert len(names) == 100 and all(name.startswith("w-") for name in names)


def test_the_service_process_imports_no_torch() -> None:
    code = (
        "import sys, worker.service.app\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_finished_job_logs_one_line_with_its_facts() -> None:
    flight = _flight()
    flight.job = flight.job.model_copy(update={"created_at": datetime.fromtimestamp(100.0, UTC)})
    token_event(flight, _output(0, [5, 6], "He"))
    result = finished_result(flight, _output(2, [7], "llo", finish="stop"), "w")
    text, fields = finished_line(result, "w-0", Record(TopicPartition("jobs", 3), 7, b"acme/9f2c"))
    assert fields["job_id"] == "j1" and fields["tenant"] == "acme"
    assert (fields["prompt_tokens"], fields["output_tokens"]) == (3, 3)
    assert fields["ttft_s"] == 1.5 and fields["attempt"] == "w-0"
    assert fields["status"] == "completed"
    assert text.startswith("job acme/j1 completed: 3 prompt + 3 output tokens, ttft 1.5 s")
    assert (fields["key"], fields["partition"]) == ("acme/9f2c", 3)
    assert text.endswith("key acme/9f2c on partition 3")
    assert "hi" not in text and "Hello" not in text  # neither prompt nor output text
