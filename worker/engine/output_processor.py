"""After each step: append sampled tokens, detokenize, decide whether a request stops.

Stop strings are cut from the text, and while a request runs we hold back
the last ``len(longest stop string) - 1`` characters so a stream never shows
the beginning of a stop string that the next token completes.

A constrained request also stops when its grammar has ended (its matcher took
a stop token where the grammar may end), whatever ``min_tokens`` or
``ignore_eos`` ask: nothing can follow a complete output.
"""

import logging
import time

from worker.engine.sequence import Sequence
from worker.outputs import FinishReason

log = logging.getLogger("genfleet.engine")


def _find_stop_string(seq: Sequence, new_text_len: int) -> str | None:
    text = seq.output_text
    for stop in seq.params.stop:
        # Only the new text, plus what a stop string could straddle, needs a search.
        start = max(0, len(text) - new_text_len - len(stop) + 1)
        index = text.find(stop, start)
        if index != -1:
            seq.output_text = text[:index]
            return stop
    return None


def _stop_reason(
    seq: Sequence, token_id: int, new_text_len: int, eos_token_ids: set[int], max_model_len: int
) -> tuple[FinishReason, int | str | None] | None:
    params = seq.params
    if seq.constraint is not None and seq.constraint.terminated:
        return "stop", None
    if seq.num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and token_id in eos_token_ids:
            return "stop", None
        if token_id in params.stop_token_ids:
            return "stop", token_id
        stop = _find_stop_string(seq, new_text_len)
        if stop is not None:
            return "stop", stop
    if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
        return "length", None
    if seq.num_tokens >= max_model_len:
        return "length", None
    return None


def append_token(
    seq: Sequence,
    token_id: int,
    logprobs: dict[int, float] | None,
    eos_token_ids: set[int],
    max_model_len: int,
) -> bool:
    """Add a sampled token to ``seq``; True when the request has finished."""
    now = time.time()
    seq.token_ids.append(token_id)
    if logprobs is not None:
        seq.logprobs.append(logprobs)
    if seq.first_token_time is None:
        seq.first_token_time = now
    new_text = seq.detokenizer.push(token_id) if seq.detokenizer else ""
    seq.output_text += new_text
    if seq.constraint is not None and not seq.constraint.accept(token_id):
        # The mask allows only what the grammar accepts; should that ever fail, the
        # request ends here rather than go on outside its grammar.
        log.error("request %s: token %d is outside its grammar", seq.request_id, token_id)
        stop: tuple[FinishReason, int | str | None] | None = ("stop", None)
    else:
        stop = _stop_reason(seq, token_id, len(new_text), eos_token_ids, max_model_len)
    if stop is None:
        return False
    seq.finish_reason, seq.stop_reason = stop
    if seq.detokenizer and not isinstance(seq.stop_reason, str):
        seq.output_text += seq.detokenizer.flush()
    seq.finished_time = now
    return True


def text_ready(seq: Sequence, finished: bool) -> str:
    """Text not yet emitted that is safe to emit now."""
    end = len(seq.output_text)
    if not finished and seq.params.stop:
        end -= max(len(s) for s in seq.params.stop) - 1
    if end <= seq.num_emitted_chars:
        return ""
    text = seq.output_text[seq.num_emitted_chars : end]
    seq.num_emitted_chars = end
    return text
