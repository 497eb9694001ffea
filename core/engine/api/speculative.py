"""The speculative family's interface (hook ``engine_create_speculative_proposer``).

The family is declared and its plugins listed; the scheduler does not yet run a verify step, so
choosing one at ``engine serve`` is refused until it does. A proposer only *proposes*: the core
scores the drafts in one target forward and accepts the longest prefix the target agrees with
(greedy: token-for-token equal to decoding without drafts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass
class Draft:
    """Draft tokens for one request: a chain (``parents[i] == i - 1``) or a tree (``parents``
    index earlier nodes; ``-1`` is the verified last token)."""

    token_ids: list[int]
    parents: list[int]


class Proposer(ABC):
    """Proposes up to ``num_draft_tokens`` tokens per running request each decode step."""

    @abstractmethod
    def propose(self, requests: Sequence[Any]) -> list[Draft]:
        """One :class:`Draft` per request (possibly empty), from each request's prompt and
        output so far (``origin_input_ids``, ``output_ids``)."""

    def on_accept(self, request: Any, accepted: int) -> None:
        """Told how many of the request's last drafts were accepted (default: nothing)."""
