"""``--moe-a2a-backend none``: all experts local, dispatch and combine are the identity."""

from typing import Any

from engine.api import ConfigError, hookimpl
from engine.api.moe import LocalAllToAll, MoEAllToAll


@hookimpl
def engine_create_moe_a2a(model_config: Any, config: Any, options: Any) -> MoEAllToAll:
    ep = getattr(config, "ep_size", 1) or 1
    if ep != 1:
        raise ConfigError(f"--moe-a2a-backend none keeps every expert on one rank; --ep-size "
                          f"{ep} needs an all-to-all backend")
    return LocalAllToAll()
