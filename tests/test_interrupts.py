"""Ctrl-C and exit never abort or crash: `forkv generate` and `forkv serve` interrupted at
random points while busy processes load the cores, and programs that run mlx on the main
thread or a thread of their own beside the engine (sdk/interrupts.py, engine/request/worker.py)."""

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server_proc import default_sigint, free_port

_BESIDE_THE_ENGINE = """
import sys, threading
import forkv
import mlx.core as mx
engine = forkv.load("demo:gemma3:tiny")
x = mx.array([[2, 100, 200, 300]])
forward = lambda: mx.eval(engine.lm.model(x))  # as a perplexity loop does
if sys.argv[1] == "main":
    forward()
else:
    t = threading.Thread(target=forward)
    t.start()
    t.join()
engine.generate("Hello", max_tokens=4)
engine.close()
print("last line")
"""


@pytest.mark.slow  # (2-5 s: out of the fast suite, which must stay under 5 minutes)
@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_forward_beside_the_engine_exits_cleanly(where):
    # The model's compiled helpers ran on this thread and then on the engine thread: mlx
    # forgot this thread's compile-cache entries, which then died after the interpreter did
    # (a segfault at exit, 4 of 4 runs), until the exit hook cleared them.
    p = subprocess.run([sys.executable, "-c", _BESIDE_THE_ENGINE, where], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "last line", (p.returncode, p.stderr)


def _interrupt(argv: list[str], after_s: float, timeout: float = 120) -> tuple[int, str]:
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=default_sigint)
    time.sleep(after_s)
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        return -999, err.decode(errors="replace")
    return p.returncode, err.decode(errors="replace")


def _forkv_dirs() -> tuple[str, ...]:
    """The folders forkv's own modules run from (an editable install runs them from the
    checkout's sdk/, engine/, graph/ and security/, not from a folder named forkv)."""
    import forkv.engine
    import forkv.graph
    import forkv.security

    return tuple(os.path.dirname(m.__file__) + os.sep
                 for m in (forkv, forkv.engine, forkv.graph, forkv.security))


def _loading_the_guard(path: str, line: int, ours: tuple[str, ...]) -> bool:
    """A frame of forkv's that runs before its guard can be in: `forkv/__init__.py` up to the
    `_startup.guard()` call (importing `_startup` is the one window left) or `_startup` itself."""
    name = os.path.basename(path)
    if os.path.dirname(path) + os.sep != ours[0]:  # forkv's package folder comes first
        return False
    return name == "_startup.py" or name == "__init__.py" and line <= _GUARD_LINE


_GUARD_LINE = next(i for i, text in enumerate(Path(__file__).parent.parent.joinpath(
    "sdk", "__init__.py").read_text().splitlines(), 1) if text.startswith("_startup.guard()"))


def _before_forkv(rc: int, err: str, ours: tuple[str, ...] | None = None) -> bool:
    """The Ctrl-C landed before forkv's first line installed its guard: Python itself was
    still starting (importing `site`: it aborts with exit 1) or finding the `forkv` package
    (runpy, importlib, an editable install's finder, pathlib: killed by the signal). Once the
    guard is in, a Ctrl-C exits 130 without a traceback, and one raised inside a library forkv
    called has forkv's frames on it; so a KeyboardInterrupt with none of forkv's frames is
    Python's own behaviour, which no code of forkv's can run early enough to change."""
    ours = _forkv_dirs() if ours is None else ours
    frames = re.findall(r'File "([^"]*)", line (\d+)', err)
    if not err.rstrip().endswith("KeyboardInterrupt") or not frames:
        return False
    if any(f.startswith(ours) and not _loading_the_guard(f, int(n), ours)
           for f, n in frames):
        return False
    return (rc == -signal.SIGINT
            or rc == 1 and err.startswith("Fatal Python error: init_import_site"))


def _busy(n: int) -> list[subprocess.Popen]:
    loop = "import time\nt = time.monotonic() + 900\nwhile time.monotonic() < t:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]


