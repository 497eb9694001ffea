"""User-facing errors: each is one line, and exit status 2 on the command line."""


class EngineError(Exception):
    """Base of errors reported to the user as one line."""


class PluginError(EngineError):
    """A plugin cannot be found, selected, loaded or called."""


class ConfigError(EngineError):
    """Bad command line or config file."""
