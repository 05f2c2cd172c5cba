"""streamtopo: fuse, place, run, rebalance and scale streaming pipelines on Kubernetes and Spark."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("streamtopo")
    """From the package metadata (pyproject.toml), the one version source; tests/cli/test_version.py
    checks the chart's version, appVersion and the default executor image tag against it."""
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
