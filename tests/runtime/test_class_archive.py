"""Spark's class archive (runtime/class_archive.py): written once by a JVM asked to, published only after
a clean exit, used by every later JVM, and never in the way of a JVM that cannot use it.

The JVM tests start real JVMs through PySpark in subprocesses (each with its own archive path) and prove
the archive is mapped with ``-Xshare:on``, under which a JVM that cannot map its archive refuses to start.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streamtopo.runtime import class_archive
from streamtopo.runtime.class_archive import ARCHIVE_ENV, ArchiveBuild, java_options

JOB = """
from streamtopo.runtime.spark import get_spark, stop_spark, warm_up
warm_up(get_spark(build_archive={build}))
print(get_spark().range(10).count())
stop_spark(jvm=True)
"""


def _spark(archive, build: bool, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, ARCHIVE_ENV: str(archive), **env}
    code = JOB.format(build=build)
    return subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=300
    )


def test_options_use_an_archive_build_one_only_when_asked_and_off_means_off(tmp_path, monkeypatch):
    archive = tmp_path / "spark.jsa"
    monkeypatch.setenv(ARCHIVE_ENV, str(archive))
    assert java_options(build=False) == ("", None)  # an executor never writes one
    options, build = java_options(build=True)
    assert build is not None and options.startswith(f"-XX:ArchiveClassesAtExit={build.temporary}")
    assert build.lock.read_text() == str(os.getpid())
    assert java_options(build=True) == ("", None)  # one writer at a time: this live process holds the lock
    build.temporary.write_bytes(b"what the JVM wrote")
    build.publish(exit_code=0)
    assert archive.read_bytes() == b"what the JVM wrote" and not build.lock.exists()
    assert java_options(build=True) == (f"-XX:SharedArchiveFile={archive}", None)
    monkeypatch.setenv(ARCHIVE_ENV, "off")
    assert class_archive.archive_path() is None and java_options(build=True) == ("", None)


def test_a_jvm_that_did_not_exit_cleanly_publishes_nothing_and_a_dead_writers_lock_is_taken_over(
    tmp_path, monkeypatch
):
    archive = tmp_path / "spark.jsa"
    monkeypatch.setenv(ARCHIVE_ENV, str(archive))
    _, build = java_options(build=True)
    assert isinstance(build, ArchiveBuild)
    build.temporary.write_bytes(b"half written")
    build.publish(exit_code=-9)  # killed mid-dump
    assert not archive.exists() and not build.temporary.exists() and not build.lock.exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    build.lock.write_text(dead.stdout.decode().strip())  # a writer that died without its cleanup
    _, again = java_options(build=True)
    assert again is not None and again.lock.read_text() == str(os.getpid())


@pytest.mark.slow
@pytest.mark.spark
def test_the_archive_written_at_exit_is_mapped_by_the_next_jvm_and_a_bad_one_is_ignored(tmp_path):
    archive = tmp_path / "spark.jsa"
    strict = {"JAVA_TOOL_OPTIONS": "-Xshare:on"}  # a JVM that cannot map its archive refuses to start
    written = _spark(archive, build=True)
    assert written.returncode == 0, written.stderr
    assert archive.stat().st_size > 1_000_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spark.jsa"]  # no lock, no temporary left
    assert "[warning][cds]" not in written.stdout + written.stderr  # the dump's hundreds of lines
    used = _spark(archive, build=False, **strict)
    assert used.returncode == 0 and used.stdout.split()[-1] == "10", used.stderr
    assert archive.exists()
    archive.chmod(0o644)
    archive.write_bytes(b"not an archive")  # a corrupt or foreign file: the JVM starts without it
    ignored = _spark(archive, build=False)
    assert ignored.returncode == 0 and ignored.stdout.split()[-1] == "10", ignored.stderr
    refused = _spark(archive, build=False, **strict)
    assert refused.returncode != 0  # the check above would fail if the archive were not mapped


def test_two_spark_installs_get_two_archives(tmp_path, monkeypatch):
    """The archive is checked against Spark's class path: a second install of the same Spark version (a
    CI clone's virtualenv beside a checkout's) gets its own archive instead of one the other's JVMs refuse
    at every start ("The top archive failed to load")."""
    import types

    if class_archive.archive_path() is None:
        pytest.skip("no java here")
    monkeypatch.delenv(ARCHIVE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    paths = set()
    for install in ("a", "b", "a"):
        fake = types.SimpleNamespace(__version__="9.9.9", __file__=str(tmp_path / install / "__init__.py"))
        monkeypatch.setattr(class_archive, "pyspark", fake)
        paths.add(class_archive.archive_path())
    assert len(paths) == 2 and all(p.parent == tmp_path / "streamtopo" for p in paths)
