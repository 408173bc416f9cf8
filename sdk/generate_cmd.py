"""`forkv generate`: stream one completion to stdout, timings to stderr.

Knows the command's options, how they become `SamplingParams`, where the prompt comes from
(the argument, or stdin for `-`) and how to show a long prefill (`forkv.progress`). Runs
through the public engine API only (`forkv.load`, `engine.stream`).
"""

from __future__ import annotations

import logging
import sys

from .cli import add_kv_dtype_option, add_ram_option, add_speculate_option

__all__ = ["DEFAULT_MODEL", "add_arguments", "read_prompt", "run_generate",
           "sampling_from_args"]

# The model of `forkv generate` without --model: a real chat model (fetched once, 98 MB), as
# mlx_lm.generate defaults to a real one; demo models' text is noise.
DEFAULT_MODEL = "smollm2-135m"


def add_arguments(p) -> None:
    p.add_argument("prompt", help="the text to complete; '-' reads it from stdin")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"a model name, see `forkv --help` (default {DEFAULT_MODEL})")
    p.add_argument("--chat", action="store_true",
                   help="send the prompt as a user turn through the chat template")
    p.add_argument("--system", default=None, help="with --chat: a system prompt before it")
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus mass, 1 = off")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely, 0 = off")
    g.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens below this fraction of the top one's probability")
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divide logits of recent tokens by this, 1 = off")
    g.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract from logits of recent tokens, 0 = off")
    g.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract per occurrence in recent tokens, 0 = off")
    g.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                   help="add BIAS to token ID's logit; repeatable")
    g.add_argument("--seed", type=int, default=None, help="makes sampling repeatable")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop before this text; repeatable")
    p.add_argument("--no-progress", action="store_true", help="no prefill progress bar")
    add_speculate_option(p)
    add_kv_dtype_option(p)
    add_ram_option(p)


def read_prompt(arg: str, stdin=None) -> str:
    """The prompt argument, or all of stdin for '-'."""
    if arg != "-":
        return arg
    stdin = stdin or sys.stdin
    logging.getLogger(__name__).info("reading the prompt from stdin")
    if stdin.isatty():
        print("forkv: reading the prompt from stdin (end it with Ctrl-D)", file=sys.stderr)
    text = stdin.read()
    if not text.strip():
        raise ValueError("the prompt from stdin is empty; pipe some text in or pass it as "
                         "an argument.")
    return text


def sampling_from_args(args):
    from forkv import SamplingParams

    bias = {}
    for item in args.logit_bias:
        tid, sep, value = item.partition("=")
        try:
            bias[int(tid)] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--logit-bias takes ID=BIAS (e.g. 42=-5), got {item!r}.")
    return SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        logit_bias=bias, seed=args.seed, stop=tuple(args.stop))


def run_generate(args) -> int:
    import forkv

    from .progress import PrefillBar

    text = read_prompt(args.prompt)
    params = sampling_from_args(args)  # bad settings fail before the model loads
    prompt = text
    if args.chat:
        prompt = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": text}]
    engine = forkv.load(args.model, chat_template=getattr(args, "chat_template", None),
                        speculate=getattr(args, "speculate", None),
                        kv_dtype=getattr(args, "kv_dtype", None),
                        ram=getattr(args, "ram", None))
    event, last = None, None  # the last character printed
    try:
        with PrefillBar(force=False if args.no_progress else None) as bar:
            for event in engine.stream(prompt, params, progress=bar):
                bar.close()  # the first token ends the prefill
                print(event.text, end="", flush=True)
                last = event.text[-1:] or last
    finally:
        engine.close()
        if last not in (None, "\n"):  # end the text's line (interrupted too): `> file` ends
            print(flush=True)           # in exactly one newline, as a shell tool's output does
    if last is None:
        print(flush=True)  # an empty completion is still one (empty) line
    t = event.timings
    print(f"[{event.finish_reason}] prompt {t.prompt_tokens} tok ({t.reused_tokens} restored), "
          f"prefill {t.prefill_tps:.0f} tok/s, decode {t.decode_tps:.1f} tok/s, first token "
          f"{t.first_token_s * 1000:.0f} ms" + (
              f", drafted {t.drafted_tokens} accepted {t.accepted_tokens}"
              if t.drafted_tokens else ""), file=sys.stderr)
    return 0
