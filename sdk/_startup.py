"""The first thing `import forkv` runs: a Ctrl-C while the CLI starts is one line and exit 130.

Imports only what the interpreter has loaded before any program runs (`os`, `sys` and the C
module `_signal`), so the window in which a Ctrl-C can still raise a traceback from an import
is this module's own loading. `interrupts` (which needs `signal`, `logging`, `threading`: ~10 ms
of imports on a loaded machine, where a Ctrl-C once landed on CI) takes over from here.
"""

import _signal
import os
import sys

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C
_MESSAGE = b"forkv: interrupted\n"


def is_cli() -> bool:
    """True in the `forkv` console script and in `python -m forkv.cli`."""
    argv = getattr(sys, "orig_argv", None) or sys.argv
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1] == "forkv.cli"
    return any(os.path.basename(a) == "forkv" for a in argv[:2])


def leave_now(signum=None, frame=None) -> None:
    os.write(2, _MESSAGE)
    os._exit(INTERRUPTED)


def guard() -> None:
    """In the CLI process only, and only over Python's own handler: a Ctrl-C before the CLI
    takes over exits 130 with one line instead of a KeyboardInterrupt traceback."""
    try:
        if is_cli() and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
            _signal.signal(_signal.SIGINT, leave_now)
    except (ValueError, OSError, IndexError):  # not the main thread, or no argv: leave it
        pass
