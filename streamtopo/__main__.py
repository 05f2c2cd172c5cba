"""``python -m streamtopo``: the command line (cli.py) without the console script, e.g. how the local
platform starts executors: ``python -m streamtopo executor ...``."""

from streamtopo.cli import main

main()
