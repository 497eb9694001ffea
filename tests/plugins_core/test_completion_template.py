"""``--completion-template``: built-in fill-in-the-middle templates, JSON template files, and an
unknown name refused at parse time (exit status 2, naming the known templates)."""

from __future__ import annotations

import json

import pytest

from engine.cli.args import parse_config
from engine.errors import ConfigError
from engine.models.completion_templates import BUILTIN, load_completion_template
from engine.plugins.registry import Registry
from plugin_factory import engine

REGISTRY = Registry()


def test_builtin_templates_place_the_middle_marker():
    assert BUILTIN["star_coder"].format("def f(", "):") == \
        "<fim_prefix>def f(<fim_suffix>):<fim_middle>"
    assert BUILTIN["deepseek_coder"].format("a", "b") == \
        "<｜fim▁begin｜>a<｜fim▁hole｜>b<｜fim▁end｜>"
    assert BUILTIN["qwen_coder"].format("a", "b") == \
        "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>"


def test_a_json_template_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"fim_begin_token": "<B>", "fim_middle_token": "<M>",
                                "fim_end_token": "<E>", "fim_position": "MIDDLE"}))
    assert parse_config(["--completion-template", str(path)], REGISTRY).completion_template \
        == str(path)
    template = load_completion_template(str(path))
    assert (template.name, template.format("p", "s")) == ("mine", "<B>p<M>s<E>")
    path.write_text(json.dumps({"fim_begin_token": "<B>", "fim_position": "LEFT"}))
    with pytest.raises(ConfigError, match="fim_middle_token"):
        parse_config(["--completion-template", str(path)], REGISTRY)


def test_unknown_template_exits_2_naming_the_known_ones():
    out = engine("serve", "--completion-template", "nope_coder")
    assert out.returncode == 2
    assert out.stderr.strip() == ("engine serve: error: --completion-template nope_coder: not a "
                                  "built-in template (deepseek_coder, star_coder, qwen_coder) "
                                  "nor a JSON template file")
