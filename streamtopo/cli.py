"""The ``streamtopo`` command line: one typer app, one module per command in streamtopo/commands/.

Each command module exposes ``register(app)``; this file only discovers them, so commands stay small,
self-contained and importable without pulling in every dependency of every other command.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Annotated

import typer

import streamtopo.commands
from streamtopo import __version__

app = typer.Typer(
    name="streamtopo",
    help="Fuse, place, run, rebalance and scale streaming pipelines (StreamTopology) on Kubernetes and Spark.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"streamtopo {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Fuse, place, run, rebalance and scale streaming pipelines (StreamTopology) on Kubernetes and Spark."""


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(streamtopo.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"streamtopo.commands.{info.name}")
        module.register(app)


_register_commands()


def main() -> None:
    app()
