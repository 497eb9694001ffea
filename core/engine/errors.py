"""User-facing errors: each is one line, and exit status 2 on the command line."""


class EngineError(Exception):
    """Base of errors reported to the user as one line."""


class PluginError(EngineError):
    """A plugin cannot be found, selected, loaded or called."""


class NoAnswerError(PluginError):
    """A plugin's family hook returned nothing (e.g. a model-config parser that does not
    recognise the path)."""


class ConfigError(EngineError):
    """Bad command line or config file."""
