"""Engine outputs to wire messages, without a broker: the pure part of the worker."""

import subprocess
import sys
from datetime import UTC, datetime

from aiokafka.structs import TopicPartition

from queue_schemas import JobRequest, JobStatus
from worker.outputs import FinishReason, RequestDelta, Timings, Usage
from worker.service.engine_protocol import Output
from worker.service.flights import Attempts, InFlight, Record
from worker.service.intake import Rejected
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
    text, fields = finished_line(result, "w-0")
    assert fields["job_id"] == "j1" and fields["tenant"] == "acme"
    assert (fields["prompt_tokens"], fields["output_tokens"]) == (3, 3)
    assert fields["ttft_s"] == 1.5 and fields["attempt"] == "w-0"
    assert fields["status"] == "completed"
    assert text.startswith("job acme/j1 completed: 3 prompt + 3 output tokens, ttft 1.5 s")
    assert "hi" not in text and "Hello" not in text  # neither prompt nor output text
