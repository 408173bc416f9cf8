"""`forkv serve`: check where to listen, load the model, run the app under uvicorn.

Listens on loopback by default; binding any other address needs at least one API key
(`--api-key` or `FORKV_API_KEY`), else the command refuses with a message saying so. Other
sites' pages are refused unless `--allow-origin` names them (`guard`). The
command sets up the server's log on stderr (`logs.setup`; `--quiet` keeps only warnings).
Knows the command line (its help lists the endpoints), not how the endpoints work.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from forkv.cli import add_kv_dtype_option, add_ram_option, add_speculate_option
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
    """Load the pinned models of `config` (a `ServerConfig`) and serve until interrupted."""
    import uvicorn
    from forkv.engine import EngineConfig, load_model
    from forkv.engine.models.chat_template import require_chat_template, use_chat_template

    from . import logs
    from .app import ServerState, make_app

    check_bind(config.host, config.api_keys)
    engine = EngineConfig.from_env()  # FORKV_DTYPE, FORKV_QUANTIZED, as an Engine reads them
    state = ServerState(config)
    for name in config.pinned:
        t0 = logs.loading(name)
        lm = load_model(name, engine.dtype, engine.quantized, kv_dtype=engine.kv_dtype)
        if config.chat_template is not None:
            use_chat_template(lm, config.chat_template)
        require_chat_template(lm.tokenizer, lm.name)  # chat routes render messages
        state.models.add(name, lm, aliases=config.aliases if name == config.model else ())
        logs.ready(name, t0)
    app = make_app(state)
    what = ", ".join(config.pinned) or "no model yet"
    if config.on_demand:
        what += f" (any other model by name, {config.max_models} at once)"
    print(f"forkv serve: {what} on http://{config.host}:{config.port}/v1 "
          f"({'API keys required' if config.api_keys else 'no API key'})", file=sys.stderr,
          flush=True)
    from forkv import interrupts

    interrupts.check()  # a Ctrl-C that a library swallowed while the models loaded
    # Our access log (logs.py) writes one line per request, streams included: not uvicorn's.
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=5)


def run_serve(args) -> int:
    """The `forkv serve` subcommand (arguments from `forkv.cli`)."""
    for name in ("port", "max_queue", "max_seqs", "max_models", "max_body"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got "
                             f"{getattr(args, name)}.")
    keys = tuple(args.api_key or ())
    if not keys and os.environ.get("FORKV_API_KEY"):
        keys = (os.environ["FORKV_API_KEY"],)
    from . import logs
    from .app import ServerConfig
    from .guard import normalize_origin

    origins = tuple(normalize_origin(o) for o in args.allow_origin or ())  # before any load
    logs.setup(quiet=getattr(args, "quiet", False))
    models = tuple(args.model or ())
    if getattr(args, "kv_dtype", None):  # every model this server loads reads it (EngineConfig)
        os.environ["FORKV_KV_DTYPE"] = args.kv_dtype
    if getattr(args, "ram", None):  # checked here, before any model loads; each engine's own
        from forkv.engine.config import EngineConfig

        EngineConfig.from_env(ram=args.ram)
        os.environ["FORKV_RAM"] = args.ram
    memory = None if args.model_memory is None else int(args.model_memory * (1 << 30))
    config = ServerConfig(model=models[0] if len(models) == 1 else None, models=models,
                          host=args.host, port=args.port, api_keys=keys,
                          max_queue=args.max_queue, max_seqs=args.max_seqs,
                          max_models=args.max_models, model_memory=memory,
                          max_body=args.max_body, reasoning=args.reasoning,
                          reuse=args.reuse or os.environ.get("FORKV_REUSE") or "fast",
                          speculate=args.speculate or os.environ.get("FORKV_SPECULATE")
                          or "auto",
                          chat_template=getattr(args, "chat_template", None),
                          allow_origins=origins)
    serve(config)  # BindRefused is a ValueError: the CLI prints it and exits 2
    return 0


_EPILOG = """endpoints (OpenAI-compatible, at http://127.0.0.1:8000 unless --host/--port):
  POST /v1/chat/completions       chat messages in, choices out (stream: true for SSE)
  POST /v1/completions            legacy text completions of a prompt
  POST /v1/responses              Responses API; previous_response_id forks and rewinds
  GET|DELETE /v1/responses/{id}   a stored response; delete it and what was built on it
  GET /v1/models[/{id}]           models loaded, and (without --model) any loadable here
  GET /health, GET /metrics       liveness; Prometheus metrics

security: only loopback Host names (and --host) are served; a browser page of another origin
is refused unless --allow-origin names it; POST bodies must be application/json; with
--api-key every route but /health and the web app's files needs the key.

logs: a line when a model starts loading and when it is ready, and one line per request
(method, path, model, status, prompt/cached/generated tokens, time to first token, total)
on stderr; --quiet keeps only warnings."""


def add_arguments(p) -> None:
    """The subcommand's options, on an argparse parser."""
    p.add_argument("--model", action="append", default=None,
                   help="a model name (folder, .gguf, org/name[@rev], gemma3-270m, "
                        "demo:<arch>) to load now and serve alone; repeat it to load several "
                        "and serve any other name too; leave it out to serve any model name "
                        "this machine has, each loaded on the first request naming it")
    p.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the endpoint list's lines
    p.epilog = _EPILOG
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--quiet", action="store_true",
                   help="no model-load or access lines on stderr, only warnings (5xx, a full "
                        "queue, a model that fails to load)")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require this bearer key; repeat for several tenants (each its own "
                        "checkpoint namespace)")
    p.add_argument("--allow-origin", action="append", default=None, metavar="ORIGIN",
                   help="let the web pages of this origin (e.g. http://localhost:5173, your own "
                        "app) call the server from a browser; repeat for several. Other sites' "
                        "pages are always refused, as are Host names other than loopback and "
                        "--host")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests in flight before new ones get 429")
    p.add_argument("--max-seqs", type=int, default=8, help="sequences decoded in one batch")
    p.add_argument("--max-models", type=int, default=3,
                   help="models loaded at once; past it the least recently used idle one that "
                        "was loaded on demand is unloaded")
    p.add_argument("--model-memory", type=float, default=None, metavar="GIB",
                   help="also unload idle models while the weights loaded exceed this")
    p.add_argument("--reuse", choices=("exact", "fast"), default=None,
                   help="fast (default): a request may continue a recently finished request's "
                        "cache at any token, as llama.cpp continues a slot (logits within "
                        "rounding of a fresh run's); exact: restore records only, bit for bit "
                        "a fresh run with the same chunking (FORKV_REUSE)")
    add_speculate_option(p)
    add_kv_dtype_option(p)
    add_ram_option(p)
    p.add_argument("--max-body", type=int, default=32 << 20, help="largest request body, bytes")
    p.add_argument("--reasoning", choices=("auto", "on", "off"), default="auto",
                   help="Responses API: split thinking into reasoning items (auto: when the "
                        "tokenizer has a thinking format)")
