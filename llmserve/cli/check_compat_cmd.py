"""`llmserve check-compat`: prove that lock, vLLM, package and environment fit, before anything runs."""

from __future__ import annotations

from pathlib import Path

import typer

from llmserve.cli.render import OutputFormat, console, print_json

_STYLE = {"ok": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}


def check_compat(
    lock_file: Path = typer.Option(Path("llmserve.lock"), "--lock", "-l", help="The lock to check against."),
    vllm: str = typer.Option(
        None,
        "--vllm",
        help="vLLM to read the import surface from: 'installed', a wheel file, or a folder holding vllm/. Default: installed for local-cpu.",
    ),
    package: Path = typer.Option(
        None, "--package", "-p", help="A .llmpkg or a source folder: check its plugins and tensor spec."
    ),
    requirements: Path = typer.Option(
        None, "--requirements", "-r", help="Also check that this pip file equals the lock's export."
    ),
    no_env: bool = typer.Option(False, "--no-env", help="Skip the running-environment check."),
    site_packages: list[Path] = typer.Option(
        None, "--site-packages", help="Check this environment's site-packages instead of the running one (repeatable)."
    ),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o", help="text or json."),
) -> None:
    """Prove that lock, vLLM, package and environment fit (exit 0 only when they do).

    Checks, statically and without importing vLLM: every vLLM module and symbol the backend (or a
    plugin) imports against the actual vLLM distribution (installed or a wheel); plugins and the
    constraint processor against the locked logits-processor interface; a Python-backend package's
    tensor spec against the frontend contract; the environment against the lock.

    Exit 0 only when everything fits; 6 when something does not (each failure says what to do).

    Examples:

        llmserve check-compat

        llmserve check-compat --lock deploy/llmserve.lock --vllm wheels/vllm-0.10.1.1-cp38-abi3-manylinux1_x86_64.whl

        llmserve check-compat --package dist/tiny-chat-1.llmpkg --output json
    """
    from llmserve.compat import run_checks
    from llmserve.formats.lock import load_lock

    lock = load_lock(lock_file)
    report = run_checks(
        lock,
        str(lock_file),
        vllm=vllm,
        package=package,
        check_env=not no_env,
        site_paths=[str(p) for p in site_packages] if site_packages else None,
        requirements=requirements,
    )
    if output is OutputFormat.json:
        print_json(report.to_dict())
    else:
        from rich.markup import escape
        from rich.table import Table

        table = Table(
            title=f"check-compat {report.target}" + (f" against {report.vllm}" if report.vllm else ""),
            show_lines=False,
            expand=False,
        )
        for col in ("check", "subject", "status", "detail", "what to do"):
            table.add_column(col, overflow="fold")
        for r in report.rows:
            table.add_row(
                r.check, escape(r.subject), f"[{_STYLE[r.status]}]{r.status}[/]", escape(r.detail), escape(r.fix)
            )
        console.print(table)
        fails = sum(r.status == "fail" for r in report.rows)
        if report.fits:
            console.print(f"[green]fits[/]: {len(report.rows)} checks, none failed", highlight=False)
        else:
            console.print(f"[bold red]does not fit[/]: {fails} failed check(s); see 'what to do'", highlight=False)
    if not report.fits:
        from llmserve.errors import ExitCode

        raise typer.Exit(ExitCode.INCOMPATIBLE)


def register(app: typer.Typer) -> None:
    app.command("check-compat")(check_compat)
