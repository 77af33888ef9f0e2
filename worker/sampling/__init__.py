"""Choosing each step's tokens: the batched sampler and structured-output grammars."""
