"""Constrained decoding with xgrammar, as vLLM's structured outputs do it.

An engine builds the tokenizer's vocabulary table once and compiles each
constraint once (cached by its digest, failures too); every constrained
request gets its own matcher. Each step, the constrained rows' masks are
filled into one token bitmask and applied to their logits before sampling;
rows without a constraint are not touched. The matcher is advanced with every
accepted token; the stop tokens are allowed only where the grammar may end.

Preemption needs no rollback here: a preempted sequence keeps its tokens and
recomputes their KV, so its matcher's state stays the state after its last
token.

xgrammar is imported on first use: an engine that never sees a constraint
never loads it.
"""

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence as Many
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from queue_schemas.structured import StructuredOutputs

if TYPE_CHECKING:
    import xgrammar

log = logging.getLogger("genfleet.engine")

CACHE_ENTRIES = 256
# xgrammar prefixes its errors with a time and a C++ source position.
_SOURCE_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


# The background compile's niceness. On a host with few cores a large schema's compile
# would otherwise take a core from the engine's threads and slow every step (measured on
# 2 cores: a step loop ran at 27 % of its speed during a 4 s compile, 98 % at niceness 19).
COMPILE_NICENESS = 19


def _lower_priority() -> None:
    with contextlib.suppress(AttributeError, OSError):  # not Linux: left as it is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)


def _reason(error: Exception) -> str:
    message = _SOURCE_PREFIX.sub("", str(error).strip()).strip()
    return message or type(error).__name__


def choice_grammar(choices: Many[str]) -> str:
    """An EBNF grammar whose only sentences are the choices (JSON string escapes, which
    xgrammar's EBNF literals read the same way)."""
    return "root ::= " + " | ".join(json.dumps(choice) for choice in choices)


class GrammarState:
    """One request's place in its grammar."""

    def __init__(self, compiled: "xgrammar.CompiledGrammar") -> None:
        import xgrammar

        self.matcher = xgrammar.GrammarMatcher(compiled)

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False when the grammar does not allow it."""
        return bool(self.matcher.accept_token(token_id))

    @property
    def terminated(self) -> bool:
        """A stop token was accepted where the grammar may end: the output is complete."""
        return bool(self.matcher.is_terminated())

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accepted_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the grammar takes in a row from here, short of one that
        would end it (nothing may follow an ended grammar, not even a verifying row);
        the state is left as it was."""
        taken = 0
        for token in tokens:
            if not self.matcher.accept_token(token):
                break
            taken += 1
            if self.matcher.is_terminated():
                taken -= 1
                self.matcher.rollback(1)
                break
        if taken:
            self.matcher.rollback(taken)
        return taken


class Constrained(Protocol):
    """What the mask needs of a sequence."""

    @property
    def constraint(self) -> GrammarState | None: ...


class Grammars:
    """Compiles constraints for one engine's tokenizer; safe to use from two threads
    (the engine's, and the background compile of ``compile_in_background``)."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: set[int]
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._cache: OrderedDict[str, xgrammar.CompiledGrammar | ValueError] = OrderedDict()
        self._lock = threading.Lock()
        self._background = ThreadPoolExecutor(
            1, thread_name_prefix="grammar", initializer=_lower_priority
        )

    def _xgrammar_compiler(self) -> "xgrammar.GrammarCompiler":
        import xgrammar

        if self._compiler is None:
            info = xgrammar.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._stop_token_ids
            )
            # One thread: compiling shares the machine with the engine's steps.
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compiler

    def _build(self, constraint: StructuredOutputs) -> "xgrammar.CompiledGrammar":
        compiler = self._xgrammar_compiler()
        kind, spec = constraint.kind, constraint.spec
        # Compact JSON: free whitespace lets a small model fill max_tokens with newlines.
        if kind == "json":
            return compiler.compile_json_schema(spec, any_whitespace=False, strict_mode=True)
        if kind == "json_object":
            return compiler.compile_json_schema(
                '{"type": "object"}', any_whitespace=False, strict_mode=False
            )
        if kind == "regex":
            return compiler.compile_regex(spec)
        if kind == "choice":
            return compiler.compile_grammar(choice_grammar(constraint.choice or []))
        return compiler.compile_grammar(spec)

    def is_cached(self, constraint: StructuredOutputs) -> bool:
        with self._lock:
            return constraint.digest in self._cache

    def compile(self, constraint: StructuredOutputs) -> "xgrammar.CompiledGrammar":
        """The compiled grammar, from the cache when it was compiled before; ValueError
        with the compiler's reason when it cannot be."""
        key = constraint.digest
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
        if compiled is None:
            began = time.perf_counter()
            try:
                compiled = self._build(constraint)
            except Exception as error:  # the compiler's errors are RuntimeErrors
                compiled = ValueError(f"cannot compile the {constraint.kind}: {_reason(error)}")
            log.debug("compiled a %s in %.3f s", constraint.kind, time.perf_counter() - began)
            with self._lock:
                self._cache[key] = compiled
                while len(self._cache) > CACHE_ENTRIES:
                    self._cache.popitem(last=False)
        if isinstance(compiled, ValueError):
            raise compiled
        return compiled

    def compile_in_background(self, constraint: StructuredOutputs) -> "Future[None]":
        """Compile off the engine's thread, at the lowest CPU priority; the future is done
        (never failed) once ``compile`` answers from the cache."""

        def run() -> None:
            # A failure is cached too: the request that waits is refused with the reason.
            with contextlib.suppress(ValueError):
                self.compile(constraint)

        return self._background.submit(run)

    def state(self, constraint: StructuredOutputs) -> GrammarState:
        return GrammarState(self.compile(constraint))

    def close(self) -> None:
        """End the background compile thread (after a compile under way)."""
        self._background.shutdown(wait=True, cancel_futures=True)


def masks_along(logits: torch.Tensor, state: GrammarState, drafts: list[int]) -> torch.Tensor:
    """A verifying sequence's logits [len(drafts) + 1, vocab], row j masked by its
    grammar as it stands after ``drafts[:j]`` (which the grammar takes: the proposer
    cut them to ``accepted_prefix``); the state is left as it was."""
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(len(drafts) + 1, logits.shape[1])
    for row, token in enumerate(drafts):
        state.fill_mask(bitmask, row)
        state.accept(token)
    state.fill_mask(bitmask, len(drafts))
    if drafts:
        state.matcher.rollback(len(drafts))
    masked = logits.clone()
    xgrammar.apply_token_bitmask_inplace(masked, bitmask.to(logits.device, non_blocking=True))
    return masked


def apply_masks(logits: torch.Tensor, rows: Many[Constrained]) -> torch.Tensor:
    """Logits with every token a row's grammar forbids at -inf; the same tensor when no
    row is constrained, else a copy (the raw logits stay for logprobs)."""
    constrained = [i for i, row in enumerate(rows) if row.constraint is not None]
    if not constrained:
        return logits
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(len(rows), logits.shape[1])
    for i in constrained:
        state = rows[i].constraint
        assert state is not None
        state.fill_mask(bitmask, i)
    masked = logits.clone()
    xgrammar.apply_token_bitmask_inplace(
        masked, bitmask.to(logits.device, non_blocking=True), indices=constrained
    )
    return masked
