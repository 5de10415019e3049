"""The Python client's gossip mode against real peered daemons.

- Gossip specs are validated and land in ReduceRequest.mode, .gossip and
  .consensus_distance (inline and shared-memory requests alike).
- Four daemons on a ring: exact gossip returns each worker's tensor mixed
  with its two neighbours' at weight 1/3 (the ring's Metropolis-Hastings
  weights), inline and through shared memory; PowerGossip rank 1 keeps the
  network mean of a matrix and shrinks the consensus distance round by
  round; the daemon exports the consensus distance the client reports;
  PowerGossip with fresh factors every round matches warm start in the
  first round (the same first draw) and differs from it in the second.

Needs the daemon: `bazel build //service:gradcompd` or $GRADCOMPD.
"""
import threading
import unittest

import numpy as np

import gradcomp
from gradcomp import metrics
from gradcomp.client import Gossip, _set_mode
from gradcomp.shm import ShmRegion
from gradcomp.testing import Daemon, free_port
from gradcomp.v1 import gradcomp_pb2

W = 4


class GossipSpecTest(unittest.TestCase):

    def test_spec_and_distance_set_the_request(self):
        request = gradcomp_pb2.ReduceRequest()
        _set_mode(request, Gossip("torus:2x2", rank=2, power_steps=3,
                                  diffusion=1.308), 0.25)
        self.assertEqual(request.mode, gradcomp_pb2.REDUCE_MODE_GOSSIP)
        self.assertEqual((request.gossip.topology, request.gossip.rank,
                          request.gossip.power_steps, request.gossip.diffusion),
                         ("torus:2x2", 2, 3, 1.308))
        self.assertEqual(request.consensus_distance, 0.25)

    def test_choco_spec_sets_the_fraction_and_needs_rank_0(self):
        request = gradcomp_pb2.ReduceRequest()
        _set_mode(request, Gossip("ring", rank=0, diffusion=0.1,
                                  choco_topk_fraction=0.02), None)
        self.assertEqual((request.gossip.rank,
                          request.gossip.choco_topk_fraction), (0, 0.02))
        with self.assertRaisesRegex(ValueError, "needs rank 0"):
            Gossip("ring", rank=1, choco_topk_fraction=0.02)
        with self.assertRaisesRegex(ValueError, "must be in"):
            Gossip("ring", rank=0, choco_topk_fraction=1.5)

    def test_fresh_factors_set_the_request_and_need_power_gossip(self):
        request = gradcomp_pb2.ReduceRequest()
        _set_mode(request, Gossip("ring", rank=1), None)
        self.assertFalse(request.gossip.fresh_factors)
        _set_mode(request, Gossip("ring", rank=1, fresh_factors=True), None)
        self.assertTrue(request.gossip.fresh_factors)
        with self.assertRaisesRegex(ValueError, "needs rank > 0"):
            Gossip("ring", rank=0, fresh_factors=True)
        with self.assertRaisesRegex(ValueError, "needs rank 0"):
            Gossip("ring", rank=1, choco_topk_fraction=0.1,
                   fresh_factors=True)

    def test_no_spec_leaves_the_average(self):
        request = gradcomp_pb2.ReduceRequest()
        _set_mode(request, None, None)
        self.assertEqual(request.mode, gradcomp_pb2.REDUCE_MODE_AVERAGE)
        self.assertFalse(request.HasField("gossip"))

    def test_bad_specs_are_refused(self):
        with self.assertRaisesRegex(ValueError, "empty topology"):
            Gossip("")
        with self.assertRaisesRegex(ValueError, ">= 0"):
            Gossip("ring", rank=-1)
        for diffusion in (-0.5, float("nan"), float("inf")):
            with self.assertRaisesRegex(ValueError, "diffusion finite"):
                Gossip("ring", diffusion=diffusion)


def _ring_mix(xs: list[np.ndarray]) -> list[np.ndarray]:
    """Exact gossip on a ring of len(xs): (x_{i-1} + x_i + x_{i+1}) / 3."""
    n = len(xs)
    return [(xs[(i - 1) % n] + xs[i] + xs[(i + 1) % n]) / 3 for i in range(n)]


def _distance(xs: list[np.ndarray]) -> float:
    mean = np.mean(xs, axis=0)
    return float(sum(((x - mean) ** 2).sum() for x in xs) / len(xs))


