"""Errors a user can act on. Each maps to its own exit code; the CLI prints the message on one line."""


class ConvertError(Exception):
    exit_code = 1


class UsageError(ConvertError):
    """Options that do not go together, or a malformed value the option parser could not catch."""

    exit_code = 2


class InputError(ConvertError):
    """The source checkpoint or its config is missing, unreadable or not what the model expects."""

    exit_code = 3


class MappingError(ConvertError):
    """A mapping file is malformed, or its rules do not account for every key and leaf exactly once."""

    exit_code = 4


class ValidationError(ConvertError):
    """The converted model does not reproduce the reference within tolerance."""

    exit_code = 5


class OutputError(ConvertError):
    """The output location exists (without --force) or cannot be written."""

    exit_code = 6
