"""A process holding more than 1,024 open files, as a busy worker may: ``select.select()`` refuses
any descriptor numbered past 1,024, so code that waits on a socket or a pipe with it fails there.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator

#: ``FD_SETSIZE`` on Linux: ``select()`` takes descriptors below it only.
FD_SETSIZE = 1024


@contextlib.contextmanager
def past_fd_setsize() -> Iterator[None]:
    """Open ``/dev/null`` until the next descriptor the process opens is numbered past ``FD_SETSIZE``
    (raising the soft limit on open files for the while if it is lower), and close them after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FD_SETSIZE + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    held: list[int] = []
    try:
        while not held or held[-1] <= FD_SETSIZE:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
