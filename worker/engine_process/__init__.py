"""A worker's engine process: the core that steps the engine, the pipe protocol, the
client the service drives it with, its thread count and its prompts.

``client``, ``protocol`` and ``threads`` import without torch: the asyncio service
imports them; ``core`` and ``prompts`` run in the engine process only."""
