"""The service's handle on a real engine process (tiny model), without Kafka or Redis."""

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop

from queue_schemas import JobRequest
from queue_schemas.bounds import MAX_RECORD_BYTES
from worker.engine_process.client import EngineClient
from worker.engine_process.protocol import Output, StepOutput
from worker.sampling_params import SamplingParams
from worker.service.settings import WorkerSettings

# Each test spawns a worker's engine process.
pytestmark = pytest.mark.integration


def test_an_idle_engine_answers_refusals_and_aborts_without_owing_a_step(
    chat_model: Path,
) -> None:
    async def scenario() -> None:
        steps: list[StepOutput] = []
        failures: list[str] = []
        client = EngineClient(WorkerSettings(model=str(chat_model)), steps.append, failures.append)
        await client.start()
        try:
            too_big = JobRequest(job_id="r1", prompt_token_ids=[10**9])
            with pytest.raises(ValueError, match="prompt token ids must be in"):
                await client.add("r1", too_big, SamplingParams(max_tokens=4))
            client.abort("no-such-request")
            await asyncio.sleep(1.0)
            # Nothing runs: the engine reported so, and a stall watch must not fire.
            assert client.stalled_for() == 0.0
            assert client.load.waiting == 0
            assert all(step.step is None for step in steps)  # answers, no steps run
            job = JobRequest(job_id="ok", prompt_token_ids=[5, 6, 7])
            await client.add("ok", job, SamplingParams(max_tokens=3, ignore_eos=True))

            def outputs() -> list[Output]:
                return [output for step in steps for output in step.outputs]

            while not any(o.delta.finished for o in outputs()):
                await asyncio.sleep(0.05)
            assert sum(len(o.delta.new_token_ids) for o in outputs()) == 3
            ran = [step.step for step in steps if step.step is not None]
            assert [stats.num_seqs for stats in ran] == [1, 1, 1]
            assert ran[0].num_tokens == 3 and ran[1].num_tokens == 1  # the prefill, a decode
            timings = outputs()[-1].delta.timings
            assert timings.scheduled_time is not None and timings.first_token_time is not None
            assert timings.arrival_time <= timings.scheduled_time <= timings.first_token_time
            assert steps[-1].counters.prefix_cache_queries == 3
            assert failures == []
        finally:
            await client.stop()

    asyncio.run(asyncio.wait_for(scenario(), 120))


@pytest.mark.parametrize(
    "new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"]
)
def test_a_record_sized_prompt_crosses_the_pipe_whole_on_any_event_loop(
    chat_model: Path, new_loop: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    """uvloop makes a watched fd non-blocking: a frame past the pipe's buffer must
    still go through whole, and be refused for the context, not taken for the
    engine's death."""

    async def scenario() -> None:
        failures: list[str] = []
        client = EngineClient(
            WorkerSettings(model=str(chat_model)), lambda _: None, failures.append
        )
        await client.start()
        try:
            prompt = "word " * (MAX_RECORD_BYTES // 5 - 100)
            # Sent back to back: the engine reads one while the next is written.
            answers = await asyncio.gather(
                *(
                    client.add(f"r{n}", JobRequest(job_id=f"r{n}", prompt=prompt), SamplingParams())
                    for n in range(3)
                ),
                return_exceptions=True,
            )
            assert all(
                isinstance(answer, ValueError) and "the model's context" in str(answer)
                for answer in answers
            ), answers
            assert failures == [] and client.failure is None
        finally:
            await client.stop()

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(asyncio.wait_for(scenario(), 120))
