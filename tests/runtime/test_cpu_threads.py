"""CPU serving under contention: the OpenMP environment ``engine serve`` sets before torch loads
(kept when the user set their own), and the OpenMP team that follows the free cores."""

from __future__ import annotations

import types

import pytest

from engine.cli import omp
from engine.runtime import cpu_threads


def test_omp_default_is_set_when_unset():
    env: dict[str, str] = {"PATH": "/bin"}
    added = omp.apply_omp_defaults(env)
    assert added == omp.DEFAULTS and env == {"PATH": "/bin", **omp.DEFAULTS}


@pytest.mark.parametrize("user", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "infinite"},
                                  {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "5"}])
def test_a_users_own_wait_setting_is_kept(user):
    env = dict(user)
    assert omp.apply_omp_defaults(env) == {} and env == user


def test_engine_serve_sets_it_before_the_server_loads(monkeypatch):
    """``engine serve`` applies the defaults before it imports the server (and torch)."""
    import os

    from engine.cli.main import main

    env = {k: v for k, v in os.environ.items() if k not in omp.WAIT_VARIABLES}
    monkeypatch.setattr(os, "environ", env)  # a copy: nothing leaks into this process
    seen = {}

    def fake_run(argv):
        seen.update({v: os.environ.get(v) for v in omp.WAIT_VARIABLES})
        return 0

    monkeypatch.setitem(__import__("sys").modules, "engine.cli.serve",
                        types.SimpleNamespace(run=fake_run))
    assert main(["serve"]) == 0
    assert seen == {v: omp.DEFAULTS.get(v) for v in omp.WAIT_VARIABLES}
    env.pop("GOMP_SPINCOUNT")
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    assert main(["serve"]) == 0 and seen == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}
    env["GOMP_SPINCOUNT"] = "123"
    assert main(["serve"]) == 0 and seen["GOMP_SPINCOUNT"] == "123"


class FakeTorch:
    def __init__(self, n: int):
        self.n, self.calls = n, []

    def get_num_threads(self) -> int:
        return self.n

    def set_num_threads(self, n: int) -> None:
        self.calls.append(n)
        self.n = n


def sizer(monkeypatch, cpus: int = 2, threads: int = 2) -> cpu_threads.CpuThreads:
    t = cpu_threads.CpuThreads(max_threads=threads, period_s=0.0)
    t.cpus, t.enabled, t._torch = set(range(cpus)), True, FakeTorch(threads)
    return t


def test_team_size_follows_the_free_cores_with_hysteresis(monkeypatch):
    t = sizer(monkeypatch)
    assert [t.want(o) for o in (0.0, 0.4, 0.6, 1.0, 1.7)] == [2, 2, 1, 1, 1]
    t.threads = 1  # growing back needs a clearly free core
    assert [t.want(o) for o in (1.0, 0.4, 0.2, 0.0)] == [1, 1, 2, 2]
    big = sizer(monkeypatch, cpus=16, threads=2)  # many cores, few busy: keep the team
    assert big.want(10.0) == 2 and big.want(15.0) == 1


def test_update_sets_the_thread_count_from_other_processes_cpu_time(monkeypatch):
    t = sizer(monkeypatch)
    clock = {"wall": 0.0, "busy": 0.0, "mine": 0.0}
    monkeypatch.setattr(cpu_threads, "_busy_seconds", lambda cpus: clock["busy"])
    monkeypatch.setattr(cpu_threads.time, "monotonic", lambda: clock["wall"])
    monkeypatch.setattr(cpu_threads.time, "process_time", lambda: clock["mine"])

    def tick(busy: float, mine: float) -> int:
        clock["wall"] += 1.0
        clock["busy"] += busy
        clock["mine"] += mine
        return t.update()

    assert t.update() == 2                 # first sample: nothing to compare yet
    assert tick(2.0, 2.0) == 2             # only us
    assert tick(2.0, 1.0) == 1             # another process took a core
    assert tick(2.0, 1.0) == 1
    assert tick(1.0, 1.0) == 2             # it left
    assert t._torch.calls == [1, 2]


def test_for_device(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(cpu_threads.ENV, raising=False)
    assert cpu_threads.for_device(types.SimpleNamespace(type="cuda")) is None
    monkeypatch.setenv(cpu_threads.ENV, "fixed")
    assert cpu_threads.for_device(types.SimpleNamespace(type="cpu")) is None
    monkeypatch.delenv(cpu_threads.ENV)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads.for_device(types.SimpleNamespace(type="cpu")) is None