@pytest.mark.slow  # ~40 interrupted processes beside two busy loops (several minutes)
def test_random_interrupts_under_load_never_abort(tmp_path):
    env_cli = [sys.executable, "-m", "forkv.cli"]
    generate = env_cli + ["generate", "the cat sat on the mat. " * 100, "--model",
                          "demo:gemma3:small", "--max-tokens", "64", "--no-progress"]
    rng = random.Random(32)
    tries = int(os.environ.get("FORKV_INTERRUPT_TRIES", "20"))
    codes: dict[str, list[int]] = {"generate": [], "serve": []}
    bad = []
    early = 0
    hogs = _busy(2)
    try:
        for i in range(tries):
            for name in codes:
                argv = generate if name == "generate" else env_cli + [
                    "serve", "--model", "demo:gemma3:tiny", "--port", str(free_port())]
                # start-up (imports, ~1-2 s under load), model load, prefill and decode
                rc, err = _interrupt(argv, rng.uniform(0.05, 6.0 if name == "serve" else 8.0))
                codes[name].append(rc)
                if _before_forkv(rc, err):
                    early += 1
                elif rc not in (0, 130) or "Traceback" in err or "terminate called" in err:
                    bad.append((name, i, rc, err[-1500:]))
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print({name: {rc: rcs.count(rc) for rc in set(rcs)} for name, rcs in codes.items()},
          "before forkv:", early)
    assert not bad, bad
    assert early <= tries // 4, f"{early} of {2 * tries} interrupts landed before forkv started"


def test_only_interrupts_before_forkv_are_set_aside():
    early = ('Traceback (most recent call last):\n  File "<frozen runpy>", line 189, in '
             '_run_module_as_main\n  File "<frozen importlib._bootstrap_external>", line 147, '
             'in _path_stat\nKeyboardInterrupt\n')
    in_forkv = early.replace('  File "<frozen importlib._bootstrap_external>"',
                             '  File "/x/forkv/sdk/cli.py", line 3, in <module>\n'
                             '  File "<frozen importlib._bootstrap_external>"')
    assert _before_forkv(-signal.SIGINT, early)
    assert not _before_forkv(-signal.SIGINT, in_forkv, ours=("/x/forkv/sdk/",))
    assert not _before_forkv(130, early) and not _before_forkv(-signal.SIGINT, "")
    # A Ctrl-C while the interpreter imports `site` (seen on a clean-clone CI run, 6 ms in)
    in_site = ("Fatal Python error: init_import_site: Failed to import the site module\n"
               "Python runtime state: initialized\nTraceback (most recent call last):\n"
               '  File "<frozen site>", line 616, in <module>\n'
               '  File "/v/site-packages/_virtualenv.py", line 287, in <module>\n'
               '  File "<frozen importlib._bootstrap>", line 1165, in _find_and_load\n'
               "KeyboardInterrupt\n")
    assert _before_forkv(1, in_site)
    assert not _before_forkv(1, in_site.replace("/v/site-packages/_virtualenv.py",
                                                "/x/forkv/sdk/cli.py"), ours=("/x/forkv/sdk/",))
    # ... or while an editable install's finder looks the package up (a clean-clone CI run)
    finder = ('Traceback (most recent call last):\n  File "<frozen runpy>", line 189, in '
              '_run_module_as_main\n  File "/v/site-packages/__editable___forkv_finder.py", '
              'line 40, in find_spec\n  File "/py/lib/python3.11/pathlib.py", line 1013, in '
              'stat\n    return os.stat(self, follow_symlinks=follow_symlinks)\n'
              "KeyboardInterrupt\n")
    assert _before_forkv(-signal.SIGINT, finder, ours=("/ci/sdk/", "/ci/engine/"))
    assert not _before_forkv(-signal.SIGINT, finder.replace(
        "/v/site-packages/__editable___forkv_finder.py", "/ci/engine/engine.py"),
        ours=("/ci/sdk/", "/ci/engine/"))
    assert all(os.path.isdir(d) for d in _forkv_dirs())
    assert not _before_forkv(1, "Fatal Python error: init_import_site\nKeyboardInterrupt\n")
    # ... or while forkv's package loads the module that installs the guard (a clean-clone CI
    # run: `from . import _startup`, the line before `_startup.guard()`)
    ours = ("/ci/sdk/", "/ci/engine/")
    loading = ('Traceback (most recent call last):\n  File "<frozen runpy>", line 189, in '
               '_run_module_as_main\n  File "/ci/sdk/__init__.py", line {}, in <module>\n'
               '    from . import _startup\nKeyboardInterrupt\n')
    assert _before_forkv(-signal.SIGINT, loading.format(_GUARD_LINE - 1), ours=ours)
    assert not _before_forkv(-signal.SIGINT, loading.format(_GUARD_LINE + 1), ours=ours)
    assert not _before_forkv(-signal.SIGINT, loading.format(_GUARD_LINE - 1).replace(
        "/ci/sdk/__init__.py", "/ci/engine/__init__.py"), ours=ours)


