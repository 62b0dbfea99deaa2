"""What the long benchmarks (``chaos``, ``kai-scale``) start: processes that die with the benchmark.

A benchmark killed hard (``timeout``, Ctrl-C twice, an OOM kill) must not leave its scheduler process running on the
machine. On Linux the child asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``, kept across the
exec); elsewhere nothing is asked and the benchmark's own shutdown is the only guard.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
from collections.abc import Callable
from typing import Final

_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def die_with_parent() -> Callable[[], None] | None:
    """The ``preexec_fn`` that makes a child die with this process (None where the platform cannot)."""
    return _die_with_parent if sys.platform == "linux" else None
