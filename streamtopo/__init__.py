"""streamtopo: fuse, place, run, rebalance and scale streaming pipelines on Kubernetes and Spark."""

__version__ = "0.1.0"
