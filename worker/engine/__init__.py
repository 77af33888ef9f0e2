"""The step loop and its state: ``LLMEngine`` (add, step, abort), the admission
check, the scheduler, the KV block pool, sequences, stop handling and the
detokenizer."""
