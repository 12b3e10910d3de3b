"""`llmserve lock`: pin Triton, vLLM, torch and client versions known to work together."""

from __future__ import annotations

from pathlib import Path

import typer

from llmserve.cli.render import OutputFormat, console, err_console, print_json


def lock(
    target: str = typer.Option(
        None,
        "--stack",
        "-s",
        help="The engine stack to pin: local-cpu or a Triton release line (triton-25.09). "
        "Default: the existing lock's. (`--target` names a deploy target elsewhere.)",
    ),
    old_target: str = typer.Option(None, "--target", "-t", hidden=True, help="Former name of --stack."),
    upgrade: bool = typer.Option(
        False, "--upgrade", help="Allow the lock to move (new target, new package set, new knowledge base)."
    ),
    lock_file: Path = typer.Option(Path("llmserve.lock"), "--lock", "-l", help="Lock file to write or read."),
    vllm_version: str = typer.Option(
        None,
        "--vllm-version",
        help="Only for Triton lines newer than the knowledge base: the vLLM version read from the image.",
    ),
    requirements: Path = typer.Option(
        None,
        "--requirements",
        "-r",
        help="local-cpu: take the package set from this pip file of exact pins, `--hash=sha256:...` options "
        "allowed (they are kept) (default: the existing lock's set, else the running environment).",
    ),
    hashes_from: list[Path] = typer.Option(
        None,
        "--hashes-from",
        help="local-cpu: record each pin's sha256 from this pip installation report, made on a machine the stack "
        "targets (x86-64 Linux, CPython 3.11) with `pip install --dry-run --ignore-installed --no-deps --report "
        "R.json -r FILE` (PEP 658 metadata: nothing downloaded). Repeat to merge reports (one per platform); a "
        "file a report has no hash for is downloaded and hashed.",
    ),
    pip_hashes: bool = typer.Option(
        False,
        "--pip-hashes",
        help="local-cpu: make that pip report here (this interpreter's pip, index and find-links config) and "
        "record its hashes. Needs Python 3.11 on the stack's platform.",
    ),
    export: str = typer.Option(
        None,
        "--export",
        help="Instead of resolving, write the lock in another format: 'requirements' (pip file for "
        "`pip install --no-deps --require-hashes -r`; `name==version --hash=sha256:...` lines when the lock has hashes).",
    ),
    out: Path = typer.Option(None, "--out", "-O", help="With --export: file to write (default: stdout)."),
    list_targets: bool = typer.Option(False, "--list", help="List the stacks the knowledge base knows and exit."),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o", help="text or json."),
) -> None:
    """Pin a target's engine stack in llmserve.lock (Triton line or local CPU).

    Records for the target: exact vLLM, torch, tritonclient and Python versions, the
    structured-output and logits-processor interfaces, the vLLM import surface the backend needs,
    environment pins (VLLM_USE_V2_MODEL_RUNNER) and, for local-cpu, the exact package set with the
    sha256 of each package's distribution file(s), so the export installs with --require-hashes.

    Hashes come from --hash options in the --requirements file, pip reports (--hashes-from) or
    pip run here (--pip-hashes); once any gives hashes, every pin needs one. Adding hashes to an
    existing lock is a change: `llmserve lock --pip-hashes --upgrade`.

    The output is deterministic; an unchanged lock is not rewritten. A lock only moves with --upgrade.
    The timestamp honours SOURCE_DATE_EPOCH.

    Examples:

        llmserve lock --stack local-cpu --requirements requirements/cpu-stack.lock.txt

        llmserve lock --stack local-cpu --requirements pins.txt --pip-hashes --upgrade

        llmserve lock --stack local-cpu --requirements pins.txt --hashes-from report.json --upgrade

        llmserve lock --stack triton-25.09

        llmserve lock --export requirements --out requirements/cpu-stack.lock.txt
    """
    from llmserve.compat import export_requirements, resolve_lock, write_lock
    from llmserve.compat.resolve import write_export
    from llmserve.errors import InvalidInputError
    from llmserve.formats.lock import load_lock

    if old_target is not None:
        if target is not None and target != old_target:
            raise InvalidInputError(f"--stack {target} and --target {old_target} disagree", hint="Use --stack alone.")
        target = old_target
        err_console.print("[yellow]note[/] `llmserve lock --target` is now `--stack`; --target will go away.")
    if list_targets:
        _list_targets(output)
        return

    if export is not None:
        if export != "requirements":
            raise InvalidInputError(f"--export {export}: unknown format", hint="Use --export requirements.")
        current = load_lock(lock_file)
        if target is not None and target != current.target.name:
            raise InvalidInputError(
                f"{lock_file} is locked for {current.target.name}, not {target}",
                hint=f"Lock {target} first: `llmserve lock --stack {target} --lock <file>`.",
            )
        text = export_requirements(current)  # refuses a lock without a package set
        count = len(current.packages.requirements) if current.packages else 0
        digest = current.packages.digest if current.packages else None
        if out is None:
            typer.echo(text, nl=False)
        else:
            write_export(text, out)
            if output is OutputFormat.json:
                print_json(
                    {
                        "exported": str(out),
                        "format": "requirements",
                        "target": current.target.name,
                        "packages": count,
                        "digest": digest,
                        "hashes": bool(current.packages and current.packages.hashes),
                    }
                )
            else:
                console.print(
                    f"[green]exported[/] {count} pinned packages of {current.target.name} -> [bold]{out}[/]",
                    highlight=False,
                )
        return

    existing = load_lock(lock_file) if lock_file.exists() else None
    outcome = write_lock(
        resolve_lock(
            target,
            existing=existing,
            upgrade=upgrade,
            vllm_version=vllm_version,
            requirements=requirements,
            hashes_from=hashes_from or None,
            pip_hashes=pip_hashes,
        ),
        lock_file,
    )
    lk = outcome.lock
    data = {
        "lock": str(lock_file),
        "action": outcome.action,
        "target": lk.target.name,
        "image": lk.target.image,
        "vllm": f"{lk.stack.vllm.distribution}=={lk.stack.vllm.version}",
        "torch": lk.stack.torch,
        "tritonclient": lk.stack.tritonclient,
        "python": lk.stack.python,
        "env": lk.env,
        "packages": len(lk.packages.requirements) if lk.packages else None,
        "hashes": sum(map(len, lk.packages.hashes.values())) if lk.packages and lk.packages.hashes else None,
        "changes": outcome.changes,
        "resolvedAt": lk.resolved.at,
    }
    if output is OutputFormat.json:
        print_json(data)
        return
    verb = {"created": "[green]locked[/]", "upgraded": "[yellow]upgraded[/]", "unchanged": "[dim]unchanged[/]"}[
        outcome.action
    ]
    pins = f"{data['vllm']}, torch {lk.stack.torch or 'from image'}, tritonclient {lk.stack.tritonclient}, python {lk.stack.python}"
    console.print(f"{verb} {lk.target.name}: {pins} -> [bold]{lock_file}[/]", highlight=False)
    for change in outcome.changes:
        console.print(f"  {change}", highlight=False, markup=False)
    if lk.packages is not None and not lk.packages.hashes:
        err_console.print(
            "[yellow]note[/] the package set has no hashes, so its export cannot install with --require-hashes; "
            "add them: `llmserve lock --pip-hashes --upgrade` (or --hashes-from R.json).",
            highlight=False,
        )


