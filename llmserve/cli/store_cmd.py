"""`llmserve push PKG s3://...` and `llmserve pull s3://...`: the model store and the local cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from llmserve.cli.render import OutputFormat, byte_progress, console, print_json

EndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        help="S3-compatible endpoint (MinIO, Ceph, moto...). Default: AWS_ENDPOINT_URL, else AWS S3 itself.",
    ),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", help="AWS profile from ~/.aws/config. Default: AWS_PROFILE, else the default chain."),
]
RegionOpt = Annotated[str | None, typer.Option("--region", help="AWS region. Default: AWS_REGION / the profile's.")]
ConcurrencyOpt = Annotated[int, typer.Option("--concurrency", min=1, max=64, help="Parts transferred in parallel.")]
OutputOpt = Annotated[
    OutputFormat, typer.Option("--output", "-o", help="text or json (the result; progress goes to stderr).")
]


def _options(endpoint_url: str | None, profile: str | None, region: str | None):
    from llmserve.store import StoreOptions

    return StoreOptions(endpoint_url=endpoint_url, profile=profile, region=region)


def push(
    pkg: Path = typer.Argument(..., help="A .llmpkg built by `llmserve package`."),
    store: str = typer.Argument(..., help="The store: s3://BUCKET/PREFIX."),
    part_size: str = typer.Option(
        None,
        "--part-size",
        help="Multipart part size (e.g. 64MiB; at least 5MiB). Default: 16MiB, more for huge packages.",
    ),
    concurrency: ConcurrencyOpt = 8,
    max_bandwidth: str = typer.Option(None, "--max-bandwidth", help="Upload at most this many bytes/s (e.g. 100M)."),
    endpoint_url: EndpointOpt = None,
    profile: ProfileOpt = None,
    region: RegionOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Upload a package to an S3 model store, content-addressed by its digest, and point
    MODEL_ID:VERSION at it. The package is verified first; parts go up in parallel with SHA256
    checksums; an interrupted push continues when run again; a package already in the store is not
    sent again. Credentials come from the usual AWS configuration, never from flags.

    Example:

        llmserve push dist/tiny-chat-1.llmpkg s3://models/prod --endpoint-url http://127.0.0.1:9000

    Exit codes: 0 pushed (or already there), 3 bad arguments, 4 package or upload fails verification,
    5 no such package or bucket, 8 store unreachable, refused credentials or transfer interrupted.
    """
    from llmserve.store import parse_size
    from llmserve.store import push as push_package

    with byte_progress("pushing", enabled=output is OutputFormat.text) as (set_total, advance):
        result = push_package(
            pkg,
            store,
            options=_options(endpoint_url, profile, region),
            part_size=parse_size(part_size, "--part-size") if part_size else None,
            concurrency=concurrency,
            max_bandwidth=parse_size(max_bandwidth, "--max-bandwidth") if max_bandwidth else None,
            on_total=set_total,
            advance=advance,
        )
    if output is OutputFormat.json:
        print_json(result.to_dict())
        return
    if result.alreadyPresent:
        what = "already in the store, nothing transferred"
    else:
        what = (
            f"{result.partsUploaded} of {result.partsTotal} parts uploaded"
            + (f", {result.partsReused} already there (resumed)" if result.partsReused else "")
            + f", {result.bytesUploaded:,} bytes in {result.seconds:.1f} s"
        )
    console.print(
        f"[green]pushed[/] {escape(result.url)}  sha256:{result.digest[:16]}…  {result.size:,} bytes: {what}",
        highlight=False,
    )
    if result.replacedDigest:
        console.print(
            f"[yellow]note[/]: {result.modelId}:{result.modelVersion} named sha256:{result.replacedDigest[:16]}… before",
            highlight=False,
        )


def pull(
    reference: str = typer.Argument(
        ..., help="s3://BUCKET/PREFIX/MODEL_ID:VERSION or s3://BUCKET/PREFIX/sha256:DIGEST (with --list: the store)."
    ),
    cache: Path = typer.Option(
        None, "--cache", help="Cache folder. Default: $LLMSERVE_STORE_CACHE, else $LLMSERVE_CACHE/store."
    ),
    max_cache_size: str = typer.Option(
        None,
        "--max-cache-size",
        help="Evict least recently used packages (never one in use) to stay under this size (e.g. 200G).",
    ),
    list_: bool = typer.Option(False, "--list", help="List the model versions in the store instead of pulling."),
    offline: bool = typer.Option(
        False, "--offline", help="Resolve MODEL_ID:VERSION from the cache's record of its last pull; no request to S3."
    ),
    concurrency: ConcurrencyOpt = 8,
    endpoint_url: EndpointOpt = None,
    profile: ProfileOpt = None,
    region: RegionOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Materialise a package from the store into the local cache: downloaded in parallel, verified
    part by part and against its digest before it appears (atomic rename), shared by digest, safe
    when several processes pull at once (one downloads, the others wait and reuse it).

    Example:

        llmserve pull s3://models/prod/tiny-chat:1 --cache /fsx/llmserve

        llmserve pull --list s3://models/prod -o json

    Exit codes: 0 pulled (or cached already), 3 bad arguments, 4 the object is corrupted,
    5 no such model, version or bucket, 8 store unreachable, refused credentials, interrupted
    transfer, disk full, cache full or read-only.
    """
    from llmserve.store import list_models, parse_size
    from llmserve.store import pull as pull_package

    options = _options(endpoint_url, profile, region)
    if list_:
        _list(list_models(reference, options=options), output)
        return
    with byte_progress("pulling", enabled=output is OutputFormat.text) as (set_total, advance):
        result = pull_package(
            reference,
            cache,
            options=options,
            max_cache_bytes=parse_size(max_cache_size, "--max-cache-size") if max_cache_size else None,
            concurrency=concurrency,
            offline=offline,
            on_total=set_total,
            advance=advance,
        )
    if output is OutputFormat.json:
        print_json(result.to_dict())
        return
    how = f"downloaded and verified in {result.seconds:.1f} s" if result.downloaded else "already cached"
    console.print(
        f"[green]pulled[/] {escape(reference)}  sha256:{result.digest[:16]}…  {result.size:,} bytes, {how} -> "
        f"[bold]{escape(str(result.path))}[/]",
        highlight=False,
    )
    if result.evicted:
        console.print(f"evicted {len(result.evicted)} least recently used package(s) to stay under the limit")


def _list(versions, output: OutputFormat) -> None:
    if output is OutputFormat.json:
        print_json([v.model_dump() for v in versions])
        return
    table = Table(show_header=True, header_style="bold")
    for col in ("model", "version", "backend", "bytes", "digest", "pushed"):
        table.add_column(col, justify="right" if col in ("version", "bytes") else "left")
    for v in versions:
        table.add_row(v.modelId, str(v.modelVersion), v.backend, f"{v.size:,}", f"sha256:{v.digest[:16]}…", v.pushedAt)
    console.print(table)
    if not versions:
        console.print("the store holds no model versions yet (`llmserve push PKG s3://...` adds one)")


def register(app: typer.Typer) -> None:
    app.command("push")(push)
    app.command("pull")(pull)
