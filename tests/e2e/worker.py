"""One rank's client for the shaped multi-host test and benchmark.

Runs inside a host namespace (see shaped_net.py), next to that rank's
gradcompd. For each codec and step it reduces the whole ResNet-50 gradient
set (gradcomp.resnet50, seed = rank, so ranks differ) over one ReduceStream,
as gradcomp.demo does, and records per step:
  - each tensor's stats (codec used, numel, wire_bytes, timings),
  - the growth of the daemon's gradcomp_peer_bytes_total{peer,direction}
    and gradcomp_wire_bytes_total{codec},
  - the growth of the bytes this host's eth0 qdisc put on the link,
  - the step's wall time, and the CPU seconds this client and (with
    --daemon_pid) its daemon spent in it, and the daemon's context switches.
Tensors go to the daemon inline over gRPC (--io inline) or through one
shared-memory region holding every input and output (--io shm, the daemon
needs --allow_client_shm): each step then copies the gradients into the
region and the averages out of it, as the DDP hook does with a bucket (and
as the Gloo baseline packs and unpacks its buckets).
Steps are fenced by file barriers in --barrier_dir, so that every rank
starts a step together and reads its counters only after every rank has
finished the step (all of its messages have then arrived). The barrier
waits are not part of the measured wall time.

Writes one JSON document to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np

from gradcomp import metrics, resnet50
from gradcomp.client import Client
from gradcomp.shm import ShmRegion

# The codec each run forces on every tensor, with its parameters; "policy"
# forces none: the daemon's policy decides per tensor, as for a DDP hook
# that names no codecs (with a policy like "* -> topk", biases and norms go
# dense).
CODECS = {
    "none": {},
    "topk": {"ratio": 0.01},
    "qsgd": {"bits": 4},
    "policy": None,
}


class Barrier:
    def __init__(self, directory: str, rank: int, world: int, timeout: float):
        self.dir = pathlib.Path(directory)
        self.rank, self.world, self.timeout = rank, world, timeout

    def wait(self, name: str, poll_s: float = 0.005) -> None:
        """Returns once every rank has reached `name`, at most `poll_s`
        after the last one (a short poll where the ranks must leave
        together, a longer one where waiting ranks would take CPU from
        ranks still at work)."""
        (self.dir / f"{name}.{self.rank}").touch()
        deadline = time.monotonic() + self.timeout
        while not all((self.dir / f"{name}.{r}").exists() for r in range(self.world)):
            if time.monotonic() > deadline:
                missing = [r for r in range(self.world)
                           if not (self.dir / f"{name}.{r}").exists()]
                raise TimeoutError(f"barrier {name}: ranks {missing} did not arrive "
                                   f"within {self.timeout} s")
            time.sleep(poll_s)


def qdisc_sent(dev: str) -> int:
    """Bytes the qdisc of `dev` has sent; 0 without a device (loopback runs)."""
    if not dev:
        return 0
    out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", dev], check=True,
                         text=True, capture_output=True).stdout
    return int(re.search(r"Sent (\d+) bytes", out).group(1))


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of process `pid` (this process if None)."""
    if pid is None:
        return time.process_time()
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def consecutive_groups(grads: dict[str, np.ndarray], names: list[str], mib: float,
                       max_members: int | None = None) -> list[list[str]]:
    """`names` in order, cut into groups of at least `mib` MiB of gradients
    each (or `max_members` names); the last group may be smaller."""
    groups, group, size = [], [], 0
    for name in names:
        group.append(name)
        size += grads[name].nbytes
        if size >= mib * 2**20 or len(group) == max_members:
            groups.append(group)
            group, size = [], 0
    if group:
        groups.append(group)
    return groups


def buckets(grads: dict[str, np.ndarray], bucket_mib: float) -> dict[str, np.ndarray]:
    """The gradients flattened into consecutive groups of at least
    `bucket_mib` MiB each (the last may be smaller), as DDP's buckets: one
    tensor per group, named after its first member."""
    return {f"bucket.{group[0]}": np.concatenate([grads[n].ravel() for n in group])
            for group in consecutive_groups(grads, list(grads), bucket_mib)}


