"""The opt-in longer runs: ``GENFLEET_SLOW_TESTS=1`` widens sweeps and property tests
(more and fresh examples) beyond what CI runs every time."""

import os

SLOW = os.environ.get("GENFLEET_SLOW_TESTS") == "1"
