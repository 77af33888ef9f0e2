"""Incremental detokenization that never emits half a character.

Decoding token by token breaks characters whose bytes span several tokens (a
multi-byte UTF-8 character, a byte-fallback sequence). We decode a short
window twice, with and without the newest tokens, and emit only the text that
grew and does not end in the replacement character; otherwise we wait for
the next token.

    ids:  ... | prefix_offset ......... read_offset ......... end |
                 (already emitted,      (not yet emitted)
                  decoded for context)
"""

from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as left context, so the first output token decodes with
# the spacing it would have mid-sentence.
PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, ids: list[int]) -> str:
        text = self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)
        assert isinstance(text, str)  # one sequence of ids decodes to one string
        return text

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became stable (possibly empty)."""
        self._ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """Text still held back (an unfinished character) once no token will follow."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text):
            return ""
        if full_text.endswith(REPLACEMENT_CHAR) and not final:
            return ""
        # Drop what no longer serves as context, keep the emitted chunk as context.
        self._ids = self._ids[self._read_offset :]
        self._prefix_offset, self._read_offset = 0, len(self._ids)
        return full_text[len(prefix_text) :]
