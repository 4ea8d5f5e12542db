"""User-facing errors: one clear message (what, where, how to fix), no traceback from the CLI."""


class UserError(Exception):
    """Bad input from the user (file, field, option). The CLI prints the message and exits with code 2."""
