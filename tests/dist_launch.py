"""Launch a python script as the processes of a torch.distributed job on 127.0.0.1, the way
torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment), each
bounded by a timeout. For the multi-process tests (`tests/test_distributed.py`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["Done", "free_port", "launch", "start"]


@dataclass
class Done:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, size: int, port: int, extra: Optional[Dict[str, str]]) -> dict:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_WORLD_SIZE=str(size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
    )
    env.update(extra or {})
    return env


def start(args: Sequence[str], size: int, env: Optional[Dict[str, str]] = None) -> List:
    """Start ``python args...`` as ranks 0..size-1 of one job; returns the Popen objects."""
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, *args],
            cwd=str(ROOT),
            env=_env(r, size, port, env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(size)
    ]


def finish(procs: List, timeout: float) -> List[Done]:
    """Wait for every process (all of them killed when the timeout passes)."""
    deadline = time.monotonic() + timeout
    done = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            err += f"\n[killed: the job ran past its {timeout:g} s bound]"
        done.append(Done(r, p.returncode, out, err))
    return done


def launch(
    args: Sequence[str], size: int, timeout: float, env: Optional[Dict[str, str]] = None
) -> List[Done]:
    """Run ``python args...`` as a job of ``size`` processes; every process is bounded."""
    return finish(start(args, size, env), timeout)
