"""CPU serving under contention: the OpenMP team of the forward follows the cores other
processes leave free (engine.runtime.cpu_threads), and stays fixed where the user asked."""

from __future__ import annotations

import types

from engine.runtime import cpu_threads


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
