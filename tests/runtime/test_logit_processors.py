"""Custom logit processors: registered by name (built in, or an ``engine.logit_processors``
entry point), chosen by a request, run over their rows alone; serialized code never runs."""

from __future__ import annotations

import json
from importlib import metadata
from types import SimpleNamespace

import pytest
import torch

from engine.errors import ConfigError
from engine.runtime import logit_processors as lp
from engine.runtime.sampling import InvalidParam


class OnlyEven:
    def __call__(self, logits, params):
        logits[:, 1::2] = float("-inf")
        return logits


def _entry_points(*pairs):
    eps = [metadata.EntryPoint(name, value, lp.ENTRY_POINT_GROUP) for name, value in pairs]
    return lambda group: [e for e in eps if e.group == group]


def test_installed_processors_join_the_built_in_ones(monkeypatch):
    monkeypatch.setattr(lp.metadata, "entry_points",
                        _entry_points(("only_even", f"{__name__}:OnlyEven")))
    found = lp.load_processors()
    assert set(found) == {"disallowed_tokens", "only_even"}
    assert isinstance(found["only_even"], OnlyEven), "a class is instantiated once"
    monkeypatch.setattr(lp.metadata, "entry_points",
                        _entry_points(("disallowed_tokens", f"{__name__}:OnlyEven")))
    with pytest.raises(ConfigError, match="already taken"):
        lp.load_processors()
    monkeypatch.setattr(lp.metadata, "entry_points", _entry_points(("x", "no_such_module:X")))
    with pytest.raises(ConfigError, match="does not load"):
        lp.load_processors()


def test_choose_names_and_refuses():
    procs = dict(lp.BUILTIN, only_even=OnlyEven())
    chosen = lp.choose(json.dumps({"callable": "only_even"}), {"k": 1}, procs, 100)
    assert chosen.name == "only_even" and dict(chosen.params) == {"k": 1}
    assert lp.choose({"callable": "only_even"}, None, procs, 100).params == {}
    assert lp.choose(None, None, None, 100) is None
    cases = [
        (({"callable": "only_even"}, None, None), "custom_logit_processor", "off"),
        ((json.dumps({"callable": "8004" * 30}), None, procs), "custom_logit_processor",
         "serialized Python code"),
        (({"callable": "nope"}, None, procs), "custom_logit_processor",
         "registered: disallowed_tokens, only_even"),
        (({"fn": "only_even"}, None, procs), "custom_logit_processor", '{"callable": NAME}'),
        (({"callable": "only_even"}, [1], procs), "custom_params", "JSON object"),
        (({"callable": "disallowed_tokens"}, {"token_ids": [100]}, procs), "custom_params",
         "below 100"),
        ((None, {"token_ids": [1]}, procs), "custom_params", "names none"),
    ]
    for (value, params, processors), field, words in cases:
        with pytest.raises(InvalidParam, match=words.replace("{", r"\{")) as err:
            lp.choose(value, params, processors, 100)
        assert err.value.param == field


def test_apply_groups_rows_by_processor_and_isolates_failures():
    class Boom:
        def __call__(self, logits, params):
            raise RuntimeError("boom")

    procs = dict(lp.BUILTIN, boom=Boom())
    rows = [SimpleNamespace(logit_processor=lp.choose({"callable": name}, params, procs, 6))
            for name, params in (("disallowed_tokens", {"token_ids": [0, 2]}), ("boom", None),
                                 ("disallowed_tokens", {"token_ids": [5]}))]
    logits, errors = torch.zeros(3, 6), {}
    lp.apply(logits, rows, [0, 1, 2], errors)
    assert list(errors) == [1] and "boom" in str(errors[1])
    inf = float("-inf")
    assert logits[0].tolist() == [inf, 0, inf, 0, 0, 0]
    assert logits[2].tolist() == [0, 0, 0, 0, 0, inf]
    assert logits[1].tolist() == [0.0] * 6