def gather_batches(grads: dict[str, np.ndarray], batch_mib: float,
                   max_members: int = 64) -> dict[str, list[str]]:
    """{batch id: members}: consecutive tensors, at least `batch_mib` MiB of
    gradients or `max_members` tensors per batch, as the DDP hook's
    batch_gather declares them; the daemon sends each batch's payloads as
    one message per peer, a large dense one alone."""
    groups = [g for g in consecutive_groups(grads, list(grads), batch_mib, max_members)
              if len(g) > 1]
    return {f"b{i}.{group[0]}": group for i, group in enumerate(groups)}


def context_switches(pid: int | None) -> int | None:
    """Voluntary and involuntary context switches of every live thread of
    process `pid` (None: not recorded). A thread that has exited takes its
    count with it, so compare steps of a daemon whose threads persist."""
    if pid is None:
        return None
    total = 0
    for status in pathlib.Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            text = status.read_text()
        except FileNotFoundError:  # the thread exited while we listed
            continue
        total += sum(int(n) for n in re.findall(r"ctxt_switches:\s+(\d+)", text))
    return total


class ShmIO:
    """Every tensor's input and output in one registered region. A step
    copies the gradients in (copy_in) and the averages out into arrays of
    the client's own (copy_out), as the DDP hook does with each bucket."""

    def __init__(self, client: Client, grads: dict[str, np.ndarray], rank: int):
        total = sum(g.nbytes for g in grads.values())
        self.region = ShmRegion(2 * total, tag=f"e2e{rank}")
        self.name = f"e2e.rank{rank}"
        client.register_shm(self.name, self.region)
        self.tensors, self._in, self._out, offset = {}, [], [], 0
        for name, g in grads.items():
            src = self.region.array(g.shape, g.dtype, offset)
            dst = self.region.array(g.shape, g.dtype, offset + total)
            self._in.append((g, src))
            self._out.append((dst, np.empty_like(g)))
            self.tensors[name] = (self.region.tensor(self.name, src),
                                  self.region.tensor(self.name, dst))
            offset += g.nbytes

    def copy_in(self) -> None:
        for g, src in self._in:
            np.copyto(src, g)

    def copy_out(self) -> None:
        for dst, out in self._out:
            np.copyto(out, dst)


def peer_bytes(samples: list[metrics.Sample]) -> dict[str, int]:
    """{"sent.<peer>": bytes, "received.<peer>": bytes, "wire.<codec>": bytes}."""
    out = {}
    for s in samples:
        if s.name == "gradcomp_peer_bytes_total":
            out[f"{s.labels['direction']}.{s.labels['peer']}"] = int(s.value)
        elif s.name == "gradcomp_wire_bytes_total":
            out[f"wire.{s.labels['codec']}"] = int(s.value)
    return out


