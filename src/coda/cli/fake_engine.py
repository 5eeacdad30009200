"""`coda fake-engine`: an OpenAI-compatible server running one simulated worker in real time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from coda.cli import app, err_console, out_console
from coda.errors import CodaError
from coda.shell import strict_json

# Options that configure the simulated worker (SimConfig); the rest configure the server.
WORKER_KEYS = ("system", "profile", "chunk_tokens", "max_num_seqs", "max_num_batched_tokens", "hbm_kv_gib", "dram", "ssd", "cpu_shadow",
               "dram_kv_gib", "ssd_kv_gib", "policies")


def build_config(config: Path | None, cli: dict[str, Any]) -> Any:
    """A YAML/TOML file with flags laid over it (flags win) as a ``FakeEngineConfig``."""
    from coda.config.load import layered, read_config, validated
    from coda.engines.fake import ENGINE_SYSTEM, FakeEngineConfig
    from coda.sim.config import SimConfig

    source = str(config) if config else "command line"
    data = layered({"system": ENGINE_SYSTEM}, read_config(config) if config else {}, {k: v for k, v in cli.items() if v is not None})
    engine = validated(SimConfig, {k: data.pop(k) for k in WORKER_KEYS if k in data}, source, show_input=True)
    return validated(FakeEngineConfig, {**data, "engine": engine}, source, show_input=True)


@app.command("fake-engine")
def fake_engine(
    port: Annotated[int, typer.Option("--port", "-p", help="port to listen on (0: any free port, printed at startup)")] = 8000,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    model: Annotated[str | None, typer.Option("--model", help="served model name (default coda-fake)")] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="cost profile name or JSON path")] = None,
    system: Annotated[
        str | None,
        typer.Option("--system", "-s", help="system preset of the worker (LRU-eviction presets; default vllm, the engine it fakes)"),
    ] = None,
    speedup: Annotated[float | None, typer.Option("--speedup", help="virtual seconds per wall second (tests use > 1)")] = None,
    kv_events: Annotated[
        str | None, typer.Option("--kv-events", help="publish vLLM-format KV events on this ZMQ endpoint, e.g. tcp://*:5557")
    ] = None,
    kv_events_replay: Annotated[
        str | None, typer.Option("--kv-events-replay", help="ZMQ ROUTER endpoint for replay requests, e.g. tcp://*:5558")
    ] = None,
    kv_events_topic: Annotated[
        str | None, typer.Option("--kv-events-topic", help="topic frame of KV event messages (vLLM's default: empty)")
    ] = None,
    max_model_len: Annotated[
        int | None, typer.Option("--max-model-len", help="longest prompt + output (default: what HBM KV holds)")
    ] = None,
    default_max_tokens: Annotated[int | None, typer.Option("--default-max-tokens", help="output length when a request sets none")] = None,
    chunk_tokens: Annotated[
        int | None, typer.Option("--chunk-tokens", help="KV block size in tokens (also the KV events' block_size)")
    ] = None,
    max_num_seqs: Annotated[int | None, typer.Option("--max-num-seqs")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option("--max-num-batched-tokens")] = None,
    hbm_kv_gib: Annotated[float | None, typer.Option("--hbm-kv-gib", help="override the profile's HBM KV")] = None,
    dram: Annotated[bool | None, typer.Option("--dram/--no-dram", help="override the preset's DRAM tier")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML or TOML file with any of these options")] = None,
) -> None:
    """Serve /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /v1/models, /health,
    /tokenize and /metrics from one simulated worker timed by the cost model."""
    from coda.engines.server import serve

    if not 0 <= port <= 65535:
        raise CodaError(f"--port must be in 0..65535, got {port}")
    cli = dict(
        model=model,
        profile=profile,
        system=system,
        speedup=speedup,
        kv_events=kv_events,
        kv_events_replay=kv_events_replay,
        kv_events_topic=kv_events_topic,
        max_model_len=max_model_len,
        default_max_tokens=default_max_tokens,
        chunk_tokens=chunk_tokens,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        hbm_kv_gib=hbm_kv_gib,
        dram=dram,
    )
    cfg = build_config(config, cli)

    def ready(url: str, engine: dict[str, Any]) -> None:
        out_console.print(f"coda fake-engine listening on {url}", highlight=False, soft_wrap=True)
        err_console.print(strict_json.dumps(engine), highlight=False, soft_wrap=True, markup=False)

    asyncio.run(serve(cfg, host, port, ready))
