"""Typed errors and warnings of the engine; each message says what was wrong and what to do."""

from __future__ import annotations


from forkv.errors import ForkvError, ForkvWarning

__all__ = ["EngineClosed", "ForkvWarning", "GenerationError", "ModelLoadError", "NoChatTemplate",
           "UnknownDemoModel"]


class ModelLoadError(ValueError, ForkvError):
    """A model name or folder that cannot be loaded."""


class UnknownDemoModel(ModelLoadError):
    """A `demo:` name that names no built-in model."""


class GenerationError(ValueError, ForkvError):
    """Bad generation input (prompt, sampling settings)."""


class NoChatTemplate(GenerationError):
    """Chat messages for a model that has no chat template (a base model) and was given none."""


class EngineClosed(ForkvError, RuntimeError):
    """A request reached an engine after `close()`."""
