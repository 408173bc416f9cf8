"""`forkv serve`: check where to listen, load the model, run the app under uvicorn.

Listens on loopback by default; binding any other address needs at least one API key
(`--api-key` or `FORKV_API_KEY`), else the command refuses with a message saying so. Knows
the command line, not the endpoints.
"""

from __future__ import annotations

import ipaddress
import os
import sys

from forkv.errors import ForkvError

__all__ = ["BindRefused", "add_arguments", "check_bind", "run_serve", "serve"]


class BindRefused(ValueError, ForkvError):
    """A non-loopback address without an API key."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_keys) -> None:
    if not is_loopback(host) and not api_keys:
        raise BindRefused(f"Refusing to serve on {host} without an API key: anyone who can reach "
                          "it could use the model; pass --api-key KEY (or set FORKV_API_KEY), "
                          "or keep the default --host 127.0.0.1.")


def serve(config) -> None:
    """Load `config.model` (a `ServerConfig`) and serve it until interrupted."""
    import uvicorn

    from forkv.engine import EngineConfig, load_model
    from forkv.engine.chat_template import require_chat_template, use_chat_template

    from .app import ServerState, make_app

    check_bind(config.host, config.api_keys)
    engine = EngineConfig.from_env()  # FORKV_DTYPE, FORKV_QUANTIZED, as an Engine reads them
    lm = load_model(config.model, engine.dtype, engine.quantized)
    if config.chat_template is not None:
        use_chat_template(lm, config.chat_template)
    require_chat_template(lm.tokenizer, lm.name)  # every route renders chat messages
    app = make_app(ServerState(config, lm))
    print(f"forkv serve: {config.model} on http://{config.host}:{config.port}/v1 "
          f"({'API keys required' if config.api_keys else 'no API key'})", file=sys.stderr,
          flush=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning",
                timeout_graceful_shutdown=5)


def run_serve(args) -> int:
    """The `forkv serve` subcommand (arguments from `forkv.cli`)."""
    for name in ("port", "max_queue", "max_seqs", "max_namespaces", "max_body"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got "
                             f"{getattr(args, name)}.")
    keys = tuple(args.api_key or ())
    if not keys and os.environ.get("FORKV_API_KEY"):
        keys = (os.environ["FORKV_API_KEY"],)
    from .app import ServerConfig

    config = ServerConfig(model=args.model, host=args.host, port=args.port, api_keys=keys,
                          max_queue=args.max_queue, max_seqs=args.max_seqs,
                          max_namespaces=args.max_namespaces,
                          max_body=args.max_body, reasoning=args.reasoning,
                          chat_template=getattr(args, "chat_template", None))
    serve(config)  # BindRefused is a ValueError: the CLI prints it and exits 2
    return 0


def add_arguments(p) -> None:
    """The subcommand's options, on an argparse parser."""
    p.add_argument("--model", required=True,
                   help="a model name: folder, .gguf, org/name[@rev], gemma3-270m, demo:<arch>")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require this bearer key; repeat for several tenants (each its own "
                        "checkpoint namespace)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests in flight before new ones get 429")
    p.add_argument("--max-seqs", type=int, default=8, help="sequences decoded in one batch")
    p.add_argument("--max-namespaces", type=int, default=8,
                   help="tenant/cache_salt namespaces with a live engine (least recently used "
                        "idle ones are closed past this)")
    p.add_argument("--max-body", type=int, default=32 << 20, help="largest request body, bytes")
    p.add_argument("--reasoning", choices=("auto", "on", "off"), default="auto",
                   help="Responses API: split thinking into reasoning items (auto: when the "
                        "tokenizer has a thinking format)")
