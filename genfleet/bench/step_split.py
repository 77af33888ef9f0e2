"""Where a batch-1 decode step's time goes: the decoder's kernels by part (from the
native chain's own profile), the output layer, sampling and scheduling, and the
Python around the kernels; through the native decoder chain and through the layer
loop it replaces. The loop calls the same kernels, so its kernel parts are the
chain's and the rest of its decoder time is the Python that calls them."""

import time
from collections.abc import Callable
from typing import Any

import torch
from rich.table import Table

from kernels import CHAIN_PARTS
from worker import LLMEngine, SamplingParams
from worker.models.chain import ChainedDecoder

Timers = dict[str, float]


def _timed(function: Callable[..., Any], timers: Timers, name: str) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        began = time.perf_counter()
        try:
            return function(*args)
        finally:
            timers[name] = timers.get(name, 0.0) + time.perf_counter() - began

    return run


def _decode_profile(
    engine: LLMEngine, prompt: list[int], tokens: int, chained: ChainedDecoder | None
) -> tuple[Timers, int]:
    """Seconds per timer over the decode steps of one request (its prefill left out),
    and the steps counted; ``chained`` None runs the layer loop."""
    runner, model = engine.runner, engine.runner.model
    model.model.chained = chained
    if chained is not None:
        chained.seconds = torch.zeros(len(CHAIN_PARTS), dtype=torch.float64)
    step_timers: Timers = {}
    runner.execute = _timed(runner.execute, step_timers, "execute")  # type: ignore[method-assign]
    model.compute_logits = _timed(model.compute_logits, step_timers, "output layer")  # type: ignore[method-assign]
    totals: Timers = {}
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    engine.add_request(f"split-{chained is not None}", prompt, params)
    steps = 0
    try:
        while engine.has_unfinished_requests():
            step_timers.clear()
            if chained is not None:
                chained.seconds.zero_()  # type: ignore[union-attr]
            began = time.perf_counter()
            engine.step()
            step_timers["step"] = time.perf_counter() - began
            steps += 1
            if steps == 1:
                continue  # the prefill
            for name, seconds in step_timers.items():
                totals[name] = totals.get(name, 0.0) + seconds
            if chained is not None:
                for name, seconds in zip(CHAIN_PARTS, chained.seconds.tolist(), strict=True):
                    totals[name] = totals.get(name, 0.0) + seconds
    finally:
        del runner.execute, model.compute_logits  # the class's methods again
        if chained is not None:
            chained.seconds = None
    return totals, steps - 1


def step_split_table(engine: LLMEngine, prompt: list[int], tokens: int) -> Table:
    """The split through the chain and through the loop (prompts distinct from each other)."""
    chained = engine.runner.model.model.chained
    if chained is None:
        return Table(title="step split: this model runs the layer loop only")
    chain, chain_steps = _decode_profile(engine, prompt, tokens, chained)
    loop, loop_steps = _decode_profile(engine, prompt[1:], tokens, None)
    engine.runner.model.model.chained = chained
    kernels = sum(chain[part] / chain_steps for part in CHAIN_PARTS)

    def rows(timers: Timers, steps: int) -> dict[str, float]:
        per_step = {name: 1000 * seconds / steps for name, seconds in timers.items()}
        decoder = per_step["execute"] - per_step["output layer"]
        parts = {part: 1000 * chain[part] / chain_steps for part in CHAIN_PARTS}
        return {
            **parts,
            "output layer": per_step["output layer"],
            "sampling, scheduling, outputs": per_step["step"] - per_step["execute"],
            "Python around the kernels": decoder - 1000 * kernels,
            "step": per_step["step"],
        }

    before, after = rows(loop, loop_steps), rows(chain, chain_steps)
    table = Table(title="genfleet batch-1 decode step, ms (kernel parts: the chain's profile)")
    for column in ("part", "layer loop (before)", "native chain (after)"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for name in before:
        table.add_row(name, f"{before[name]:.2f}", f"{after[name]:.2f}")
    return table
