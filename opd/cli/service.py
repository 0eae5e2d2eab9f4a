"""The service's commands: `opd serve` (all of it on one machine), `opd api`, `opd worker`,
`opd migrate` and `opd rotate-secrets`.

Each imports the service or the worker inside it, to keep the other commands' start-up fast.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from opd.cli.common import CommandError, example, settings

if TYPE_CHECKING:
    from opd.cli.common import Commands


def logging_setup() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def api_command(args: argparse.Namespace) -> int:
    # start-up time: the app and uvicorn
    import uvicorn

    from app.main import create_app

    app = create_app()
    # What exists now lives as long as the process: frozen, the collector never scans it
    # again. Its full passes over it paused every request ~100 ms (benchmarks/curve_reads.py).
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning" if args.quiet else "info")
    return 0


def worker_command(args: argparse.Namespace) -> int:
    from worker.service.main import serve_worker  # start-up time: the worker loads torch

    logging_setup()
    asyncio.run(serve_worker(settings()))
    return 0


def migrate_command(args: argparse.Namespace) -> int:
    from app.core.db import migrate  # start-up time: the database layer

    url = settings().database_url
    migrate(url)
    print(f"Database is at the latest schema: {url}")
    return 0


def rotate_secrets_command(args: argparse.Namespace) -> int:
    # start-up time: the database layer
    import app.tables  # noqa: F401  (every table in the metadata before a flush)
    from app.core.db import migrate, standalone_session
    from app.core.encryption import SecretUnreadable, secret_box
    from app.webhooks.store import reseal_secrets

    config = settings()
    migrate(config.database_url, settings=config)

    async def reseal() -> int:
        async with standalone_session(config.database_url) as session:
            return await reseal_secrets(session, secret_box(config))

    try:
        count = asyncio.run(reseal())
    except SecretUnreadable as error:
        raise CommandError(f"{error}: add the key it was encrypted under") from None
    print(f"Re-encrypted {count} secret(s) under the first key of OPD_SECRET_KEY")
    return 0


def serve_command(args: argparse.Namespace) -> int:
    from opd.serve import serve  # start-up time: the whole service

    return serve(
        settings(), args.host, args.port, args.demo, args.demo_spec, keep_serving=args.keep_serving
    )


def add_parsers(commands: Commands) -> None:

    serve = commands.add_parser(
        "serve", help="the whole service on one machine: API, a worker, SQLite, its own Redis"
    )
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="the API's port (8000)")
    serve.add_argument(
        "--demo",
        action="store_true",
        help="create the demo job (the arithmetic student learns from its teacher), show its "
        "progress and its held-out accuracy at each eval, stop the service when it ends",
    )
    serve.add_argument(
        "--keep-serving",
        action="store_true",
        help="with --demo: leave the service running after the demo (Ctrl-C stops it)",
    )
    serve.add_argument(
        "--demo-spec",
        type=Path,
        help="the spec --demo submits (default: examples/arith.yaml)",
    )
    serve.set_defaults(handler=serve_command)
    example(serve, "opd serve --demo --keep-serving")

    api = commands.add_parser("api", help="the HTTP API (scale out: run several)")
    api.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    api.add_argument("--port", type=int, default=8000, help="its port (8000)")
    api.add_argument("--quiet", action="store_true", help="log warnings only")
    api.set_defaults(handler=api_command)
    example(api, "opd api --host 0.0.0.0 --port 8000")

    worker = commands.add_parser(
        "worker", help="a worker that runs queued jobs (needs OPD_REDIS_URL)"
    )
    example(worker, "OPD_REDIS_URL=redis://127.0.0.1:6379/0 opd worker").set_defaults(
        handler=worker_command
    )
    migrate = commands.add_parser("migrate", help="bring the database to the latest schema")
    example(migrate, "opd migrate").set_defaults(handler=migrate_command)

    rotate = commands.add_parser(
        "rotate-secrets",
        help="re-encrypt stored secrets under OPD_SECRET_KEY's first key (then drop old keys)",
    )
    example(rotate, "opd rotate-secrets").set_defaults(handler=rotate_secrets_command)
