"""How many CPU threads a worker's engine gets, so that it does not share its cores.

torch's default is one thread per core, which suits an engine alone on a machine.
A worker is not alone: its service process (Kafka, Redis, JSON) and often the
broker, Redis or the API run beside it, and every slice of a core they take from
one of the engine's OpenMP threads stalls all the others at the step's next
barrier. On the fleet benchmark that cost a fifth of the engine's throughput on
two cores (docs/benchmarks.md, the fleet benchmark). So, as vLLM's CPU backend reserves a
core for its serving process, a CPU engine with at least ``RESERVE_FROM_CORES``
cores takes all but one. Below that a core is worth more than the stalls: on two
cores the engine on one core was slower than on both, stalls and all. A GPU
engine, whose CPU work is launching kernels, takes one thread (vLLM's workers too).
"""

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
RESERVE_FROM_CORES = 4


def usable_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The cores this process may run on: its affinity, bounded by a cgroup v2 CPU
    quota (a container's CPU limit), which the affinity does not show."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):  # no cgroup v2 file, or one we cannot read
        pass
    return max(1, cores)


def cpu_engine_threads(cores: int) -> int:
    """The threads of the CPU engines of a host with ``cores`` usable cores, together."""
    return cores - 1 if cores >= RESERVE_FROM_CORES else cores


def threads_per_worker(workers: int) -> int:
    """Each CPU engine's share when ``workers`` of them run on this host: engines whose
    OpenMP threads outnumber the cores stall each other at every step's barriers."""
    return max(1, cpu_engine_threads(usable_cores()) // workers)


def serving_engine_threads(device: str) -> int:
    """A worker engine's threads on ``device`` (resolved: ``cpu``, ``cuda``, ``cuda:N``)."""
    return 1 if device.startswith("cuda") else cpu_engine_threads(usable_cores())
