"""EAGLE3: the EAGLE machinery of ``engine-spec-eagle`` with an EAGLE-3 head."""

from __future__ import annotations

from typing import Any

from engine.api import hookimpl
from engine.api.speculative import Proposer, SpecContext

from engine_spec_eagle.impl import build


@hookimpl
def engine_create_speculative_proposer(model_config: Any, config: Any, options: Any,
                                       context: SpecContext) -> Proposer:
    return build(config, context, "eagle3")
