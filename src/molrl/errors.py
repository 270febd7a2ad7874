"""Errors molrl reports to the user as one clear line (file, record, fix) instead of a traceback."""


class MolrlError(Exception):
    """A user-facing error: bad input, bad config, missing file. The message says what to do."""


class ConfigError(MolrlError, ValueError):
    """A config key is unknown, mistyped or malformed; the message says where and how to fix it."""


class DataError(MolrlError):
    """A record in an input file is malformed; the message names the file, the line and the fix."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
