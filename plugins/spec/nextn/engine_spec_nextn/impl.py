"""NEXTN: EAGLE's machinery; the checkpoint decides between an EAGLE head and an MTP module."""

from __future__ import annotations

from typing import Any

from engine.api import hookimpl
from engine.api.speculative import Proposer, SpecContext

from engine_spec_eagle.impl import build


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    return build(config, context, "mtp")