def test_a_ctrl_c_swallowed_in_a_del_is_raised_again_before_serving(monkeypatch):
    # A regex compiled while a tokenizer loads can take the KeyboardInterrupt in its __del__,
    # where Python prints "Exception ignored" and drops it: `forkv serve` then ran on.
    from forkv import interrupts

    monkeypatch.setattr(interrupts, "_pending", False)
    interrupts.check()  # nothing pending: nothing raised

    class Swallows:
        def __del__(self):
            interrupts._interrupt()

    Swallows()  # the Ctrl-C lands in a __del__ and is lost there
    with pytest.raises(KeyboardInterrupt):
        interrupts.check()


def test_a_ctrl_c_taken_by_a_del_prints_no_traceback(monkeypatch, capsys):
    # Python printed "Exception ignored in: <function Group.__del__ ...>" and a traceback on the
    # serve log before the one "forkv: interrupted" line; other unraisable errors still print.
    import gc

    from forkv import interrupts

    def info(exc):  # the hook's argument as Python builds it, from a __del__ that raises
        caught, hook = [], sys.unraisablehook
        sys.unraisablehook = caught.append

        class Raises:
            def __del__(self):
                raise exc

        try:
            Raises()
            gc.collect()
        finally:
            sys.unraisablehook = hook
        return caught[0]

    monkeypatch.setattr(interrupts, "_pending", True)
    interrupts._unraisable(info(KeyboardInterrupt()))
    assert capsys.readouterr().err == ""
    interrupts._unraisable(info(ValueError("a real bug")))
    assert "a real bug" in capsys.readouterr().err


_FIRST_IMPORTS = """
import _signal, sys

seen = {}


class Watch:
    # records which SIGINT handler is in place when each of these modules starts importing
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in ("signal", "logging", "threading", "ctypes", "forkv.interrupts",
                    "forkv.arenas"):
            seen.setdefault(name, _signal.getsignal(_signal.SIGINT))
        return None


sys.meta_path.insert(0, Watch)
import forkv
guard = forkv._startup.leave_now
print(sorted(name for name, handler in seen.items() if handler is not guard))
print(sorted(seen))
"""


def test_the_startup_guard_is_in_place_before_any_slow_import(tmp_path):
    # A Ctrl-C 6 ms into `forkv serve` on a loaded CI machine landed in `signal`'s import of
    # `enum` from sdk/interrupts.py, before the guard, and printed a traceback.
    script = tmp_path / "forkv"  # a program named as the console script is a CLI process
    script.write_text(_FIRST_IMPORTS)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, preexec_fn=default_sigint)
    unguarded, watched = p.stdout.splitlines()[-2:]
    assert unguarded == "[]", (unguarded, p.stderr[-2000:])
    assert "'forkv.interrupts'" in watched and "'signal'" in watched
