"""Tensor-parallel ranks: one process each, joined by ``torch.distributed``.

Rank 0 is the engine's own process: it keeps the scheduler, the block manager,
the sampler and the detokenizer. Ranks 1..N-1 are started here as fresh Python
processes (``python -m worker.execution.follower``, their settings on stdin: no torch state
is forked, and a worker's engine process, itself a daemon, may start them) and
follow: each builds its shard of the model (only its
slices of the checkpoint) and a KV cache of its heads with the block count all
ranks can hold, then runs every step rank 0 sends. A step crosses once: a
fixed header (command and sizes) and one int64 payload with the step's inputs
(token ids, positions, slots, block tables, lengths, rows that sample), broadcast
from rank 0. The forward's collectives (an all-reduce after the embedding, each
o_proj and each down_proj; an all-gather of the logits) then meet in the same
order on every rank. gloo on a CPU, NCCL on CUDA with rank r on device r.

A rank that dies ends the engine: rank 0 checks its followers before each step
(``check``) and a collective with a dead peer fails, so the engine raises within
a step and a worker's engine process exits 1; followers exit with their parent
(``PR_SET_PDEATHSIG``) or when its end of a collective closes.
"""

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from pydantic import BaseModel
from transformers import PretrainedConfig

from worker.config import EngineConfig
from worker.execution.step_buffers import StepBuffers, StepInputs
from worker.models.sharding import TensorParallel

log = logging.getLogger("genfleet.engine")

STOP, STEP = 0, 1
HEADER = 4  # command, tokens, sequences, sampled rows
# How long rank 0 may take to fail on its own once a follower has failed to start.
STARTUP_GRACE_S = 3.0
# A failed collective names the rank that ended when it is seen gone within this.
DEAD_PEER_WAIT_S = 1.0
# A collective that waits this long has lost a peer (steps take milliseconds).
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


def check_layout(config: PretrainedConfig, size: int, device: str) -> None:
    """ValueError naming what does not split over ``size`` ranks, or the devices short."""
    tp = TensorParallel(0, size)
    tp.split(config.num_attention_heads, "attention heads")
    tp.kv_heads(config.num_key_value_heads)
    tp.split(config.intermediate_size, "intermediate features")
    if device.startswith("cuda") and torch.cuda.device_count() < size:
        raise ValueError(
            f"tensor_parallel_size {size} needs {size} GPUs; this host has "
            f"{torch.cuda.device_count()}"
        )


def rank_device(device: str, rank: int) -> str:
    return f"cuda:{rank}" if device.startswith("cuda") else device


