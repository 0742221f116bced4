"""The one exception type for a mistake in what the user gave modwire.

A config value, a flag, a name, a tensor of the wrong shape, a file in the wrong format: modwire
raises :class:`UserError` (a ``ValueError``) with a message that names the key or argument, the
value given and what is allowed. The ``modwire`` command prints such an error on one line and
exits 2; any other exception is a bug in modwire and is shown with its traceback. A setting that
works but does less than it says warns with :class:`ConfigWarning` (one line from the command). The two
subclasses keep the built-in type a caller may already catch: an unknown name is also a
``KeyError``, a wrong argument type also a ``TypeError``.
"""
from __future__ import annotations


class UserError(ValueError):
    """A mistake in the user's input; the message says what was expected and what was given."""


class UnknownNameError(UserError, KeyError):
    """An unknown model, task, metric, prior or field name (also a ``KeyError``)."""

    def __str__(self) -> str:          # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UserTypeError(UserError, TypeError):
    """An argument of the wrong type (also a ``TypeError``)."""


class ConfigWarning(UserWarning):
    """A setting that does less in this run than it says (named, with what the run does instead)."""