def settled(url: str) -> dict[str, int]:
    """The peer counters once they stop moving (a writer thread counts a
    message after its last Write returns, a moment after the peer has it,
    and a loaded machine may hold that thread back for a few hundred ms):
    unchanged over 11 scrapes 100 ms apart. RuntimeError if they still move
    after 30 s, rather than counters the checks would compare exactly."""
    last, same = peer_bytes(metrics.scrape(url)), 0
    for _ in range(300):
        time.sleep(0.1)
        now = peer_bytes(metrics.scrape(url))
        same = same + 1 if now == last else 0
        if same == 10:
            return now
        last = now
    raise RuntimeError(f"{url}: the peer byte counters still moved after 30 s: {last}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world_size", type=int, default=4)
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--metrics_url", default="http://127.0.0.1:9464/metrics")
    p.add_argument("--barrier_dir", required=True)
    p.add_argument("--codecs", default="none,topk,qsgd",
                   help="runs, one per codec forced on every tensor (CODECS); "
                   "'policy': the daemon's policy decides")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--barrier_timeout", type=float, default=120)
    p.add_argument("--rpc_timeout", type=float, default=120)
    p.add_argument("--peers_up", type=int, default=None,
                   help="peers the daemon must have up first (world_size - 1; "
                        "0 for a world_size 1 daemon)")
    p.add_argument("--io", choices=("inline", "shm"), default="inline",
                   help="tensors inline over gRPC, or in shared memory")
    p.add_argument("--qdisc_dev", default="eth0",
                   help="device whose qdisc counts link bytes; empty: none")
    p.add_argument("--daemon_pid", type=int, default=None,
                   help="the daemon's pid, to record its CPU seconds per step")
    p.add_argument("--bucket_mib", type=float, default=0,
                   help="reduce the gradients flattened into groups of this "
                   "many MiB (DDP's buckets) instead of one tensor each; 0: "
                   "one tensor each")
    p.add_argument("--batch_mib", type=float, default=0,
                   help="declare batches of this many MiB of consecutive tensors, "
                   "so that their rounds travel as one collective (the DDP "
                   "hook's batch_gather); 0: none")
    p.add_argument("--parts", choices=("on", "off"), default="on",
                   help="with --io shm: send the tensors as requests with parts "
                   "(a request per 128 tensors of a batch), or one request each")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    barrier = Barrier(args.barrier_dir, args.rank, args.world_size, args.barrier_timeout)
    grads = resnet50.synthetic_gradients(args.rank)
    if args.bucket_mib > 0:
        grads = buckets(grads, args.bucket_mib)
    client = Client(args.target, timeout=args.rpc_timeout)
    # Health turns SERVING only when every peer is connected and handshaken.
    deadline = time.monotonic() + 60
    peers_up = args.world_size - 1 if args.peers_up is None else args.peers_up
    while metrics.total(metrics.scrape(args.metrics_url), "gradcomp_peers_up") < peers_up:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {args.rank}: peers not up within 60 s")
        time.sleep(0.1)
    shm = ShmIO(client, grads, args.rank) if args.io == "shm" else None
    result = {"rank": args.rank, "io": args.io,
              "numel": {n: int(g.size) for n, g in grads.items()}, "steps": []}
    for codec in args.codecs.split(","):
        for step in range(args.steps):
            batches = gather_batches(grads, args.batch_mib) if args.batch_mib > 0 else None
            tag = f"{codec}.{step}"
            # Every reading that takes time is made outside the step and
            # outside the other ranks' steps: before the start barrier (the
            # last thing before the step, so that the ranks start together)
            # or after the done barrier. Scraping the metrics until they
            # settle and counting context switches (a /proc file per daemon
            # thread) after the start barrier made the ranks start tens of
            # ms apart, which the first to start waited out in its step, and
            # reading /proc cost as much client CPU as the requests.
            before = settled(args.metrics_url)
            q0 = qdisc_sent(args.qdisc_dev)
            s0 = context_switches(args.daemon_pid)
            forced = None if CODECS[codec] is None else codec
            barrier.wait(f"start.{tag}", poll_s=0.001)
            c0, d0 = cpu_seconds(None), cpu_seconds(args.daemon_pid)
            t0 = time.perf_counter()
            if shm is None:
                out = {name: st for name, (_, st) in client.reduce_many(
                    grads, step=step, codec=forced, params=CODECS[codec],
                    job=f"e2e-{codec}", batches=batches).items()}
            else:
                shm.copy_in()
                out = client.reduce_many_shm(shm.tensors, step=step, codec=forced,
                                             params=CODECS[codec], job=f"e2e-{codec}",
                                             batches=batches,
                                             parts=args.parts == "on")
                shm.copy_out()
            wall = time.perf_counter() - t0
            c1, d1 = cpu_seconds(None), cpu_seconds(args.daemon_pid)
            barrier.wait(f"done.{tag}")
            s1 = context_switches(args.daemon_pid)
            after = settled(args.metrics_url)
            q1 = qdisc_sent(args.qdisc_dev)
            tensors = {name: {"codec": st.codec, "wire_bytes": st.wire_bytes,
                              "raw_bytes": st.raw_bytes,
                              "encode_s": st.encode_seconds,
                              "collective_s": st.collective_seconds,
                              "decode_s": st.decode_seconds,
                              "total_s": st.total_seconds}
                       for name, st in out.items()}
            del out
            result["steps"].append({
                "codec": codec, "step": step, "wall_s": wall,
                "client_cpu_s": c1 - c0,
                "daemon_cpu_s": d1 - d0 if args.daemon_pid is not None else None,
                "daemon_switches": s1 - s0 if s0 is not None else None,
                "batches": len(batches or {}),
                "qdisc_sent": q1 - q0,
                "counters": {k: after.get(k, 0) - before.get(k, 0) for k in after},
                "tensors": tensors})
            print(f"rank {args.rank} {tag}: {wall:.2f} s, client CPU "
                  f"{c1 - c0:.2f} s, daemon CPU {d1 - d0:.2f} s", flush=True)
    pathlib.Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
