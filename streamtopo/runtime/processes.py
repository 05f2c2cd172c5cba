"""How the runtime starts child processes (Valkey, executors): isolated from Ctrl-C, tied to their parent.

- ``start_new_session``: a terminal's Ctrl-C signals the whole foreground process group; children in
  their own session are stopped by their parent in order (executors release their units first, Valkey
  last) instead of all dying at once.
- parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG, SIGTERM)``): if the parent itself is killed
  (``kill -9`` of ``streamtopo run``, a test runner timing out), the children get SIGTERM instead of
  lingering as orphans.
"""

from __future__ import annotations

import ctypes
import signal
import sys
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the session isolation still applies


def child_process_options(enter: Callable[[], None] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``subprocess.Popen`` of a runtime child process; ``enter`` runs in the child
    before it executes (moving it into an emulated host, local/testbed.py)."""
    options: dict[str, Any] = {"start_new_session": True}
    if sys.platform.startswith("linux"):
        options["preexec_fn"] = _die_with_parent if enter is None else _then(_die_with_parent, enter)
    return options


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        second()

    return both