def rank_threads(config: EngineConfig) -> int:
    """Each rank's CPU threads: the engine's, shared among the ranks."""
    total = config.engine_threads or torch.get_num_threads()
    return max(1, total // config.tensor_parallel_size)


def _follower_env() -> dict[str, str]:
    """This process's environment, with its import path: a follower imports what rank 0
    imported, however rank 0 found it."""
    path = [entry for entry in sys.path if entry]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def join(rank: int, size: int, port: int, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.set_device(rank_device(device, rank))
    dist.init_process_group(
        "nccl" if device.startswith("cuda") else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=COLLECTIVE_TIMEOUT,
    )


class StepChannel:
    """Rank 0's steps, sent to and received by every other rank."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def send(self, inputs: StepInputs) -> None:
        meta = inputs.meta
        parts = [
            inputs.input_ids,
            inputs.positions,
            meta.slot_mapping,
            meta.block_tables.reshape(-1).long(),
            meta.seq_lens,
            meta.query_start_loc,
            inputs.sample_rows,
        ]
        sizes = [inputs.num_rows, len(meta.seq_lens), len(inputs.sample_rows)]
        self._header(STEP, *sizes)
        dist.broadcast(torch.cat([p.to(self.device) for p in parts]), src=0)

    def stop(self) -> None:
        self._header(STOP, 0, 0, 0)

    def _header(self, *values: int) -> None:
        dist.broadcast(torch.tensor(values, dtype=torch.int64, device=self.device), src=0)

    def receive(self, buffers: StepBuffers) -> StepInputs | None:
        """The next step, in ``buffers``' device tensors; None when rank 0 stops."""
        header = torch.empty(HEADER, dtype=torch.int64, device=self.device)
        dist.broadcast(header, src=0)
        command, tokens, seqs, samples = header.tolist()
        if command == STOP:
            return None
        inputs = buffers.device.views(tokens, seqs, samples)
        meta = inputs.meta
        targets = [
            inputs.input_ids,
            inputs.positions,
            meta.slot_mapping,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            inputs.sample_rows,
        ]
        sizes = [t.numel() for t in targets]
        payload = torch.empty(sum(sizes), dtype=torch.int64, device=self.device)
        dist.broadcast(payload, src=0)
        for target, part in zip(targets, payload.split(sizes), strict=True):
            target.copy_(part.view(target.shape))
        return inputs


class Ranks:
    """Rank 0's side of the group: the layout, the channel and the followers."""

    def __init__(self, config: EngineConfig, model_path: Path, max_model_len: int) -> None:
        size = config.tensor_parallel_size
        port = _free_port()
        self.followers: list[subprocess.Popen[bytes]] = []
        for rank in range(1, size):
            settings = FollowerSettings(
                rank=rank,
                size=size,
                port=port,
                config=config,
                model_path=str(model_path),
                max_model_len=max_model_len,
            )
            command = [sys.executable, "-m", "worker.execution.follower"]
            follower = subprocess.Popen(command, stdin=subprocess.PIPE, env=_follower_env())
            assert follower.stdin is not None
            follower.stdin.write(settings.model_dump_json().encode())
            follower.stdin.close()
            self.followers.append(follower)
        # Until every rank has its shard and cache, rank 0 waits in collectives that a
        # follower's failure would leave waiting for minutes: a watch ends it instead.
        self.started = threading.Event()
        self.stopped = False
        threading.Thread(target=self._watch_start, name="rank-watch", daemon=True).start()
        atexit.register(self.stop)  # a program that never calls stop: its ranks end with it
        join(0, size, port, config.device)
        self.tp = TensorParallel(0, size)
        self.channel = StepChannel(torch.device(rank_device(config.device, 0)))
        backend = dist.get_backend()
        log.info("tensor parallel: %d ranks (%s), pids %s", size, backend, self.pids)

    @property
    def pids(self) -> list[int]:
        return [os.getpid(), *(process.pid for process in self.followers)]

    def _watch_start(self) -> None:
        """A follower that ends before the ranks are up leaves rank 0 waiting in a
        collective: end the process, unless rank 0 gives up first (its own error)."""
        while not self.started.wait(0.2) and not self.stopped:
            ended = [(rank, p) for rank, p in enumerate(self.followers, 1) if p.poll() is not None]
            if ended and not self.started.wait(STARTUP_GRACE_S) and not self.stopped:
                rank, process = ended[0]
                log.error(
                    "tensor-parallel rank %d failed to start (exit code %s): see its error "
                    "above; the engine ends",
                    rank,
                    process.returncode,
                )
                os._exit(1)

    def abort(self) -> None:
        """Rank 0 failed to start, or a follower ended: end the followers, leave the
        group."""
        self.stopped = True
        atexit.unregister(self.stop)
        for process in self.followers:
            process.kill()
            process.wait()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()

    def check(self) -> None:
        """RuntimeError when a follower has ended: the model is no longer whole."""
        ended = self.ended()
        if ended:
            raise RuntimeError(ended)

    def ended(self, wait_s: float = 0.0) -> str | None:
        """Which follower has ended, looking for up to ``wait_s``; None while all run."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, process in enumerate(self.followers, start=1):
                if process.poll() is not None:
                    return (
                        f"tensor-parallel rank {rank} (pid {process.pid}) ended with exit "
                        f"code {process.returncode}: the engine cannot go on without it"
                    )
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the followers and leave the group (once). With a follower gone the group
        is broken, and a goodbye could wait on the dead peer: the others are killed."""
        if self.stopped:
            return
        if self.ended() is not None:
            self.abort()
            return
        self.stopped = True
        atexit.unregister(self.stop)
        with contextlib.suppress(Exception):  # a follower gone meanwhile: nothing to tell
            self.channel.stop()
        for process in self.followers:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the engine's process ends, however."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


class FollowerSettings(BaseModel):
    """What a follower rank is started with (on its stdin, as JSON)."""

    rank: int
    size: int
    port: int
    config: EngineConfig
    model_path: str
    max_model_len: int
