"""Process-level protections (issue 15, items 9-10): mlx's CPU kernel cache cannot be planted
by another user, opt-in hardening (no core dumps, not dumpable), key pages excluded from core
dumps, and a data file that can never be given a name."""

import ctypes
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from forkv.security import BlobStore, StoreSettings
from forkv.security.keys import MasterKey, Secret

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

PLANTED_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
  const char *path = getenv("FORKV_TEST_MARKER");
  FILE *f = path ? fopen(path, "w") : NULL;
  if (f) { fputs("planted code ran", f); fclose(f); }
}
void %s(int *shape, long long **strides, void **args) {}
"""
COMPILE = (
    "import mlx.core as mx\n"
    "f = mx.compile(lambda x: mx.exp(x) * 2 + 1)\n"
    "mx.eval(f(mx.ones(10, stream=mx.cpu)))\n"
)
FORKV_FIRST = "from forkv.engine.models import blas\nblas.activate()\n"  # what forkv processes do


def run_python(code: str, **env) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "FORKV_CACHE_DIR")}
    subprocess.run([sys.executable, "-c", code], env=dict(base, **env), check=True,
                   capture_output=True, timeout=120)  # fmt: skip


@linux
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to plant a kernel")
def test_another_user_cannot_plant_mlx_kernels(tmp_path):
    shared = tmp_path / "shared"  # stands for /tmp: anyone may create $TMPDIR/mlx first
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)
    marker = tmp_path / "marker"
    # The attacker runs the same mlx once to learn the kernel names, then swaps in their code.
    run_python(COMPILE, TMPDIR=str(shared), FORKV_CACHE_DIR=str(tmp_path / "theirs"))
    libs = list(shared.glob("mlx/*/cpu/lib*.so"))
    assert libs, "mlx compiled no CPU kernel: the test would prove nothing"
    for lib in libs:
        source = tmp_path / "planted.c"
        source.write_text(PLANTED_C % lib.name[3:-3])
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    # Plain mlx loads the planted object: the hole this guards against is real.
    run_python(COMPILE, TMPDIR=str(shared), FORKV_TEST_MARKER=str(marker),
               FORKV_CACHE_DIR=str(tmp_path / "theirs"))  # fmt: skip
    assert marker.read_text() == "planted code ran"
    marker.unlink()
    # A forkv process compiles into its own private folder and never looks at the shared one.
    ours = tmp_path / "cache"
    run_python(FORKV_FIRST + COMPILE, TMPDIR=str(shared), FORKV_TEST_MARKER=str(marker),
               FORKV_CACHE_DIR=str(ours))  # fmt: skip
    assert not marker.exists()
    assert list((ours / "tmp").glob("mlx/*/cpu/lib*.so"))
    assert os.stat(ours / "tmp").st_mode & 0o777 == 0o700


@linux
def test_private_tmpdir_keeps_python_tempfile_and_respects_a_private_one(tmp_path):
    code = textwrap.dedent(
        """
        import json, os, tempfile
        from forkv.security import prepare_process
        prepare_process()
        print(json.dumps([os.environ["TMPDIR"], tempfile.gettempdir()]))
        """
    )
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    env = dict(os.environ, TMPDIR=str(shared), FORKV_CACHE_DIR=str(tmp_path / "c"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout  # fmt: skip
    assert json.loads(out) == [str(tmp_path / "c" / "tmp"), str(shared)]
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # already ours alone: left as it is
    env["TMPDIR"] = str(private)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout  # fmt: skip
    assert json.loads(out) == [str(private), str(private)]


@linux
def test_harden_process_turns_off_core_dumps_and_debuggers():
    code = textwrap.dedent(
        """
        import ctypes, json, resource
        from forkv.security import harden_process
        report = harden_process()
        dumpable = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
        print(json.dumps([report.no_core_dumps, report.not_dumpable, report.keys_dontdump,
                          resource.getrlimit(resource.RLIMIT_CORE), dumpable]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout  # fmt: skip
    assert json.loads(out) == [True, True, True, [0, 0], 0]


def _vm_flags(address: int) -> list[str]:
    with open("/proc/self/smaps") as fh:
        lines = fh.read().splitlines()
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError("address not mapped")


@linux
def test_key_buffers_are_left_out_of_core_dumps():
    for holder in (MasterKey.make_ephemeral(), Secret(b"passphrase")):
        ptr = ctypes.c_char.from_buffer(holder._buf)
        address = ctypes.addressof(ptr)
        del ptr  # release the buffer export before wiping
        assert "dd" in _vm_flags(address)  # MADV_DONTDUMP
        holder.wipe()


@linux
def test_data_file_can_never_be_given_a_name(tmp_path):
    with BlobStore(StoreSettings.from_env({}, disk_dir=str(tmp_path))) as store:
        fd = store._file.fd
        target = os.path.join(store.folder, "named")
        # O_TMPFILE without O_EXCL can be linked into the folder through /proc/self/fd
        # (linkat with AT_SYMLINK_FOLLOW; os.link would call link(), which links the symlink).
        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, at_symlink_follow = -100, 0x400
        proc_path = f"/proc/self/fd/{fd}".encode()
        rc = libc.linkat(at_fdcwd, proc_path, at_fdcwd, target.encode(), at_symlink_follow)
        assert rc == -1 and ctypes.get_errno() == errno.ENOENT
        assert not os.path.exists(target)


def test_cli_harden_flag_hardens_before_the_command(tmp_path, monkeypatch, capsys):
    import forkv.security
    from forkv.cli import main

    calls = []
    monkeypatch.setattr(forkv.security, "harden_process", lambda: calls.append("hardened"))
    assert main(["--harden", "show", str(tmp_path / "missing.json")]) == 2
    assert calls == ["hardened"]
    assert main(["show", str(tmp_path / "missing.json")]) == 2
    assert calls == ["hardened"]  # opt-in only
