"""Emulated hosts on one machine (issue 35): the planner's hosts made real enough to measure placements.

Every runtime figure used to come from executors that share one machine's cores and talk over loopback,
where a "host" existed only in the planner. An :class:`EmulatedHosts` makes each host of a cluster file

- a network namespace with its own address on a bridge the bed creates (the machine's other addresses
  are never used: traffic stays on loopback or inside these namespaces);
- a cgroup whose CPU quota is the host's ``cpu`` (cgroup v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``), which
  every executor started there joins with its JVM and Python workers;
- a card shaped to the host's ``network`` (bytes per second, Benoit et al.'s B_u) when the file sets it,
  with ``tbf`` on both ends of its link, or ``netem`` when ``latency`` is set;

plus a host of its own for Valkey (``valkeyCpu`` cores), through which every stream between executors
passes. It is built on entry and torn down on exit (namespaces, links, qdiscs and cgroups), and
:func:`sweep` removes what a killed process left behind. :func:`leftovers` lists what exists, for tests.

The file is a cluster file (``streamtopo plan --cluster``) with two more fields, ``valkeyCpu`` and
``latency``. Refused, naming the field: ``links`` (executors talk only through the Valkey host, a star,
so a bandwidth between two hosts has no wire to shape), and ``latency`` on a kernel without netem
(``CONFIG_NET_SCH_NETEM``), since no other qdisc delays packets. Needs root (``CAP_NET_ADMIN`` and a
writable cgroup hierarchy); :func:`unavailable` says why not, before anything is created.

The bed shares the machine's cores: quotas cap each host, they do not add cores, so hosts whose ``cpu``
sums past the machine's contend as processes on one machine do.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, field_validator

from streamtopo import documents
from streamtopo.planner.cluster import Cluster, Host, unique_names
from streamtopo.planner.model import Model, parse_duration
from streamtopo.runtime.embedded import EmbeddedValkey

T = TypeVar("T")

MAX_HOSTS = 64
"""Hosts of one bed: the bed's /24 holds them, and an interface name ``st<pid>x<n>h<i>`` fits 15 bytes."""
PERIOD_US = 100_000
"""The CFS period of every host's quota (the kernel's default)."""
NETNS_DIR = Path("/run/netns")
CGROUP = Path("/sys/fs/cgroup")
CGROUP_V1_CPU = CGROUP / "cpu"
_CLONE_NEWNET = 0x40000000
_TAG = re.compile(r"^st(\d+)x(\d+)")


class EmulatedHostsSpec(Model):
    """The file of ``streamtopo run --testbed``: a cluster file plus the Valkey host and the links' delay."""

    hosts: list[Host] = Field(min_length=1, max_length=MAX_HOSTS)
    valkey_cpu: float = Field(default=0.5, gt=0)
    """Cores of the host Valkey runs on."""
    latency: float = Field(default=0.0, ge=0, le=10)
    """One-way delay added to each host's link (``"2ms"``; needs netem), so a record between two hosts
    waits four times this: into and out of the Valkey host, both ways of the request."""
    links: list[Any] = Field(default_factory=list)
    """Not emulated: refused when given (see the module docstring)."""

    @field_validator("latency", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)

    @field_validator("hosts")
    @classmethod
    def _unique(cls, value: list[Host]) -> list[Host]:
        unique_names(value)
        return value

    @field_validator("links")
    @classmethod
    def _no_links(cls, value: list[Any]) -> list[Any]:
        if value:
            raise ValueError(
                "pairwise bandwidths are not emulated: executors talk only through the Valkey host, so each "
                "host's card (hosts[].network) is what the bed shapes"
            )
        return value

    def cluster(self) -> Cluster:
        """The hosts as the planner sees them."""
        return Cluster(hosts=self.hosts)


def load_hosts(source: str | Path | Mapping[str, Any]) -> EmulatedHostsSpec:
    """A validated bed from a path, YAML text or data; errors name the field, as topology errors do."""
    return documents.load_hosts(source, EmulatedHostsSpec)


class BedError(RuntimeError):
    """The kernel refused a step of building the bed; the message names the command and why."""


