"""Where LM Studio keeps downloaded models on this machine.

LM Studio's home is `~/.lmstudio`, or the path written in `~/.lmstudio-home-pointer` when the
user moved it; its `settings.json` key `downloadsFolder` can move the models folder elsewhere
(default `<home>/models`, laid out `<org>/<name>/`). Older versions used
`~/.cache/lm-studio/models`. `LMSTUDIO_HOME` (forkv's own variable, for tests and unusual
setups) overrides the home. Knows paths only: never what a model folder holds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["lmstudio_home", "models_folders"]


def lmstudio_home() -> Path:
    """LM Studio's home folder (it need not exist)."""
    if os.environ.get("LMSTUDIO_HOME"):
        return Path(os.environ["LMSTUDIO_HOME"]).expanduser()
    pointer = Path.home() / ".lmstudio-home-pointer"
    try:
        text = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        text = ""
    return Path(text).expanduser() if text else Path.home() / ".lmstudio"


def models_folders() -> list[Path]:
    """The models folders that exist, the configured one first, then the legacy one."""
    home = lmstudio_home()
    folders = [_downloads_folder(home) or home / "models", home / "models",
               Path.home() / ".cache" / "lm-studio" / "models"]
    seen: list[Path] = []
    for folder in folders:
        if folder.is_dir() and folder not in seen:
            seen.append(folder)
    return seen


def _downloads_folder(home: Path) -> Path | None:
    try:
        settings = json.loads((home / "settings.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # no settings (or unreadable ones): LM Studio uses its default too
    value = settings.get("downloadsFolder") if isinstance(settings, dict) else None
    return Path(value).expanduser() if isinstance(value, str) and value else None
