"""A follower tensor-parallel rank's process: ``python -m worker.follower``, its
settings as JSON on stdin (``worker.ranks``)."""

import os
import signal
import sys
import traceback

from worker.ranks import FollowerSettings, die_with_parent, follow

if __name__ == "__main__":
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle
    try:
        follow(FollowerSettings.model_validate_json(sys.stdin.read()))
    except BaseException:
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
