"""torchrun, stopped as the trainer stops, without the agent's own noise about the signal.

On Ctrl-C or SIGTERM the ranks finish their step and checkpoint, and rank 0 says where it stopped and how to continue.
This leaves out the agent's log lines and traceback about the signal, and exits as a program ended by the signal does.
Its options are torchrun's, and everything else it prints, it prints as torchrun does.

    ddp-torchrun --standalone --nproc-per-node 4 -m ddp_core.train --dataset imdb ...
"""

from __future__ import annotations

import logging
import os
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main as torchrun

from ddp_core.launch.plan import LAUNCHER_VARIABLE

NAME = "ddp-torchrun"
AGENT_LOGGERS = ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api")
STOP_WORDS = ("death signal", "closing signal", "termination signal")


def not_about_the_stop(record: logging.LogRecord) -> bool:
    """The agent's lines about a stop signal say again what the ranks' one line says."""
    return not any(words in record.getMessage() for words in STOP_WORDS)


def main(argv: list[str] | None = None) -> int:
    os.environ[LAUNCHER_VARIABLE] = NAME
    for name in AGENT_LOGGERS:
        logging.getLogger(name).addFilter(not_about_the_stop)
    try:
        torchrun(argv)
    except SignalException as exc:
        return 128 + int(exc.sigval)  # 130 for Ctrl-C
    return 0


if __name__ == "__main__":
    sys.exit(main())
