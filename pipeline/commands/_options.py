"""Options shared by the commands."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tracedag.pipeline.store.manifests import check_kept, publish
from tracedag.pipeline.store.remote import bind_store, is_url
from tracedag.schemas.errors import TracedagError
from tracedag.schemas.layout import is_store

_F = TypeVar("_F", bound=Callable[..., Any])


def _existing_store(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """Refuse a ``--data`` that holds no store: a typo must not read as an empty answer."""
    if not is_store(value):
        where = "does not exist" if not value.exists() else "holds no tracedag store (no spool/, tables/ or state/)"
        raise click.BadParameter(
            f"{value} {where}. Collect or ingest spans into it first (tracedag collect --data {value}, "
            f"tracedag ingest FILE --data {value}), or point --data / TRACEDAG_DATA at an existing store.",
            ctx=ctx, param=param,
        )
    return value


class _StoreType(click.ParamType):  # type: ignore[type-arg]  # generic only in click >= 8.3
    """A local directory (a ``Path``) or an object-store URL (kept as text: ``Path`` would fold ``//``)."""

    name = "DIRECTORY|URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        if isinstance(value, Path):
            return value
        if is_url(str(value)):
            return str(value)
        converted = click.Path(file_okay=False, path_type=Path).convert(value, param, ctx)
        return converted if isinstance(converted, Path) else Path(str(converted))


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"tracedag.{param.name}"] = value
    return value


def _resolve(create: bool) -> Callable[[click.Context, click.Parameter, Path | str], Path]:
    def callback(ctx: click.Context, param: click.Parameter, value: Path | str) -> Path:
        if isinstance(value, Path):
            return value if create else _existing_store(ctx, param, value)
        try:
            work = bind_store(value, ctx.meta.get("tracedag.work_dir"), ctx.meta.get("tracedag.writer_id"), create)
            if create:  # a writer whose store lost files it cannot publish again refuses before any work
                check_kept(work)
        except TracedagError as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from e
        ctx.call_on_close(lambda: _publish_at_exit(work))
        return work
    return callback


def _publish_at_exit(work: Path) -> None:
    """A command on an object store publishes what it wrote; a failed upload is said, and the exit code is 1."""
    try:
        stats = publish(work)
    except OSError as e:  # the manifest could not be written: the files are uploaded again next time
        click.echo(f"warning: the store did not take this writer's manifest ({e}); the files stay in {work} "
                   "and go with the next command run there", err=True)
        sys.exit(1)
    if stats is not None and stats.errors:
        click.echo(f"warning: {len(stats.errors)} file(s) could not be uploaded to the store ({stats.errors[0]}); "
                   f"they stay in {work} and go with the next command run there", err=True)
        sys.exit(1)


def _store_option(create: bool) -> Callable[[_F], _F]:
    help_text = ("Data directory, or an object store URL such as s3://bucket/prefix (env TRACEDAG_DATA)"
                 + ("; created when missing." if create else "; must exist."))
    data: Callable[[_F], _F] = click.option(
        "--data", "data", envvar="TRACEDAG_DATA", default="./tracedag-data", show_default=True,
        type=_StoreType(), help=help_text, callback=_resolve(create),
    )
    work: Callable[[_F], _F] = click.option(
        "--work-dir", "--spool", "work_dir", envvar="TRACEDAG_WORK_DIR", is_eager=True, expose_value=False,
        type=click.Path(file_okay=False, path_type=Path), callback=_remember,
        help="With an object store: the local work directory (spool, state, files not yet uploaded); "
             "default ~/.cache/tracedag/stores/<store>.",
    )
    writer: Callable[[_F], _F] = click.option(
        "--writer-id", "--collector-id", "writer_id", envvar="TRACEDAG_WRITER_ID", is_eager=True,
        expose_value=False, callback=_remember,
        help="With an object store: this writer's id in the names of the files it publishes "
             "(default: the host name and a hash of the work directory).",
    )

    def decorate(f: _F) -> _F:
        return data(work(writer(f)))
    return decorate


data_option = _store_option(create=False)
"""``--data`` of every command that reads a store: an error when there is none at the path."""

new_data_option = _store_option(create=True)
"""``--data`` of the commands that fill a store (``collect``, ``ingest``): created when missing."""
