"""`epp-sim`: run one simulated vLLM server, or `epp-sim pool` for N in one process.

    epp-sim --port 8000 --model NAME [--num-gpu-blocks N --block-size 16 --max-num-seqs N
            --role prefill|decode|both --batching continuous|static|dynamic --time-scale F
            --kv-events tcp://127.0.0.1:5557 ...]
    epp-sim pool --servers 8 --base-port 8000 [--roles prefill,decode,...] [same options]

Every server prints `epp-sim listening on http://HOST:PORT model=... role=...` once it
accepts connections. Ctrl-C (SIGINT) or SIGTERM stops all servers cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

import yaml

from .config import SimConfig, TimeModel
from .pool import SimPool

__all__ = ["build_configs", "main", "parse_args"]

# (flag, SimConfig field, type); None values are left at the config default.
_OPTIONS: list[tuple[str, str, Any, str]] = [
    ("--model", "model", str, "served model name"),
    ("--num-gpu-blocks", "num_gpu_blocks", int, "KV cache size in blocks"),
    ("--block-size", "block_size", int, "tokens per KV block"),
    ("--max-num-seqs", "max_num_seqs", int, "largest running batch"),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int, "token budget per step"),
    ("--max-model-len", "max_model_len", int, "longest prompt + output (-1: fit the KV cache)"),
    ("--role", "role", str, "prefill, decode or both"),
    ("--batching", "batching", str, "continuous, static or dynamic"),
    ("--max-batch-size", "max_batch_size", int, "static/dynamic batch size"),
    ("--max-wait-time", "max_wait_time_s", float, "dynamic: longest wait for a full batch (s)"),
    ("--time-scale", "time_scale", float, "wall seconds per simulated second"),
    ("--seed", "seed", int, "seed for output lengths, text and jitter"),
    ("--tokenizer", "tokenizer", str, "Hugging Face tokenizer.json (default: built-in)"),
    ("--kv-events", "kv_events_endpoint", str, "ZMQ endpoint for KV events (off if unset)"),
    ("--kv-events-format", "kv_events_format", str, "map (current vLLM) or array (older)"),
    ("--max-loras", "max_loras", int, "LoRA adapters per batch"),
    ("--max-waiting", "max_waiting", int, "waiting-queue length before 429"),
    ("--kv-hold-timeout", "kv_hold_timeout_s", float, "prefiller KV hold time (s)"),
    ("--failure-rate", "failure_rate", float, "fraction of requests answered with an error"),
    ("--failure-status", "failure_status", int, "status of injected failures"),
    ("--fault", "fault", str, "ok, fail or hang: a wedged server (inference only; POST /sim/fault changes it)"),
    ("--metrics-delay", "metrics_delay_s", float, "delay before answering /metrics (s)"),
]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp-sim", description="Simulated vLLM model server(s).")
    p.add_argument("command", nargs="?", choices=["serve", "pool"], default="serve")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="port of a single server")
    p.add_argument("--servers", type=int, default=8, help="pool: number of servers")
    p.add_argument("--base-port", type=int, default=8000, help="pool: port of server 0")
    p.add_argument("--roles", default=None, help="pool: comma list of roles, cycled")
    p.add_argument("--config", default=None, help="YAML file of SimConfig fields")
    for flag, field, typ, helptext in _OPTIONS:
        p.add_argument(flag, dest=field, type=typ, default=None, help=helptext)
    p.add_argument("--lora", dest="lora_adapters", action="append", default=None,
                   help="preloaded LoRA adapter name (repeatable)")
    p.add_argument("--time-model", action="append", default=[], metavar="KEY=VALUE",
                   help=f"time-model override, keys: {', '.join(TimeModel.model_fields)}")
    p.add_argument("--enable-lora", action="store_true", default=None,
                   help="serve LoRA adapters (implied by --lora)")
    p.add_argument("--v0-metrics", action="store_true", default=None)
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   default=None)
    p.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false",
                   default=None)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return _parser().parse_args(argv)


def _base_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if args.config:
        with open(args.config) as fh:
            fields.update(yaml.safe_load(fh) or {})
    names = [f for _, f, _, _ in _OPTIONS] + [
        "lora_adapters", "enable_lora", "v0_metrics", "enable_prefix_caching", "enable_chunked_prefill",
    ]
    for name in names:
        value = getattr(args, name)
        if value is not None:
            fields[name] = value
    if args.time_model:
        tm = dict(fields.get("time_model") or {})
        for item in args.time_model:
            key, _, value = item.partition("=")
            tm[key.strip()] = float(value)
        fields["time_model"] = tm
    return fields


def _offset_endpoint(endpoint: str, i: int) -> str:
    host, _, port = endpoint.rpartition(":")
    return f"{host}:{int(port) + i}" if port.isdigit() else endpoint


def build_configs(args: argparse.Namespace) -> tuple[list[SimConfig], list[int]]:
    """Server configs and ports described by the command line."""
    base = _base_fields(args)
    if args.command != "pool":
        return [SimConfig(**base)], [args.port]
    roles = args.roles.split(",") if args.roles else [base.get("role", "both")]
    configs = []
    for i in range(args.servers):
        fields = dict(base, role=roles[i % len(roles)].strip())
        endpoint = fields.get("kv_events_endpoint")
        if endpoint and ("*" in endpoint or fields.get("kv_events_bind")):
            # Bound publishers need a port each, offset by the index as vLLM does for DP ranks.
            fields["kv_events_endpoint"] = _offset_endpoint(endpoint, i)
        configs.append(SimConfig(**fields))
    # --base-port 0 gives every server a free port of its own.
    return configs, [args.base_port + i if args.base_port else 0 for i in range(args.servers)]


async def _serve(configs: list[SimConfig], ports: list[int], host: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with SimPool(configs, host=host, ports=ports) as pool:
        for server in pool.servers:
            extra = f" kv_events={server.kv_publisher.endpoint}" if server.kv_publisher else ""
            print(
                f"epp-sim listening on {server.url} model={server.cfg.model} "
                f"role={server.cfg.role}{extra}",
                flush=True,
            )
        await stop.wait()
    print("epp-sim stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        configs, ports = build_configs(args)
    except (ValueError, OSError) as exc:
        print(f"epp-sim: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop  # optional, faster event loop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(_serve(configs, ports, args.host))
    except OSError as exc:
        print(f"epp-sim: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
