"""`coda serve`: the OpenAI-compatible gateway in front of N engines."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from coda.cli import app, err_console, out_console, out_file
from coda.errors import CodaError
from coda.serving.listen import event_loop_factory


@app.command("serve")
def serve(
    backend: Annotated[
        list[str] | None, typer.Option("--backend", "-b", help="engine base URL (repeat for each engine), e.g. http://127.0.0.1:8000")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", "-p", help="port to listen on (0: any free port, printed at startup; default 8080)")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="address to listen on (default 127.0.0.1)")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML or TOML gateway config (see examples/coda.yaml)")] = None,
    system: Annotated[
        str | None, typer.Option("--system", "-s", help="system preset whose policies the gateway starts from (default coda)")
    ] = None,
    ingress: Annotated[
        str | None,
        typer.Option(
            "--ingress", help="ingress policy: admit_all, queue_limit, kv_headroom, tenant_share, overload, session, deadline, or a+b"
        ),
    ] = None,
    router: Annotated[str | None, typer.Option("--router", help="router: round_robin, least_loaded, smetric, dynamo_kv, coda")] = None,
    shadow: Annotated[
        str | None, typer.Option("--shadow", help="an ingress policy or router whose decisions are logged, not enforced")
    ] = None,
    decision_log: Annotated[str | None, typer.Option("--decision-log", help="JSONL file of every ingress decision ('-': stderr)")] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer", help="chars (default), words (exact for coda fake-engine) or engine (the engine's /tokenize: exact for vLLM)"
        ),
    ] = None,
    max_wait_s: Annotated[float | None, typer.Option("--max-wait-s", help="longest a deferred request waits before its 503")] = None,
    scrape_interval_s: Annotated[
        float | None, typer.Option("--scrape-interval-s", help="engine /metrics scrape period (default 0.25)")
    ] = None,
    drain_timeout_s: Annotated[
        float | None, typer.Option("--drain-timeout-s", help="on SIGTERM, how long in-flight requests may finish")
    ] = None,
    store: Annotated[
        str | None,
        typer.Option("--store", help="redis://host:port/db that every replica of the gateway shares (default: in-process, one replica)"),
    ] = None,
    workers: Annotated[
        int,
        typer.Option("--workers", help="gateway processes accepting on the one port, each a replica; they share --store, or "
                     "else a store the parent process serves them (default 1: one process)"),
    ] = 1,
) -> None:
    """Serve /v1/chat/completions, /v1/completions, /v1/responses and /v1/messages in front of the
    engines, with ingress admission and KV-aware routing; also /v1/models, /health, /ready,
    /metrics and /debug/state. Options also come from --config and CODA_SERVE_* variables."""
    from coda.config.load import read_config
    from coda.gateway.app import serve as run
    from coda.gateway.config import build_config

    if workers < 1:
        raise CodaError(f"--workers {workers}: the gateway runs at least one process; pass --workers 1 or more")
    if workers > 1 and not hasattr(os, "fork"):
        raise CodaError(f"--workers {workers}: needs os.fork, which this platform lacks; run --workers 1 per port behind a "
                        "load balancer, sharing --store")
    cli: dict[str, Any] = {
        k: v
        for k, v in dict(port=port, host=host, drain_timeout_s=drain_timeout_s, system=system, decision_log=decision_log).items()
        if v is not None
    }
    if backend:
        cli["backends"] = backend
    policies: dict[str, Any] = {}
    if ingress is not None or max_wait_s is not None:
        policies["ingress"] = {
            k: v for k, v in (("name", ingress), ("defer", {"max_wait_s": max_wait_s} if max_wait_s is not None else None)) if v is not None
        }
    if router is not None:
        policies["router"] = {"name": router}
    if shadow is not None:
        kind = _shadow_kind(shadow)
        policies.setdefault(kind, {})["shadow"] = {"name": shadow}
    if policies:
        cli["policies"] = policies
    nested = {"indexer": dict(tokenizer=tokenizer), "telemetry": dict(scrape_interval_s=scrape_interval_s), "store": dict(url=store)}
    for section, values in nested.items():
        given = {k: v for k, v in values.items() if v is not None}
        if given:
            cli[section] = given
    cfg = build_config(read_config(config) if config else {}, cli, source=str(config) if config else "command line")
    for option, path in (("decision_log", cfg.decision_log), ("access_log.path", cfg.access_log.path)):
        if path and path != "-":
            out_file(path, option)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    def listening(url: str) -> None:
        out_console.print(f"coda serve listening on {url}", highlight=False, soft_wrap=True)

    def described(gw: Any) -> None:
        s = gw.state
        err_console.print(
            f"ingress {s.ingress.name}, router {s.router.name}, store {gw.replica.detail} (replica {gw.replica.id}), "
            f"{len(s.workers)} backend(s): " + ", ".join(f"{w.label} ({', '.join(sorted(w.models))})" for w in s.workers),
            highlight=False,
            soft_wrap=True,
        )

    def ready(url: str, gw: Any) -> None:
        listening(url)
        described(gw)

    try:
        if workers > 1:
            from coda.gateway.workers import serve_workers

            code = serve_workers(cfg, workers, described, listening)
            if code:
                raise typer.Exit(code)
            return
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(run(cfg, ready))
    except KeyboardInterrupt:
        pass
    except OSError as err:
        raise CodaError(str(err)) from None


def _shadow_kind(name: str) -> str:
    """``--shadow`` names an ingress policy or a router: which one, by the registry."""
    from coda.policy.registry import names

    if name.split("+")[0] in names("ingress"):
        return "ingress"
    if name in names("router"):
        return "router"
    raise CodaError(
        f"--shadow {name!r} is neither an ingress policy ({', '.join(names('ingress'))}) nor a router ({', '.join(names('router'))})"
    )