def _list_targets(output: OutputFormat) -> None:
    from llmserve.compat import load_knowledge_base
    from llmserve.compat.kb import resolve_target

    kb = load_knowledge_base()
    rows = []
    for name in kb.target_names():
        t = resolve_target(name, kb)
        rows.append(
            {
                "target": name,
                "vllm": f"{t.vllm_distribution} {t.vllm_version}",
                "torch": t.torch,
                "tritonclient": t.tritonclient,
                "structuredOutputs": t.structured_outputs.key,
                "processor": t.processor_interface,
                "surface": t.surface_id,
                "image": t.image,
            }
        )
    rows.append(
        {
            "target": f"triton-<after {kb.targets.triton.later.after}>",
            "vllm": "from-image (--vllm-version)",
            "torch": "from-image",
            "tritonclient": None,
            "structuredOutputs": kb.targets.triton.later.structured_outputs.key,
            "processor": kb.targets.triton.later.processor_interface,
            "surface": kb.targets.triton.later.surface,
            "image": None,
        }
    )
    if output is OutputFormat.json:
        print_json(rows)
        return
    from rich.table import Table

    table = Table(title="llmserve compatibility knowledge base")
    for col in ("target", "vllm", "torch", "tritonclient", "structured output", "processor", "backend surface"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["target"],
            r["vllm"],
            r["torch"] or "-",
            r["tritonclient"] or "-",
            r["structuredOutputs"],
            r["processor"],
            r["surface"],
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("lock")(lock)
