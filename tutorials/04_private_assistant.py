"""Tutorial 4: a private assistant that resumes after a restart from an encrypted store.

What it shows:
- a persistent checkpoint store: `StoreSettings(persist_path=..., passphrase=...)`. Every
  checkpoint is sealed with AES-256-GCM under a key derived from your passphrase before it
  touches the disk; the index is sealed too. Nothing in the file is readable without it;
- saving the conversation tree (`session.save`) and loading it after a restart
  (`session.load`), which also checks that the tree was made with the same model;
- the restart itself, twice: closing the session and opening a new one on the same folder,
  then a brand-new Python process doing the same. Both restore the earlier turns' prompt from
  the encrypted file instead of computing it again;
- a wrong passphrase is refused with a clear error before anything is written.

The tree file holds the conversation as plain JSON (the app's data, not forkv's checkpoints):
it is written 0600 inside a 0700 folder; encrypt it too if your threat model needs that.

Run:  python tutorials/04_private_assistant.py [MODEL] [--folder DIR]
      (default model demo:qwen3_5:tiny; default folder: a fresh temporary one, removed after)
Passphrase: $FORKV_PASSPHRASE, else a demo passphrase (never do that for real data).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import forkv
from forkv.security import StoreSettings, WrongKeyError

NOTES = ("My notes, keep them private: dentist on Tuesday 9:30; call Sam about the lease; "
         "the router password is on the fridge; renew passport before June. ") * 8


def settings(folder: Path, passphrase: str) -> StoreSettings:
    # Closing the session writes the RAM tier's checkpoints into the encrypted file too, so
    # all of them are there after a restart. Other FORKV_* variables (e.g.
    # FORKV_DISK_BUDGET) still apply; these keywords win over them.
    return StoreSettings.from_env(persist_path=str(folder / "checkpoints.fkv"),
                                  passphrase=passphrase, handle_signals=False)


def save_tree(session: forkv.Session, path: Path) -> None:
    session.save(path)
    path.chmod(0o600)


def turn(session: forkv.Session, question: str, label: str) -> None:
    """Ask `question` after the latest answer (or start the conversation) and report."""
    leaves = [n for n in session.tree.leaves() if n.kind == "final"]
    if leaves:
        user = leaves[-1].user(question)
    else:
        user = session.system("You are my private assistant. " + NOTES).user(question)
    answer = user.final({"max_tokens": 16})
    session.run(answer)
    s = answer.result.stats
    print(f"{label:<28} reused {s.tokens_reused:>5}  computed {s.tokens_computed:>5}  "
          f"generated {s.tokens_generated:>3}  ({len(session.tree)} nodes)")


def resume(model: str, folder: Path, passphrase: str, question: str, label: str) -> None:
    with forkv.Session(model, settings=settings(folder, passphrase)) as session:
        session.load(folder / "tree.json")  # refuses a tree made with another model
        turn(session, question, label)
        save_tree(session, folder / "tree.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="demo:qwen3_5:tiny")
    ap.add_argument("--folder", type=Path, default=None)
    ap.add_argument("--resume", action="store_true", help="(used by the restart step)")
    args = ap.parse_args()
    passphrase = os.environ.get("FORKV_PASSPHRASE") or "correct horse battery staple"
    if args.resume:  # the new process of step 4
        resume(args.model, args.folder, passphrase, "Anything due this week?",
               "4. new process, resumed:")
        return

    folder = args.folder or Path(tempfile.mkdtemp(prefix="forkv-assistant-"))
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        # 1. First run: a conversation whose prompt spans several blocks.
        with forkv.Session(args.model, settings=settings(folder, passphrase)) as session:
            turn(session, "What is on my list for Tuesday?", "1. first run:")
            save_tree(session, folder / "tree.json")
        # closing wrote the sealed index; the process could exit here.

        # 2. A wrong passphrase: refused before anything is read or written.
        try:
            forkv.Session(args.model, settings=settings(folder, "not my passphrase"))
        except WrongKeyError as e:
            print(f"2. wrong passphrase refused: {e}")

        # 3. Restart in this process: a new session on the same folder.
        resume(args.model, folder, passphrase, "Who do I need to call?", "3. restarted session:")

        # 4. Restart for real: a new Python process.
        out = subprocess.run([sys.executable, __file__, args.model, "--folder", str(folder),
                              "--resume"], check=False, capture_output=True, text=True)
        print(out.stdout, end="")
        if out.returncode != 0:
            sys.exit(f"the resumed process failed:\n{out.stderr}")
        names = sorted(p.name for p in folder.iterdir())
        print(f"folder {folder}: {', '.join(names)} (checkpoints encrypted)")
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
