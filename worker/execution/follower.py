"""A follower tensor-parallel rank's process: ``python -m worker.execution.follower``, its
settings as JSON on stdin (``worker.execution.ranks``)."""

import os
import signal
import sys
import traceback

import torch
import torch.distributed as dist

from worker.execution.model_runner import ModelRunner
from worker.execution.ranks import (
    FollowerSettings,
    StepChannel,
    die_with_parent,
    join,
    rank_device,
    rank_threads,
)
from worker.models.loader import load_model
from worker.models.sharding import TensorParallel


def follow(settings: FollowerSettings) -> None:
    """A follower rank: its shard, its cache, then every step rank 0 sends."""
    config, rank = settings.config, settings.rank
    device = rank_device(config.device, rank)
    join(rank, settings.size, settings.port, config.device)
    torch.set_num_threads(rank_threads(config))
    tp = TensorParallel(rank, settings.size)
    model = load_model(
        settings.model_path,
        config.torch_dtype,
        torch.device(device),
        settings.max_model_len,
        tp,
        dense_weights_bytes=config.dense_weights_bytes,
    )
    runner = ModelRunner(
        config.model_copy(update={"device": device}),
        model,
        settings.max_model_len,
        tp=tp,
        channel=StepChannel(torch.device(device)),
    )
    while runner.follow():
        pass
    dist.destroy_process_group()


if __name__ == "__main__":
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle
    try:
        follow(FollowerSettings.model_validate_json(sys.stdin.read()))
    except BaseException:
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
