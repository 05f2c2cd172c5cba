"""Class-data sharing for Spark's JVM: an executor's JVM maps the classes Spark loads from an archive
instead of loading and verifying them from jars.

Measured on a 2-core machine (JDK 17, PySpark 4; bench/executor_start.py): an executor was ready 9.4 s
and 14.6 CPU-seconds after its process started without the archive, 5.9 s and 9.4 with it. Every
executor start (a scale-out, a restart, each executor of ``streamtopo run``) pays that before any work.

The archive is JDK 17's dynamic archive (``-XX:ArchiveClassesAtExit``, then ``-XX:SharedArchiveFile``),
one per Spark install (version and location: its jars are the class path the archive is checked
against) and Java binary, under ``~/.cache/streamtopo`` (``STREAMTOPO_CLASS_ARCHIVE`` names
another file, or ``off``). Writing it costs about 13 s at the exit of the JVM that writes it, so only
a JVM that is asked to (:func:`java_options` with ``build``) writes it: ``streamtopo run``'s expression
check, once per machine, and the runtime image's build. Executors only read it: a missing archive costs
them the slower start, never a write. The JVM checks the archive against its own version and class path
and ignores one that does not match (``-Xshare:auto``, the default); a half-written archive is never seen,
as it is written under a temporary name and renamed once its JVM exited cleanly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyspark

ARCHIVE_ENV = "STREAMTOPO_CLASS_ARCHIVE"
"""A path for the archive, or ``off``."""


def _java() -> Path | None:
    """The binary spark-submit starts: ``$JAVA_HOME/bin/java``, else ``java`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_path() -> Path | None:
    """Where this Spark's and this Java's archive is (or would be); None when switched off or without Java."""
    chosen = os.environ.get(ARCHIVE_ENV, "")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    java = _java()
    if java is None:
        return None
    stat = java.stat()
    # Two installs of one Spark version (two virtualenvs, a CI clone beside a checkout) have different
    # class paths: one archive for both would be refused by the other's JVMs at every start.
    spark_home = Path(pyspark.__file__).resolve().parent
    key = hashlib.sha256(f"{java}:{stat.st_size}:{stat.st_mtime_ns}:{spark_home}".encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streamtopo"
    return cache / f"spark-{pyspark.__version__}-java-{key}.jsa"


def missing() -> bool:
    """Whether a JVM asked to build the archive would write it (the CLI says it will take a moment)."""
    path = archive_path()
    return path is not None and not path.exists()


@dataclass(frozen=True)
class ArchiveBuild:
    """An archive the JVM writes at its exit: ``temporary`` until :meth:`publish` renames it."""

    final: Path
    temporary: Path
    lock: Path

    def publish(self, exit_code: int | None) -> None:
        """After the JVM ended: keep what a clean exit wrote, drop anything else, release the lock."""
        try:
            if exit_code == 0 and self.temporary.exists():
                os.replace(self.temporary, self.final)
        finally:
            self.temporary.unlink(missing_ok=True)
            self.lock.unlink(missing_ok=True)


def _take_lock(lock: Path) -> bool:
    """One writer per archive: a lock file holding the writer's pid; a dead writer's lock is taken over."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                pid = int(lock.read_text() or 0)
                os.kill(pid, 0)
                return False  # a live process is writing it
            except (ValueError, ProcessLookupError, FileNotFoundError):
                lock.unlink(missing_ok=True)
                continue
            except PermissionError:  # another user's live process
                return False
        with os.fdopen(fd, "w") as out:
            out.write(str(os.getpid()))
        return True
    return False


def java_options(build: bool = False) -> tuple[str, ArchiveBuild | None]:
    """The JVM options that use the archive, or that write it at exit when ``build`` is asked and no one
    else is writing it; the build to :meth:`ArchiveBuild.publish` once the JVM has exited."""
    final = archive_path()
    if final is None:
        return "", None
    if final.exists():
        return f"-XX:SharedArchiveFile={final}", None
    if not build:
        return "", None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        lock = final.with_name(final.name + ".lock")
        if not _take_lock(lock):
            return "", None
    except OSError:  # a read-only home (a pod's): run without an archive
        return "", None
    temporary = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    # The dump warns for every class it leaves out (signed jars, generated accessors): hundreds of lines.
    return f"-XX:ArchiveClassesAtExit={temporary} -Xlog:cds*=error", ArchiveBuild(final, temporary, lock)
