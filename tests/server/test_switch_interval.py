"""The GIL switch interval the server sets: 0.5 ms on a GPU (the scheduler thread gets the GIL
back soon after a step's sync), Python's default on the CPU, ENGINE_GIL_SWITCH_US over both."""

import sys

from types import SimpleNamespace

import pytest

from engine.server.app import _set_switch_interval


def on(device: str) -> SimpleNamespace:
    """A runtime whose runner is on ``device``."""
    return SimpleNamespace(runner=SimpleNamespace(device=SimpleNamespace(type=device)))


@pytest.fixture(autouse=True)
def restore():
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_gpu_gets_half_a_millisecond_and_cpu_keeps_the_default(monkeypatch):
    monkeypatch.delenv("ENGINE_GIL_SWITCH_US", raising=False)
    sys.setswitchinterval(0.005)
    _set_switch_interval(on("cpu"))
    assert sys.getswitchinterval() == pytest.approx(0.005)
    _set_switch_interval(on("cuda"))
    assert sys.getswitchinterval() == pytest.approx(0.0005)


def test_the_environment_sets_it_and_a_bad_value_falls_back(monkeypatch, caplog):
    monkeypatch.setenv("ENGINE_GIL_SWITCH_US", "2000")
    _set_switch_interval(on("cpu"))
    assert sys.getswitchinterval() == pytest.approx(0.002)
    monkeypatch.setenv("ENGINE_GIL_SWITCH_US", "fast")
    _set_switch_interval(on("cuda"))
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert "ENGINE_GIL_SWITCH_US" in caplog.text
