"""Four "hosts" on one machine: network namespaces on a shaped virtual switch.

    with ShapedNetwork(prefix="gce1234", hosts=4, rate="1gbit") as net:
        net.run(0, ["ip", "addr"])            # a command inside host 0
        net.popen(1, [...])                    # a long-running one
        net.qdisc_sent_bytes(2)                # bytes host 2 put on its link

Topology: one namespace "<prefix>sw" holds a bridge; each host namespace
"<prefix>h<i>" has a veth "eth0" (10.77.0.<i+1>/24) whose peer "h<i>" sits on
the bridge. Both ends of every veth are shaped with
`tc qdisc ... root tbf rate <rate> burst 256kb latency 50ms`, so each host has
a full-duplex link of <rate> to the switch (host egress = its upload, the
switch port's egress = its download). Addresses exist only inside these
namespaces, and nothing is routed out of them: traffic stays between the
hosts. Needs root and `ip netns`.

`close()` (also on exit of the `with`) kills every process still running in
the namespaces and deletes them; `cleanup_prefix()` removes leftovers of a
run that died.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from typing import Sequence

SUBNET = "10.77.0"
BURST = "256kb"
LATENCY = "50ms"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL)


def cleanup_on_sigterm() -> None:
    """Turns SIGTERM into SystemExit, so that a `with ShapedNetwork` block
    removes its namespaces when the run is killed."""
    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)


def list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], check=True, text=True,
                         capture_output=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cleanup_prefix(prefix: str) -> None:
    """Kills the processes in, and deletes, every namespace a ShapedNetwork
    with this prefix creates (prefix + "sw", prefix + "h<i>"); not every
    prefix*, which would take gce1234sw of a concurrent run for gce123."""
    for ns in list_namespaces():
        if re.fullmatch(re.escape(prefix) + r"(sw|h[0-9]+)", ns):
            _kill_namespace_pids(ns)
            subprocess.run(["ip", "netns", "del", ns], check=False)


def _kill_namespace_pids(ns: str) -> None:
    out = subprocess.run(["ip", "netns", "pids", ns], text=True,
                         capture_output=True).stdout
    pids = [int(p) for p in out.split()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_exists(p) for p in alive):
            time.sleep(0.05)
        pids = [p for p in alive if _exists(p)]


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


class ShapedNetwork:
    def __init__(self, prefix: str, hosts: int = 4, rate: str | None = "1gbit"):
        if not re.fullmatch(r"[a-z0-9]{1,10}", prefix):
            raise ValueError(f"namespace prefix {prefix!r}: 1-10 of [a-z0-9]")
        self.prefix = prefix
        self.hosts = hosts
        self.rate = rate
        self.switch = f"{prefix}sw"
        self.namespaces = [f"{prefix}h{i}" for i in range(hosts)]
        self._created: list[str] = []

    def address(self, host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    def __enter__(self) -> "ShapedNetwork":
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def create(self) -> None:
        _ip("netns", "add", self.switch)
        self._created.append(self.switch)
        sw = ["-n", self.switch]
        _ip(*sw, "link", "set", "lo", "up")
        _ip(*sw, "link", "add", "br0", "type", "bridge")
        _ip(*sw, "link", "set", "br0", "up")
        for i, ns in enumerate(self.namespaces):
            _ip("netns", "add", ns)
            self._created.append(ns)
            port = f"h{i}"
            # Create the pair inside the switch namespace, then move one end.
            _ip(*sw, "link", "add", port, "type", "veth", "peer", "name", "eth0")
            _ip(*sw, "link", "set", "eth0", "netns", ns)
            _ip(*sw, "link", "set", port, "master", "br0")
            _ip(*sw, "link", "set", port, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            if self.rate:
                for where, dev in ((ns, "eth0"), (self.switch, port)):
                    subprocess.run(
                        ["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev",
                         dev, "root", "tbf", "rate", self.rate, "burst", BURST,
                         "latency", LATENCY], check=True)
        # No reachability wait here: the daemons retry their peers until
        # --peer_startup_timeout, and bridge ports without STP forward at once.

    def close(self) -> None:
        for ns in reversed(self._created):
            _kill_namespace_pids(ns)
            subprocess.run(["ip", "netns", "del", ns], check=False)
        self._created.clear()

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def popen(self, host: int, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, argv), **kwargs)

    def qdisc_sent_bytes(self, host: int) -> int:
        """Bytes host `host` put on its link (tbf's count: every segment's
        headers included, Ethernet FCS/preamble/gap not)."""
        out = subprocess.run(self.command(host, ["tc", "-s", "qdisc", "show", "dev", "eth0"]),
                             check=True, text=True, capture_output=True).stdout
        m = re.search(r"Sent (\d+) bytes (\d+) pkt", out)
        if not m:
            raise RuntimeError(f"no 'Sent' in tc output of host {host}: {out}")
        return int(m.group(1))
