"""W real gradcompd processes peered on loopback, for the soak and chaos runs.

    with Cluster(work_dir, world=4, collective_timeout="30s") as cluster:
        cluster.wait_peers_up(60)
        cluster.target(0)            # "unix:<work_dir>/rank0.sock"
        cluster.kill(2); cluster.start(2)   # SIGKILL, then the same addresses
        cluster.rss_bytes(0), cluster.open_fds(0)

Clients reach their daemon on a unix socket (the default for local
trainers); peers talk over TCP on 127.0.0.1. The binary is copied into the
work directory first, so that a rebuild of bazel-bin during a long run does
not change (or remove) what a restart executes.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import time

from gradcomp import metrics, testing


def write_atomic(path: pathlib.Path, text: str) -> None:
    """Writes a small file that readers see whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_status_field(pid: int, field: str) -> int:
    """The first number of a /proc/PID/status line, e.g. VmRSS (in kB)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field} line")


def read_rss_bytes(pid: int) -> int:
    """VmRSS of a process, from /proc/PID/status."""
    return read_status_field(pid, "VmRSS") * 1024


def count_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Cluster:
    def __init__(self, work: pathlib.Path, world: int = 4,
                 collective_timeout: str = "30s", extra_args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        """`env`: variables added to the daemons' environment."""
        self.work = pathlib.Path(work)
        self.world = world
        self.collective_timeout = collective_timeout
        self.extra_args = list(extra_args)
        self.env = dict(os.environ, **(env or {}))
        self.binary = self.work / "gradcompd"
        shutil.copy2(testing.daemon_binary(), self.binary)
        self.peer_ports = [testing.free_port() for _ in range(world)]
        self.metrics_ports = [testing.free_port() for _ in range(world)]
        self.processes: list[subprocess.Popen | None] = [None] * world

    def target(self, rank: int) -> str:
        return f"unix:{self.work}/rank{rank}.sock"

    def metrics_url(self, rank: int) -> str:
        return f"http://127.0.0.1:{self.metrics_ports[rank]}/metrics"

    def log_path(self, rank: int) -> pathlib.Path:
        return self.work / f"gradcompd.{rank}.log"

    def start(self, rank: int) -> None:
        peers = ",".join(f"127.0.0.1:{p}" for p in self.peer_ports)
        socket = self.work / f"rank{rank}.sock"
        if socket.exists():
            socket.unlink()  # left behind by a SIGKILLed daemon
        with open(self.log_path(rank), "ab") as log:
            self.processes[rank] = subprocess.Popen(
                [str(self.binary), f"--rank={rank}", f"--world_size={self.world}",
                 f"--peers={peers}", f"--listen={self.target(rank)}",
                 f"--metrics_listen=127.0.0.1:{self.metrics_ports[rank]}",
                 f"--collective_timeout={self.collective_timeout}",
                 "--peer_startup_timeout=120s", *self.extra_args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def start_all(self) -> "Cluster":
        for rank in range(self.world):
            self.start(rank)
        return self

    def pid(self, rank: int) -> int:
        return self.processes[rank].pid

    def kill(self, rank: int) -> None:
        """SIGKILL: no shutdown path runs, as when a node or container dies."""
        process = self.processes[rank]
        process.send_signal(signal.SIGKILL)
        process.wait()

    def exited(self) -> list[str]:
        """'rank R exited C' for every daemon that died on its own."""
        return [f"gradcompd rank {r} exited {p.returncode}"
                for r, p in enumerate(self.processes)
                if p is not None and p.poll() is not None]

    def peers_up(self, rank: int) -> float:
        try:
            return metrics.total(metrics.scrape(self.metrics_url(rank), timeout=2),
                                 "gradcomp_peers_up")
        except OSError:
            return -1

    def wait_peers_up(self, timeout: float) -> float:
        """Seconds until every daemon has all W-1 peers up; TimeoutError naming
        the ranks that have not."""
        t0 = time.monotonic()
        while True:
            short = [r for r in range(self.world)
                     if self.peers_up(r) < self.world - 1]
            if not short:
                return time.monotonic() - t0
            if self.exited():
                raise RuntimeError("; ".join(self.exited()))
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"ranks {short} do not have {self.world - 1} "
                                   f"peers up after {timeout} s")
            time.sleep(0.1)

    def rss_bytes(self, rank: int) -> int:
        return read_rss_bytes(self.pid(rank))

    def open_fds(self, rank: int) -> int:
        return count_fds(self.pid(rank))

    def threads(self, rank: int) -> int:
        return read_status_field(self.pid(rank), "Threads")

    def logs_tail(self, chars: int = 1500) -> str:
        return "\n".join(
            f"--- gradcompd.{r}.log\n" +
            self.log_path(r).read_text(errors="replace")[-chars:]
            for r in range(self.world) if self.log_path(r).exists())

    def stop(self) -> None:
        for process in self.processes:
            if process is not None:
                testing.stop_process(process)

    def __enter__(self) -> "Cluster":
        return self.start_all()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
