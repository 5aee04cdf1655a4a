"""Slow processes down to a share of one core, as a weak machine would: a kernel CPU quota where this process
may set one, else SIGSTOP and SIGCONT from a thread (as cpulimit does)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

# cgroup v1 cpu hierarchies, then the v2 one; a v2 tree takes a quota only where its root already hands the
# cpu controller down (nothing here changes the machine's own cgroup setup).
V1_CPU_ROOTS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"))
V2_ROOT = Path("/sys/fs/cgroup")
MIN_QUOTA_US = 1000  # the kernel's smallest CFS quota


class QuotaGroup:
    """A cgroup of its own holding the processes under a CFS quota; the kernel keeps them to it whatever the
    load, where signals sent from a thread let them run on while that thread waits for a core."""

    def __init__(self, root: Path, group: Path) -> None:
        self.root = root
        self.group = group

    @classmethod
    def make(cls, pids: list[int], share: float, period_s: float) -> QuotaGroup | None:
        """The group with pids moved into it, or None where no cpu cgroup can be made (not root, no
        controller)."""
        period_us = round(period_s * 1_000_000)
        quota_us = max(MIN_QUOTA_US, round(period_us * share))
        name = f"detq-throttle-{os.getpid()}-{time.monotonic_ns()}"
        for root in V1_CPU_ROOTS:
            if (root / "cpu.cfs_quota_us").exists():
                settings = {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota_us)}
                found = cls._try(root, root / name, settings, pids)
                if found is not None:
                    return found
        subtree = V2_ROOT / "cgroup.subtree_control"
        if subtree.exists() and "cpu" in subtree.read_text().split():
            return cls._try(V2_ROOT, V2_ROOT / name, {"cpu.max": f"{quota_us} {period_us}"}, pids)
        return None

    @classmethod
    def _try(cls, root: Path, group: Path, settings: dict[str, str], pids: list[int]) -> QuotaGroup | None:
        try:
            group.mkdir()
        except OSError:
            return None
        made = cls(root, group)
        try:
            for name, value in settings.items():
                (group / name).write_text(value)
            for pid in pids:
                (group / "cgroup.procs").write_text(str(pid))
        except OSError:
            made.release()
            return None
        return made

    def release(self) -> None:
        """Every process back in the root group, and the group removed."""
        for _ in range(50):
            try:
                held = (self.group / "cgroup.procs").read_text().split()
            except OSError:
                return  # already gone
            for pid in held:
                try:
                    (self.root / "cgroup.procs").write_text(pid)
                except OSError:
                    pass  # exited meanwhile
            try:
                self.group.rmdir()
                return
            except OSError:
                time.sleep(0.02)  # a process still leaving


class Throttle:
    """The processes run at `share` of one core for as long as the context lasts: under a CPU quota where
    one can be set (the kernel enforces it, however busy the machine), else SIGSTOP for most of every
    period and SIGCONT for the share. Signals sent from a thread hold only while that thread wakes on time:
    on a loaded machine a 3% share ran at about 17%."""

    def __init__(self, pids: list[int], share: float, period_s: float = 0.1) -> None:
        self.pids = pids
        self.share = share
        self.period_s = period_s
        self.run_s = period_s * share
        self.stop_s = period_s - self.run_s
        self.quota: QuotaGroup | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._cycle, daemon=True)

    def _signal(self, sig: signal.Signals) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _cycle(self) -> None:
        while not self._stop.is_set():
            self._signal(signal.SIGSTOP)
            time.sleep(self.stop_s)
            self._signal(signal.SIGCONT)
            time.sleep(self.run_s)

    def __enter__(self) -> Throttle:
        self.quota = QuotaGroup.make(self.pids, self.share, self.period_s)
        if self.quota is None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.quota is not None:
            self.quota.release()
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._signal(signal.SIGCONT)
