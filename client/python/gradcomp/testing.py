"""Starts a real gradcompd process for tests, on free local ports.

    with Daemon() as daemon:
        client = gradcomp.Client(daemon.target)
        scrape(daemon.metrics_url)

A Daemon owns a temporary directory holding its log (`log_path`, read with
`log()`), and its unix socket and token file when it has them. `stop()`
ends the process and keeps the directory, so the log can still be read;
`close()` (or leaving the `with` block) stops the process and removes the
directory. A Daemon that is never closed has its directory removed when it
is garbage-collected or at interpreter exit.

The binary is $GRADCOMPD, else bazel-bin/service/gradcompd of this checkout
(build it with `bazel build //service:gradcompd`).
"""
from __future__ import annotations

import os
import pathlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Callable, Sequence

import grpc

from gradcomp import metrics
from gradcomp.client import Client
from gradcomp.errors import GradcompError

_REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


def daemon_binary() -> pathlib.Path:
    """The gradcompd to test; FileNotFoundError that says how to get one."""
    path = pathlib.Path(os.environ.get("GRADCOMPD") or
                        _REPO_ROOT / "bazel-bin" / "service" / "gradcompd")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"no gradcompd at {path}: run `bazel build //service:gradcompd` "
            f"or set $GRADCOMPD")
    return path


def stop_process(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` s; a
    process that already exited is left as it is."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# Every port free_port() has handed out in this process. The kernel hands
# a released port out again soon enough (2 repeats in 200 binds here), and a
# peer port chosen for a daemon that has not bound it yet must not become
# another daemon's --listen port: that daemon would then answer its own
# handshake, or another job's.
_handed_out: set[int] = set()
_random = random.SystemRandom()


def _below_ephemeral_range() -> tuple[int, int] | None:
    """Up to 12000 ports just below the kernel's ephemeral range, or None.
    bind(0) and the source ports of outgoing connections come from that
    range, so a port picked below it is not given to another test's port-0
    server, nor to some connection, before our daemon binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    start = max(1024, low - 12000)
    return (start, low - 1) if low - start >= 1000 else None


_PRIVATE_PORTS = _below_ephemeral_range()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now and never returned before by
    this process: a random one below the kernel's ephemeral range when
    there is room, else the kernel's choice (another process may still take
    it; Daemon retries with new ports if its start fails)."""
    for attempt in range(1000):
        candidate = (_random.randint(*_PRIVATE_PORTS)
                     if _PRIVATE_PORTS and attempt < 500 else 0)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free TCP port on 127.0.0.1")


def start_peered(world: int, add_cleanup: Callable[..., None],
                 extra_args: Sequence[str] = ()) -> list[Daemon]:
    """Starts `world` daemons peered over loopback (--rank, --world_size and
    --peers, then `extra_args`), registering each one's stop with
    `add_cleanup` (a unittest.TestCase's addCleanup) as soon as it has
    started, so that they stop even when a later one fails to."""
    peers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(world))
    daemons = []
    for rank in range(world):
        daemon = Daemon([f"--rank={rank}", f"--world_size={world}", f"--peers={peers}",
                         *extra_args])
        daemon.start()
        add_cleanup(daemon.__exit__, None, None, None)
        daemons.append(daemon)
    return daemons


def collectives(daemon: Daemon) -> float:
    """How many collectives `daemon` has run (its
    gradcomp_collective_duration_seconds histogram's count)."""
    return daemon.metric("gradcomp_collective_duration_seconds_count")


class Daemon:
    """One gradcompd child process; `extra_args` go after the port flags.

    It listens on loopback TCP, or with `unix_socket` on a socket in its
    temporary directory. With `token` it requires that bearer token from TCP
    clients (--client_token_file). With `user` (root only) it runs as that
    uid.
    """

    def __init__(self, extra_args: Sequence[str] = (), start_timeout: float = 30.0,
                 token: str | None = None, unix_socket: bool = False,
                 user: int | None = None):
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.token = token
        self.unix_socket = unix_socket
        self.user = user
        self.binary = daemon_binary()
        self._dir = tempfile.TemporaryDirectory(prefix="gradcompd-test-")
        if user is not None:
            # Run as another uid (needs root): from a copy that uid can
            # reach (the build output may sit under a private home).
            os.chmod(self._dir.name, 0o755)
            copy = pathlib.Path(self._dir.name) / "gradcompd"
            shutil.copy(self.binary, copy)
            self.binary = copy
        self.log_path = pathlib.Path(self._dir.name) / "gradcompd.log"
        self.socket_path = pathlib.Path(self._dir.name) / "run" / "gradcomp.sock"
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.metrics_port = 0
        if token is not None:
            token_file = pathlib.Path(self._dir.name) / "token"
            token_file.write_text(token + "\n")
            self.extra_args.insert(0, f"--client_token_file={token_file}")

    @property
    def target(self) -> str:
        if self.unix_socket:
            return f"unix:{self.socket_path}"
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the daemon's `name` samples with these labels, scraped
        now."""
        return metrics.total(metrics.scrape(self.metrics_url), name, **labels)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> "Daemon":
        attempts = 3
        for attempt in range(attempts):
            self.port, self.metrics_port = free_port(), free_port()
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [str(self.binary), f"--listen={self.target}",
                     f"--metrics_listen=127.0.0.1:{self.metrics_port}",
                     "--world_size=1", *self.extra_args],
                    stdout=log, stderr=subprocess.STDOUT, user=self.user)
            if self._wait_serving():
                return self
            # Exited early: most likely a port taken between free_port() and
            # bind; try again with new ones.
            if attempt == attempts - 1:
                break
        message = (f"gradcompd did not start ({self.binary}); "
                   f"its log:\n{self.log()[-4000:]}")
        self.close()
        raise RuntimeError(message)

    def _wait_serving(self) -> bool:
        """True once GetInfo answers; False if the process exits first."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            # A fresh channel per try: a channel that failed to connect
            # backs off for a second or more before it tries again.
            with Client(self.target, timeout=2.0, token=self.token or "") as client:
                try:
                    client.info()
                    return True
                except GradcompError as error:
                    if error.code not in (grpc.StatusCode.UNAVAILABLE,
                                          grpc.StatusCode.DEADLINE_EXCEEDED):
                        raise
            time.sleep(0.05)
        self.stop()
        message = (f"gradcompd did not answer GetInfo within "
                   f"{self.start_timeout} s; its log:\n{self.log()[-4000:]}")
        self.close()
        raise RuntimeError(message)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Ends the process (SIGTERM, then SIGKILL); the log stays readable."""
        if self.process is not None:
            stop_process(self.process)

    def close(self) -> None:
        """Stops the process and removes the temporary directory, log
        included. Safe to call more than once."""
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