class GossipRingTest(unittest.TestCase):
    """Four peered daemons on loopback, one client thread per rank."""

    @classmethod
    def setUpClass(cls):
        peers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(W))
        cls.daemons = []
        try:
            for r in range(W):
                cls.daemons.append(Daemon([f"--rank={r}", f"--world_size={W}",
                                           f"--peers={peers}",
                                           "--allow_client_shm"]).start())
        except BaseException:
            cls.tearDownClass()
            raise
        cls.clients = [gradcomp.Client(d.target, timeout=60) for d in cls.daemons]

    @classmethod
    def tearDownClass(cls):
        for client in getattr(cls, "clients", []):
            client.close()
        for daemon in cls.daemons:
            daemon.close()

    @classmethod
    def _on_every_rank(cls, work) -> list:
        """work(rank, client) on every rank at once; the results by rank, or
        the first error raised (with the daemons' logs if not a
        GradcompError)."""
        results, errors = [None] * W, []

        def run(r):
            try:
                results[r] = work(r, cls.clients[r])
            except Exception as error:  # re-raised below
                errors.append(error)

        threads = [threading.Thread(target=run, args=(r,)) for r in range(W)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if errors:
            raise errors[0]
        return results

    def test_exact_gossip_mixes_with_both_neighbours(self):
        rng = np.random.default_rng(1)
        tensors = [{"w": rng.standard_normal((6, 5), dtype=np.float32),
                    "b": rng.standard_normal(7, dtype=np.float32)}
                   for _ in range(W)]
        out = self._on_every_rank(lambda r, c: c.reduce_many(
            tensors[r], step=0, job="exact", gossip=Gossip("ring", rank=0)))
        for name in ("w", "b"):
            expected = _ring_mix([t[name] for t in tensors])
            for r in range(W):
                np.testing.assert_allclose(out[r][name][0], expected[r],
                                           rtol=1e-5, atol=1e-6)
        # Gossip sends the tensor to each of the two neighbours and nothing
        # else: 2 x (30 fp32 values + the 32-byte payload header), where an
        # allgather would send it to all W - 1 = 3 others.
        stats = out[0]["w"][1]
        self.assertEqual(stats.wire_bytes, 2 * (30 * 4 + 32))

    def test_shared_memory_equals_inline(self):
        rng = np.random.default_rng(2)
        xs = [rng.standard_normal((8, 4), dtype=np.float32) for _ in range(W)]

        def shm(r, client):
            region = ShmRegion(2 * xs[r].nbytes, tag="gossip-test")
            try:
                name = f"gossip.{r}"
                client.register_shm(name, region)
                try:
                    region.array(xs[r].shape, xs[r].dtype)[...] = xs[r]
                    source = region.tensor(name, region.array(xs[r].shape, xs[r].dtype))
                    target = region.tensor(name, region.array(
                        xs[r].shape, xs[r].dtype, offset=xs[r].nbytes))
                    client.reduce_many_shm({"x": (source, target)}, step=0,
                                           job="shm", gossip=Gossip("ring", rank=1))
                    return region.array(xs[r].shape, xs[r].dtype,
                                        offset=xs[r].nbytes).copy()
                finally:
                    client.unregister_shm(name)
            finally:
                region.release()

        via_shm = self._on_every_rank(shm)
        inline = self._on_every_rank(lambda r, c: c.reduce(
            xs[r], "x", 0, job="inline", gossip=Gossip("ring", rank=1))[0])
        for r in range(W):
            np.testing.assert_array_equal(via_shm[r], inline[r])

    def test_choco_gossip_keeps_the_mean_and_sends_top_k(self):
        rng = np.random.default_rng(4)
        xs = [rng.standard_normal((16, 12), dtype=np.float32) for _ in range(W)]
        mean = np.mean(xs, axis=0)
        start = _distance(xs)
        spec = Gossip("ring", rank=0, diffusion=0.2, choco_topk_fraction=0.1)
        for step in range(15):
            out = self._on_every_rank(lambda r, c: c.reduce(
                xs[r], "m", step, job="choco", gossip=spec))
            xs = [o[0] for o in out]
        np.testing.assert_allclose(np.mean(xs, axis=0), mean, atol=1e-5)
        self.assertLess(_distance(xs), 0.5 * start)
        # k = 20 of 192 entries: a 32-byte header and 20 (index, value)
        # pairs to each of the two neighbours.
        self.assertEqual(out[0][1].codec, "choco-topk")
        self.assertEqual(out[0][1].wire_bytes, 2 * (32 + 8 * 20))

    def test_power_gossip_keeps_the_mean_and_shrinks_the_distance(self):
        rng = np.random.default_rng(3)
        xs = [rng.standard_normal((16, 12), dtype=np.float32) for _ in range(W)]
        mean = np.mean(xs, axis=0)
        distances = [_distance(xs)]
        for step in range(12):
            xs = self._on_every_rank(lambda r, c: c.reduce(
                xs[r], "m", step, job="power",
                gossip=Gossip("ring", rank=1, diffusion=1.308))[0])
            distances.append(_distance(xs))
        np.testing.assert_allclose(np.mean(xs, axis=0), mean, atol=1e-5)
        # Every round removes the leading directions of the differences:
        # never a rise, and a large fall over 12 rounds (exact gossip on a
        # ring of 4 would reach 1/9 per round on the slowest mode).
        for before, after in zip(distances, distances[1:]):
            self.assertLess(after, before)
        self.assertLess(distances[-1], 0.5 * distances[0])

    def test_fresh_factors_differ_from_warm_start_from_the_second_round(self):
        rng = np.random.default_rng(5)
        start = [rng.standard_normal((9, 7), dtype=np.float32)
                 for _ in range(W)]
        mean = np.mean(start, axis=0)
        runs = {}
        for job, fresh in (("warm", False), ("fresh", True)):
            xs, rounds = start, []
            spec = Gossip("ring", rank=1, diffusion=1.308,
                          fresh_factors=fresh)
            for step in range(2):
                xs = self._on_every_rank(lambda r, c: c.reduce(
                    xs[r], "m", step, job=job, gossip=spec)[0])
                rounds.append(xs)
            runs[job] = rounds
            np.testing.assert_allclose(np.mean(xs, axis=0), mean, atol=1e-5)
        for r in range(W):
            np.testing.assert_array_equal(runs["warm"][0][r],
                                          runs["fresh"][0][r])
        self.assertFalse(all(np.array_equal(w, f) for w, f in
                             zip(runs["warm"][1], runs["fresh"][1])))

    def test_reported_consensus_distance_is_exported(self):
        xs = [np.full(4, float(r), np.float32) for r in range(W)]
        self._on_every_rank(lambda r, c: c.reduce(
            xs[r], "v", 0, job="reported", gossip=Gossip("ring", rank=0),
            consensus_distance=0.125))
        families = metrics.scrape(self.daemons[0].metrics_url)
        self.assertEqual(metrics.total(families, "gradcomp_gossip_consensus_distance",
                                       gradcomp_job="reported"), 0.125)


if __name__ == "__main__":
    unittest.main()
