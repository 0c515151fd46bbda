"""The executor's expected failures: each carries the one line a user should read."""


class ConfigError(ValueError):
    """The run is misconfigured (sizes, model, world size); found before any communication."""


class PeerError(RuntimeError):
    """A peer died or stopped sending; the message names this rank and the action it waited on."""