def unavailable() -> str | None:
    """Why this process cannot build a bed (None: it can): checked before anything is created."""
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces, qdiscs and cgroups)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"emulated hosts need the `{tool}` command (Debian: iproute2)"
    if _cgroup_version() is None:
        return f"no writable CPU cgroup controller under {CGROUP} (v1 cpu or v2 with cpu)"
    return None


class EmulatedHosts:
    """A bed of emulated hosts, built on ``__enter__`` and removed on ``__exit__``."""

    _count = 0

    def __init__(self, spec: EmulatedHostsSpec):
        self.spec = spec
        EmulatedHosts._count += 1
        self.tag = f"st{os.getpid()}x{EmulatedHosts._count % 10}"
        self.subnet = ""
        self.index = {h.name: i for i, h in enumerate(spec.hosts)}
        self.groups = _CpuGroups(f"streamtopo-{self.tag}")
        self._built: list[Callable[[], object]] = []
        self._threads: dict[str, ThreadPoolExecutor] = {}

    # ---------------------------------------------------------------------------------- addresses

    def namespace(self, host: str | None) -> str:
        """The network namespace of ``host`` (None: the Valkey host)."""
        return f"{self.tag}v" if host is None else f"{self.tag}h{self.index[host]}"

    def address(self, host: str | None) -> str:
        """The address of ``host`` (None: the Valkey host) on the bed's bridge."""
        return f"{self.subnet}.2" if host is None else f"{self.subnet}.{10 + self.index[host]}"

    def cluster(self) -> Cluster:
        return self.spec.cluster()

    def periods(self) -> dict[str | None, tuple[int, int]]:
        """Per host (None: the Valkey host): CFS periods with work so far, and those in which the host used
        its whole CPU quota (:meth:`_CpuGroups.periods`). Two readings' difference says how often a host
        was held back by its capacity between them."""
        return {
            host: self.groups.periods(self.namespace(host))
            for host in [None, *(h.name for h in self.spec.hosts)]
        }

    # ------------------------------------------------------------------------------------ building

    def __enter__(self) -> EmulatedHosts:
        self.build()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def build(self) -> None:
        """Bridge, one namespace, link and cgroup per host and one for Valkey; undone on any failure."""
        if reason := unavailable():
            raise BedError(reason)
        sweep()
        self.subnet = _free_subnet()
        bridge = f"{self.tag}b"
        try:
            _ip("link", "add", bridge, "type", "bridge")
            self._built.append(lambda: _ip("link", "del", bridge, check=False))
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", bridge)
            _ip("link", "set", bridge, "up")
            self.groups.create()
            self._built.append(self.groups.remove)
            for host in [None, *self.spec.hosts]:
                self._add_host(bridge, host)
        except BaseException:
            self.teardown()
            raise

    def _add_host(self, bridge: str, host: Host | None) -> None:
        name = None if host is None else host.name
        ns, outer = self.namespace(name), self.namespace(name) + "o"
        _ip("netns", "add", ns)
        self._built.append(lambda: _ip("netns", "del", ns, check=False))
        _ip("link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._built.append(lambda: _ip("link", "del", outer, check=False))  # both ends, and their qdiscs, now
        _ip("link", "set", outer, "master", bridge, "up")
        _ip("-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        if host is not None and (shape := self._shape(host)):
            _tc("qdisc", "add", "dev", outer, "root", *shape)  # into the host
            _tc("-n", ns, "qdisc", "add", "dev", "eth0", "root", *shape)  # out of it
        self.groups.add(ns, self.spec.valkey_cpu if host is None else host.cpu)

    def _shape(self, host: Host) -> list[str]:
        """The qdisc of ``host``'s link: netem with the delay (and rate), tbf for a rate alone, else none."""
        rate = f"{int(host.network * 8)}bit" if "network" in host.model_fields_set else None
        if self.spec.latency > 0:
            if not netem_available():
                raise BedError(
                    "latency: this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM is not set), and no other "
                    "qdisc delays packets; leave latency out to shape bandwidth alone"
                )
            return ["netem", "delay", f"{self.spec.latency * 1e6:.0f}us", *(["rate", rate] if rate else [])]
        if rate is None:
            return []
        burst = max(int(host.network / 100), 64 * 1024)  # a 10 ms burst, at least 64 KiB
        return ["tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]

    def teardown(self) -> None:
        """Kill what still runs in the hosts' cgroups, then remove everything built, newest first."""
        self.groups.kill()
        for pool in self._threads.values():
            pool.shutdown()
        self._threads.clear()
        while self._built:
            with suppress(Exception):
                self._built.pop()()

    # ----------------------------------------------------------------------------------- processes

    def entry(self, host: str | None) -> Callable[[], None]:
        """A ``preexec_fn`` that moves the new process into ``host``: its network namespace and cgroup."""
        ns, procs = NETNS_DIR / self.namespace(host), self.groups.procs(self.namespace(host))

        def enter() -> None:
            _set_netns(ns)
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

        return enter

    def inside(self, host: str | None, call: Callable[[], T]) -> T:
        """``call()`` on a thread inside ``host``'s network namespace, for servers a library starts with a
        ``Popen`` that takes no ``preexec_fn`` (Valkey): what it binds and starts lives in the host. The
        thread lives until :meth:`teardown`, since a child's parent-death signal fires when the thread
        that started it ends."""
        ns = self.namespace(host)
        if ns not in self._threads:
            self._threads[ns] = ThreadPoolExecutor(1, f"bed-{ns}", _set_netns, (NETNS_DIR / ns,))
        return self._threads[ns].submit(call).result()

    def valkey(self) -> EmbeddedValkey:
        """The run's Valkey, started on its own host: bound to that host's address, in its cgroup."""
        valkey = self.inside(None, lambda: EmbeddedValkey(host=self.address(None)).start())
        self.join(None, valkey.pid)
        return valkey

    def join(self, host: str | None, pid: int) -> None:
        """Move running process ``pid`` (and its threads) into ``host``'s cgroup."""
        Path(self.groups.procs(self.namespace(host))).write_text(str(pid))


def start_valkey(bed: EmulatedHosts | None) -> EmbeddedValkey:
    """A run's Valkey: on loopback, or on its own host of ``bed``, built here (and torn down if Valkey
    does not start)."""
    if bed is None:
        return EmbeddedValkey().start()
    bed.build()
    try:
        return bed.valkey()
    except BaseException:
        bed.teardown()
        raise


class _CpuGroups:
    """One cgroup per host under ``<hierarchy>/<name>``, with a CFS quota of the host's cores."""

    def __init__(self, name: str):
        self.name = name
        self.version = _cgroup_version()
        root = CGROUP_V1_CPU if self.version == 1 else CGROUP
        self.root = root / name

    def create(self) -> None:
        if self.version == 2:
            _write(CGROUP / "cgroup.subtree_control", "+cpu")
        self.root.mkdir()
        if self.version == 2:
            _write(self.root / "cgroup.subtree_control", "+cpu")

    def add(self, host: str, cores: float) -> None:
        path = self.root / host
        path.mkdir()
        quota = max(int(cores * PERIOD_US), 1000)
        if self.version == 1:
            _write(path / "cpu.cfs_period_us", str(PERIOD_US))
            _write(path / "cpu.cfs_quota_us", str(quota))
        else:
            _write(path / "cpu.max", f"{quota} {PERIOD_US}")

    def procs(self, host: str) -> str:
        return str(self.root / host / "cgroup.procs")

    def periods(self, host: str) -> tuple[int, int]:
        """(CFS periods in which ``host`` had work, periods in which it used its whole quota) so far: the
        kernel's ``nr_periods`` and ``nr_throttled`` of ``cpu.stat``, in both cgroup versions."""
        fields = dict(
            line.split() for line in _read(self.root / host / "cpu.stat").splitlines() if line.strip()
        )
        return int(fields.get("nr_periods", 0)), int(fields.get("nr_throttled", 0))

    def pids(self) -> list[int]:
        return [
            int(line)
            for procs in self.root.glob("*/cgroup.procs")
            for line in _read(procs).split()
            if line.strip().isdigit()
        ]

    def kill(self) -> None:
        """SIGKILL whatever still runs in the hosts (their owners stop them first; this is the backstop)."""
        for pid in self.pids():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> None:
        """Remove the cgroups once their processes are gone (a killed process leaves them in a moment)."""
        deadline = time.monotonic() + 10.0
        for path in [*sorted(p for p in self.root.glob("*") if p.is_dir()), self.root]:
            while path.exists():
                try:
                    path.rmdir()
                except OSError as error:
                    if error.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise BedError(f"cannot remove cgroup {path}: {error.strerror}") from None
                    self.kill()
                    time.sleep(0.05)


def netem_available() -> bool:
    """Whether the kernel has the netem qdisc (tried on a throwaway link: modules may not be loadable)."""
    probe = f"st{os.getpid()}np"
    try:
        _ip("link", "add", probe, "type", "dummy")
    except BedError:
        return False
    try:
        return _tc("qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms", check=False) == 0
    finally:
        _ip("link", "del", probe, check=False)


def leftovers(owner: int | None = None) -> list[str]:
    """Every namespace, link and cgroup a bed created that still exists, of beds built by process
    ``owner`` (None: by any process, alive or not)."""

    def mine(name: str) -> bool:
        match = _TAG.match(name.removeprefix("streamtopo-"))
        return match is not None and owner in (None, int(match.group(1)))

    found = [f"netns {n}" for n in _netns() if mine(n)]
    found += [f"link {n}" for n in _links() if mine(n)]
    found += [f"cgroup {p}" for p in _cgroup_dirs() if mine(p.name)]
    return found


def sweep() -> list[str]:
    """Remove what beds of processes that no longer run left behind (a ``kill -9`` skips ``__exit__``)."""

    def dead(name: str) -> bool:
        match = _TAG.match(name.removeprefix("streamtopo-"))
        return match is not None and not Path(f"/proc/{match.group(1)}").exists()

    removed = []
    for ns in filter(dead, _netns()):
        _ip("netns", "del", ns, check=False)
        removed.append(f"netns {ns}")
    for link in filter(dead, _links()):
        _ip("link", "del", link, check=False)
        removed.append(f"link {link}")
    for path in _cgroup_dirs():
        if dead(path.name):
            groups = _CpuGroups(path.name)
            with suppress(BedError):
                groups.kill()
                groups.remove()
                removed.append(f"cgroup {path}")
    return removed


# ------------------------------------------------------------------------------- kernel plumbing


def _ip(*args: str, check: bool = True) -> int:
    return _command("ip", *args, check=check)


def _tc(*args: str, check: bool = True) -> int:
    return _command("tc", *args, check=check)


def _command(*args: str, check: bool) -> int:
    done = subprocess.run(args, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise BedError(f"`{' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done.returncode


def _set_netns(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def _netns() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.glob("*")) if NETNS_DIR.exists() else []


def _links() -> list[str]:
    return sorted(p.name for p in Path("/sys/class/net").iterdir())


def _cgroup_dirs() -> Iterator[Path]:
    for root in (CGROUP_V1_CPU, CGROUP):
        if root.is_dir():
            yield from sorted(root.glob("streamtopo-st*"))


def _free_subnet() -> str:
    """A 10.213.k.0/24 no interface of this machine has an address in (k from the process id)."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    for step in range(250):
        k = (os.getpid() + step) % 250 + 1
        if f" 10.213.{k}." not in used:
            return f"10.213.{k}"
    raise BedError("no free 10.213.k.0/24 subnet for the bed's bridge")


def _cgroup_version() -> int | None:
    if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists() and os.access(CGROUP_V1_CPU, os.W_OK):
        return 1
    controllers = CGROUP / "cgroup.controllers"
    if controllers.exists() and "cpu" in _read(controllers).split() and os.access(CGROUP, os.W_OK):
        return 2
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as error:
        raise BedError(f"cannot write {text!r} to {path}: {error.strerror}") from None
