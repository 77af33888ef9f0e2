"""Scheduling decisions on CPU: budgets, priorities, chunking and preemption, no model."""

from worker.config import EngineConfig
from worker.engine.block_manager import BlockManager
from worker.engine.scheduler import Scheduler, SchedulerOutput
from worker.engine.sequence import Sequence
from worker.sampling_params import SamplingParams

BLOCK = 4


def _scheduler(num_blocks: int = 64, **overrides: object) -> Scheduler:
    config = EngineConfig(block_size=BLOCK, watermark=0.0, **overrides)  # type: ignore[arg-type]
    return Scheduler(config, BlockManager(num_blocks, BLOCK, enable_prefix_caching=False))


def _add(scheduler: Scheduler, name: str, prompt_len: int, priority: int = 0) -> Sequence:
    seq = Sequence(
        name,
        list(range(1, prompt_len + 1)),
        SamplingParams(max_tokens=100),
        arrival_index=int(name[1:]),
        priority=priority,
    )
    scheduler.add(seq)
    return seq


def _complete(out: SchedulerOutput) -> None:
    """What the engine does after a step: advance, and sample where a sequence caught up."""
    for seq, n in zip(out.seqs, out.num_new_tokens, strict=True):
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(7)


def test_budget_and_sequence_cap_hold_every_step() -> None:
    scheduler = _scheduler(max_num_batched_tokens=20, max_num_seqs=3)
    for i in range(6):
        _add(scheduler, f"s{i}", prompt_len=5 + 7 * i)
    for _ in range(40):
        out = scheduler.schedule()
        assert out.total_tokens <= 20
        assert len(out.seqs) <= 3
        assert len(scheduler.running) <= 3
        _complete(out)


def test_chunked_prefill_mixes_with_decodes() -> None:
    scheduler = _scheduler(max_num_batched_tokens=10)
    short = _add(scheduler, "s0", prompt_len=4)
    _complete(scheduler.schedule())  # s0 prefilled, now decoding
    long = _add(scheduler, "s1", prompt_len=25)
    out = scheduler.schedule()
    assert out.seqs == [short, long]
    assert out.num_new_tokens == [1, 9]
    _complete(out)
    out = scheduler.schedule()
    assert out.num_new_tokens == [1, 9]
    assert long.num_computed_tokens == 9


def test_without_chunking_a_prompt_waits_for_a_step_it_fits_in_whole() -> None:
    scheduler = _scheduler(max_num_batched_tokens=10, enable_chunked_prefill=False)
    first = _add(scheduler, "s0", prompt_len=6)
    _add(scheduler, "s1", prompt_len=6)
    out = scheduler.schedule()
    assert out.seqs == [first]
    assert out.num_new_tokens == [6]


def test_lower_priority_value_is_admitted_first_then_arrival_order() -> None:
    scheduler = _scheduler(max_num_seqs=2)
    _add(scheduler, "s1", 4, priority=5)
    b = _add(scheduler, "s2", 4, priority=0)
    c = _add(scheduler, "s3", 4, priority=0)
    out = scheduler.schedule()
    assert out.seqs == [b, c]


def test_preemption_evicts_the_least_important_and_requeues_it() -> None:
    # Five blocks: two sequences of 8 tokens take two blocks each; growth forces a preemption.
    scheduler = _scheduler(num_blocks=5)
    old = _add(scheduler, "s1", 8)
    new = _add(scheduler, "s2", 8)
    _complete(scheduler.schedule())
    for _ in range(4):
        out = scheduler.schedule()
        _complete(out)
        if out.preempted:
            break
    assert out.preempted == [new]
    assert new.num_computed_tokens == 0
    assert new.num_tokens == 9  # its generated token is kept, to be recomputed
    assert scheduler.running == [old]
    assert scheduler.waiting[0][1] is new
    assert scheduler.num_preemptions == 1


def test_a_sequence_that_cannot_grow_alone_preempts_itself_without_looping() -> None:
    scheduler = _scheduler(num_blocks=2)
    seq = _add(scheduler, "s1", 8)
    _complete(scheduler.schedule())
    out = scheduler.schedule()
    assert out.preempted == [seq]
    assert not out.seqs
