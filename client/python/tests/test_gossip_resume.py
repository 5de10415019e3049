"""A checkpoint resumed in gossip mode through gradcomp.torch.hook.

W = 4 workers on a ring (real DDP over Gloo, one real gradcompd each),
PowerGossip rank 1: every worker trains 4 steps, saves its model, optimizer
and HookState.state_dict(), and trains 3 more (the reference). Then every
daemon is replaced by a new one (new processes, new ports: nothing of the
old ones is left) and every worker loads its checkpoint and takes the same
3 steps. (The test starts the three sets of daemons, one per run, before
the workers, and stops them itself: a worker that fails is killed by
mp.spawn without running its clean-up.)

- with HookState.load_state_dict() (the daemon's per-edge PowerGossip
  factors restored by ImportState), every worker's parameters equal the
  reference bit for bit: the mixing is deterministic given its inputs and
  the edges' warm-start factors, so nothing else may differ;
- with the step restored but not the daemon's state (the edges start from
  fresh factors), they differ, so the test can tell a lost state.

Skipped without torch. Needs the daemon: `bazel build //service:gradcompd`
or $GRADCOMPD.
"""
import copy
import os
import tempfile
import unittest

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    torch = None

from gradcomp.testing import Daemon, free_port

W = 4
STEPS_BEFORE = 4
STEPS_AFTER = 3
PHASES = ("uninterrupted", "resumed", "without_daemon_state")


def _model() -> "nn.Module":
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 24), nn.ReLU(), nn.Linear(24, 10))


def _batch(rank: int, step: int) -> tuple:
    """Each worker's own data: the workers' models drift apart, and the
    gossip has differences to mix."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def _scenario(rank: int, master_port: int, targets: dict, out: str) -> None:
    """Runs in a spawned process, rank `rank` of a Gloo group of W; runs the
    three phases, each against its own daemon (targets[phase][rank]), and
    saves this worker's parameters after each to `out`/rank<rank>.pt."""
    import gradcomp
    import gradcomp.torch as gtorch

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port),
                      GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=W)
    gossip = gradcomp.Gossip("ring", rank=1, diffusion=1.308)

    def train(ddp, optimizer, first: int, count: int) -> None:
        for step in range(first, first + count):
            x, y = _batch(rank, step)
            optimizer.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            optimizer.step()

    def phase(name: str, checkpoint: dict | None = None,
              daemon_state: bool = True) -> dict:
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ddp = nn.parallel.DistributedDataParallel(model)
        # DDP's constructor copies rank 0's parameters to every rank. In
        # gossip mode each worker's model is its own, so a worker's
        # checkpoint goes in after the wrapping, not before.
        if checkpoint is not None:
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
        state = gtorch.HookState(model, targets[name][rank], job="resume",
                                 gossip=gossip, shm=False)
        ddp.register_comm_hook(state, gtorch.hook)
        saved = None
        if checkpoint is None:
            train(ddp, optimizer, 0, STEPS_BEFORE)
            saved = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                     "optimizer": copy.deepcopy(optimizer.state_dict()),
                     "hook": state.state_dict()}
        elif daemon_state:
            state.load_state_dict(checkpoint["hook"])
        else:
            state.step = checkpoint["hook"]["step"]
        train(ddp, optimizer, STEPS_BEFORE, STEPS_AFTER)
        state.close()
        return {"params": {k: v.clone() for k, v in model.state_dict().items()},
                "checkpoint": saved}

    first = phase("uninterrupted")
    results = {"uninterrupted": first["params"],
               "resumed": phase("resumed", first["checkpoint"])["params"],
               "without_daemon_state": phase("without_daemon_state", first["checkpoint"],
                                             daemon_state=False)["params"],
               "daemon_state_bytes": len(first["checkpoint"]["hook"]["daemon_state"])}
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))


@unittest.skipIf(torch is None, "needs torch (Debian: python3-torch)")
class GossipResumeTest(unittest.TestCase):

    def _daemons(self) -> list[Daemon]:
        """W new daemons peered on a ring's worth of new ports, stopped and
        removed when the test ends."""
        peers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(W))
        daemons = []
        for r in range(W):
            daemon = Daemon([f"--rank={r}", f"--world_size={W}", f"--peers={peers}",
                             "--collective_timeout=60s"])
            self.addCleanup(daemon.close)
            daemons.append(daemon.start())
        return daemons

    def test_checkpoint_resumes_power_gossip_bit_for_bit(self):
        targets = {name: [d.target for d in self._daemons()] for name in PHASES}
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(_scenario, args=(free_port(), targets, out), nprocs=W, join=True)
            results = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(W)]

        reference = [r["uninterrupted"] for r in results]
        self.assertFalse(
            all(torch.equal(reference[0][k], reference[1][k]) for k in reference[0]),
            "the workers' models never differed: the daemon averaged instead of "
            "gossiping")
        for r, result in enumerate(results):
            self.assertGreater(result["daemon_state_bytes"], 0,
                               f"rank {r}: the daemon exported no gossip state")
            for name, value in result["uninterrupted"].items():
                self.assertTrue(torch.equal(result["resumed"][name], value),
                                f"rank {r}: {name} after the resumed steps differs "
                                f"from uninterrupted training (max |diff| "
                                f"{(result['resumed'][name] - value).abs().max()})")
            self.assertFalse(
                all(torch.equal(result["without_daemon_state"][name], value)
                    for name, value in result["uninterrupted"].items()),
                f"rank {r}: the steps without the daemon's state equal the "
                f"uninterrupted ones, so this test could not tell a lost state")


if __name__ == "__main__":
    unittest.main()
