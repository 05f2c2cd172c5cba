"""`streamtopo operator`: run the Kubernetes operator (kopf) with its liveness endpoint."""

from __future__ import annotations

from typing import Annotated

import typer

LOG_FORMATS = ("plain", "full", "json")


def kopf_arguments(
    namespaces: list[str],
    all_namespaces: bool,
    standalone: bool,
    peering: str | None,
    liveness: str | None,
    log_format: str,
    verbose: bool,
    debug: bool,
) -> list[str]:
    """The `kopf run` command line for these options (checked: exactly one watch scope)."""
    if bool(namespaces) == all_namespaces:
        raise typer.BadParameter(
            "give --namespace (one or more) or --all-namespaces, not both and not neither",
            param_hint="--namespace / --all-namespaces",
        )
    if standalone and peering:
        raise typer.BadParameter("--standalone and --peering exclude each other", param_hint="--peering")
    if log_format not in LOG_FORMATS:
        raise typer.BadParameter(f"use one of {', '.join(LOG_FORMATS)}", param_hint="--log-format")
    args = ["run", "-m", "streamtopo.controller.operator", f"--log-format={log_format}"]
    args += ["--all-namespaces"] if all_namespaces else [f"--namespace={ns}" for ns in namespaces]
    args += [f"--peering={peering}"] if peering else ["--standalone"]
    if liveness:
        args.append(f"--liveness={liveness}")
    args += ["--verbose"] * verbose + ["--debug"] * debug
    return args


def register(app: typer.Typer) -> None:
    @app.command("operator")
    def operator(
        namespace: Annotated[
            list[str] | None, typer.Option("--namespace", "-n", help="Watch this namespace (repeatable).")
        ] = None,
        all_namespaces: bool = typer.Option(False, "--all-namespaces", "-A", help="Watch every namespace."),
        standalone: bool = typer.Option(
            False, "--standalone", help="No peering: this is the only replica (the default)."
        ),
        peering: str | None = typer.Option(
            None, "--peering", help="kopf peering object: replicas take turns instead of racing."
        ),
        liveness: str | None = typer.Option(
            None, "--liveness", help="Serve a health endpoint, e.g. http://0.0.0.0:8080/healthz."
        ),
        log_format: str = typer.Option("plain", "--log-format", help="plain, full or json."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
        debug: bool = typer.Option(False, "--debug", "-d"),
    ) -> None:
        """Run the StreamTopology operator: plan, place, run, rebalance and scale on Kubernetes."""
        from kopf.cli import main

        args = kopf_arguments(
            namespace or [], all_namespaces, standalone, peering, liveness, log_format, verbose, debug
        )
        main(args=args, prog_name="streamtopo operator")
