"""The failover scenario: a worker killed mid-generation, its jobs taken over."""

import asyncio
import time
from collections import Counter

from genfleet.chaos.target import (
    JobStates,
    Results,
    Target,
    Verdict,
    job_record,
    produce,
    run_id,
    skipped,
    wait_for,
)


async def _watch_takeover(
    states: JobStates, orphans: set[str], killed: str, killed_at: float, timeout_s: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds from the kill until each orphan is another worker's (or ended), and
    until its stream goes past the last token index readers had."""
    held = {j: await states.last_index(j) for j in orphans}
    taken: dict[str, float] = {}
    stalls: dict[str, float] = {}
    while len(stalls) < len(orphans) and time.monotonic() - killed_at < timeout_s:
        for j in orphans - set(taken):
            state = await states.state(j)
            if state and (state["worker"] != killed or state["status"] != "running"):
                taken[j] = time.monotonic() - killed_at
        for j in orphans - set(stalls):
            last = await states.last_index(j)
            before = held[j]
            if last is not None and before is not None and last > before:
                stalls[j] = time.monotonic() - killed_at
        await asyncio.sleep(0.05)
    return taken, stalls


async def _busiest_worker(states: JobStates, ids: list[str], timeout_s: float) -> str | None:
    """The worker running the most of these jobs, once one runs any (None at timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = Counter(
            s["worker"]
            for s in (await states.states(ids)).values()
            if s and s["status"] == "running"
        )
        if running:
            return running.most_common(1)[0][0]
        await asyncio.sleep(0.05)
    return None


async def failover(
    target: Target,
    jobs: int = 24,
    tokens: int = 150,
    bar_s: float = 15.0,
    stall_bar_s: float = 15.0,
):
    """kill -9 of a worker mid-generation: another takes its jobs over within seconds,
    and their streams stand still no longer than ``stall_bar_s`` (from the kill to a
    token index past the last one readers had)."""
    name = "failover after kill -9"
    faults = target.faults
    if faults.kill_worker is None:
        return skipped(name, "kill a worker")
    run = run_id()
    ids = [f"{run}-{i}" for i in range(jobs)]
    states = JobStates(target)
    try:
        async with Results(target) as results:
            await produce(target, [(job_id.encode(), job_record(job_id, tokens)) for job_id in ids])
            # Mid-generation: the kill must find jobs running, or it measures nothing.
            busiest = await _busiest_worker(states, ids, target.timeout_s)
            killed = await asyncio.to_thread(faults.kill_worker, busiest)
            killed_at = time.monotonic()
            now = await states.states(ids)
            orphans = {
                j
                for j, s in now.items()
                if s and s["status"] == "running" and s["worker"] == killed
            }
            taken, stalls = await _watch_takeover(
                states, orphans, killed, killed_at, target.timeout_s
            )
            await wait_for(lambda: len(results.counts()) >= jobs, target.timeout_s)
            await asyncio.sleep(2.0)
            counts = results.counts()
    finally:
        await states.close()
    slowest = max(taken.values(), default=0.0)
    stall = max(stalls.values(), default=0.0)
    once = sum(counts[j] == 1 for j in ids)
    passed = (
        len(taken)
        == len(stalls)
        == len(orphans)
        > 0  # a kill that stalled nothing measured nothing
        and slowest <= bar_s
        and stall <= stall_bar_s
        and once == jobs
    )
    detail = (
        f"{killed} killed with {len(orphans)} jobs running; taken over {len(taken)}, "
        f"slowest after {slowest:.1f} s (bar {bar_s:.0f} s); longest stream stall "
        f"{stall:.1f} s (bar {stall_bar_s:.0f} s); one result {once}/{jobs}"
    )
    return Verdict(name, passed, detail)
