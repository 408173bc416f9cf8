"""The package surface: __all__ resolves, and only stdlib + cryptography are imported."""

import ast
import pathlib
import sys

import forkv.security
import pytest

ALLOWED = {"cryptography"}


def test_all_names_resolve():
    names = set(forkv.security.__all__)
    assert {"BlobStore", "StoreSettings", "StoreStats", "Blob", "ForkvWarning"} <= names
    assert all(getattr(forkv.security, name) is not None for name in names)


def test_imports_only_stdlib_and_cryptography():
    folder = pathlib.Path(forkv.security.__file__).parent
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                if node.module == "forkv.errors":
                    continue  # the error root: a leaf module of the standard library only
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                ok = root in sys.stdlib_module_names or root in ALLOWED or root == "__future__"
                assert ok, f"{path.name} imports {root}"


def test_readme_example_runs(tmp_path, monkeypatch):
    import re

    monkeypatch.setenv("FORKV_DISK_DIR", str(tmp_path))
    readme = pathlib.Path(forkv.security.__file__).parent / "README.md"
    if not readme.exists():
        pytest.skip("README.md is not installed with the package (non-editable install)")
    code = re.search(r"```python\n(.*?)```", readme.read_text(), re.DOTALL).group(1)
    exec(compile(code, str(readme), "exec"), {})  # noqa: S102 - our own doc example
    assert list(tmp_path.iterdir()) == []
