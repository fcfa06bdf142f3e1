"""Thread pools shared by everything in one process that asks for them by the same name.

A pool is made on first use and lives as long as the process. A forked process (a Spark
Python worker is forked from its daemon) makes its own: threads do not survive a fork, so a
pool is kept per process id.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_POOLS: dict[tuple[int, str], ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def process_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """This process's pool called `name` (also its threads' name prefix), of `threads`
    threads when it is made by this call."""
    key = (os.getpid(), name)
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(threads, name)
        return pool
