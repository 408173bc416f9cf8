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


class ContextTooLong(GenerationError):
    """A prompt plus its max_tokens past the model's context (`check_context`)."""

    def __init__(self, prompt_tokens: int, max_tokens: int, limit: int, advice: str):
        self.prompt_tokens, self.max_tokens, self.limit = prompt_tokens, max_tokens, limit
        super().__init__(f"The prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) "
                         f"exceeds the model's context of {limit} tokens; {advice}.")


def check_context(lm, prompt_tokens: int, max_tokens: int,
                  advice: str = "shorten the prompt or lower max_tokens") -> None:
    """The one context check of every front door: `ContextTooLong` past the model's context."""
    if prompt_tokens + max_tokens > lm.context_length:
        raise ContextTooLong(prompt_tokens, max_tokens, lm.context_length, advice)


class NoChatTemplate(GenerationError):
    """Chat messages for a model that has no chat template (a base model) and was given none."""


class EngineClosed(ForkvError, RuntimeError):
    """A request reached an engine after `close()`."""
