"""Typed errors and warnings of the engine; each message says what was wrong and what to do."""

from __future__ import annotations


class ForkvWarning(UserWarning):
    """Something forkv could not do; it fell back to recomputing."""


class ModelLoadError(ValueError):
    """A model name or folder that cannot be loaded."""


class UnknownDemoModel(ModelLoadError):
    """A `demo:` name that names no built-in model."""


class GenerationError(ValueError):
    """Bad generation input (prompt, sampling settings)."""
