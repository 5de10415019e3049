"""Batches of tensors (ReduceRequest.batch) from Python: the client's batch
arguments, the DDP hook's choice of batches, and two peered daemons giving
the same averages batched as unbatched with fewer collectives, for SUM
rounds (PowerSGD, same shapes) and GATHER rounds (top-k, any shapes)."""
import threading
import unittest

import numpy as np
import torch

import gradcomp
from gradcomp import cuda_ipc
from gradcomp.client import _batch_requests
from gradcomp.testing import collectives, start_peered
from gradcomp.torch import Codec, HookState, _Tensor


class BatchRequestsTest(unittest.TestCase):

    def test_each_member_gets_its_batch(self):
        batch_of = _batch_requests({"b": ["x", "y"]}, ["x", "y", "z"])
        self.assertEqual(sorted(batch_of), ["x", "y"])
        self.assertEqual(batch_of["x"].id, "b")
        self.assertEqual(list(batch_of["y"].members), ["x", "y"])

    def test_members_must_be_reduced_and_in_one_batch(self):
        with self.assertRaisesRegex(ValueError, r"does not reduce: \['w'\]"):
            _batch_requests({"b": ["x", "w"]}, ["x"])
        with self.assertRaisesRegex(ValueError, "in batches 'a' and 'b'"):
            _batch_requests({"a": ["x"], "b": ["x"]}, ["x"])


class HookBatchesTest(unittest.TestCase):

    def setUp(self):
        model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)],
                                    torch.nn.Linear(8, 4))
        self.state = HookState(model, "127.0.0.1:1", batch_same_shape=True,
                               batch_gather=False)
        self.addCleanup(self.state.close)
        self.tensors = [_Tensor(name, tuple(p.shape), cuda_ipc.numpy_dtype(p), 0)
                        for name, p in model.named_parameters()]

    def test_powersgd_matrices_of_one_shape_form_a_batch(self):
        batches = self.state._batches(Codec("powersgd"), self.tensors)
        self.assertEqual(batches, {"8x8.<f4.0.weight": ["0.weight", "1.weight",
                                                        "2.weight"]})

    def test_policy_tensors_batch_by_shape_alone(self):
        # Left to the policy: the same batch whatever the daemon used last
        # step, so that a rank that restarted names the same one.
        batch = {"8x8.<f4.0.weight": ["0.weight", "1.weight", "2.weight"]}
        self.assertEqual(self.state._batches(None, self.tensors), batch)
        self.state.last_codecs = {"0.weight": "powersgd", "2.weight": "topk"}
        self.assertEqual(self.state._batches(None, self.tensors), batch)

    def test_batch_gather_puts_the_rest_of_a_group_in_batches(self):
        names = [t.name for t in self.tensors]
        self.state.batch_same_shape = False
        self.state.batch_gather = True
        # Every tensor, whatever codec it got: the daemon decides how each
        # round travels, so nothing here depends on the last step.
        self.assertEqual(self.state._batches(Codec("topk"), self.tensors),
                         {"gather.0.weight": names})
        self.state.MAX_BATCH = 3
        self.assertEqual(self.state._batches(None, self.tensors),
                         {"gather.0.weight": names[0:3], "gather.1.bias": names[3:6],
                          "gather.3.weight": names[6:8]})
        # Same-shape batches first, the rest after.
        self.state.MAX_BATCH = 64
        self.state.batch_same_shape = True
        same = ("0.weight", "1.weight", "2.weight")
        self.assertEqual(self.state._batches(None, self.tensors),
                         {"8x8.<f4.0.weight": list(same),
                          "gather.0.bias": [n for n in names if n not in same]})
        # Gossip requests take no batches.
        self.state.gossip = gradcomp.Gossip("ring")
        self.assertEqual(self.state._batches(None, self.tensors), {})

    def test_other_codecs_and_the_default_do_not_batch(self):
        self.assertEqual(self.state._batches(Codec("topk"), self.tensors), {})
        self.state.batch_same_shape = False
        self.assertEqual(self.state._batches(Codec("powersgd"), self.tensors), {})



class BatchTwoDaemonsTest(unittest.TestCase):
    """Two peered daemons reducing batches: the same averages as unbatched
    with fewer collectives, and batches that outnumber the stream pool."""

    def test_batched_powersgd_equals_unbatched_with_fewercollectives(self):
        """Six same-shape matrices and one other per step, PowerSGD for
        three steps: batched averages equal unbatched ones on both ranks,
        with 2 collectives for the batch instead of 12."""
        daemons = start_peered(2, self.addCleanup)
        names = [f"layer{i}.weight" for i in range(6)]
        rng = np.random.default_rng(3)
        grads = [[{name: rng.standard_normal((32, 16), dtype=np.float32)
                   for name in names} | {"head.weight": rng.standard_normal(
                       (10, 16), dtype=np.float32)} for _ in range(3)]
                 for _ in range(2)]
        results = {}
        errors = []

        def rank(r, job, batches):
            try:
                with gradcomp.Client(daemons[r].target) as client:
                    for step in range(3):
                        out = client.reduce_many(
                            grads[r][step], step=step, job=job, codec="powersgd",
                            params={"rank": 2}, batches=batches)
                        results[(job, r, step)] = {n: a for n, (a, _) in out.items()}
            except Exception as error:  # reported below with the daemon logs
                errors.append(error)

        counts = {}
        for job, batches in (("plain", None), ("batched", {"bucket0": names})):
            before = [collectives(d) for d in daemons]
            threads = [threading.Thread(target=rank, args=(r, job, batches))
                       for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            self.assertEqual(errors, [], "\n".join(d.log()[-2000:] for d in daemons))
            counts[job] = [collectives(d) - b for d, b in zip(daemons, before)]
        for r in range(2):
            for step in range(3):
                for name in names + ["head.weight"]:
                    np.testing.assert_array_equal(
                        results[("batched", r, step)][name],
                        results[("plain", 0, step)][name])
        # 7 tensors x 2 rounds x 3 steps unbatched; the batch makes 6 of
        # them one: (1 + 1) x 2 x 3.
        self.assertEqual(counts["plain"], [42, 42])
        self.assertEqual(counts["batched"], [12, 12])

    def test_batched_topk_of_different_shapes_equals_unbatched(self):
        """GATHER rounds: top-k (DGC, error feedback carried) of five tensors
        of different shapes for three steps; the batch's averages equal
        unbatched ones on both ranks, with 1 collective per step for the
        batch instead of 5."""
        daemons = start_peered(2, self.addCleanup)
        shapes = {f"layer{i}.weight": (64 + 16 * i, 48) for i in range(5)}
        rng = np.random.default_rng(5)
        grads = [[{name: rng.standard_normal(shape, dtype=np.float32)
                   for name, shape in shapes.items()} for _ in range(3)]
                 for _ in range(2)]
        results, codecs, errors = {}, set(), []

        def rank(r, job, batches):
            try:
                with gradcomp.Client(daemons[r].target) as client:
                    for step in range(3):
                        out = client.reduce_many(
                            grads[r][step], step=step, job=job, codec="topk",
                            params={"ratio": 0.05}, batches=batches)
                        results[(job, r, step)] = {n: a for n, (a, _) in out.items()}
                        codecs.update(st.codec for _, st in out.values())
            except Exception as error:  # reported below with the daemon logs
                errors.append(error)

        counts = {}
        for job, batches in (("plain", None), ("batched", {"bucket0": list(shapes)})):
            before = [collectives(d) for d in daemons]
            threads = [threading.Thread(target=rank, args=(r, job, batches))
                       for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            self.assertEqual(errors, [], "\n".join(d.log()[-2000:] for d in daemons))
            counts[job] = [collectives(d) - b for d, b in zip(daemons, before)]
        self.assertEqual(codecs, {"topk"})
        for r in range(2):
            for step in range(3):
                for name in shapes:
                    np.testing.assert_array_equal(
                        results[("batched", r, step)][name],
                        results[("plain", 0, step)][name])
        self.assertEqual(counts["plain"], [15, 15])  # 5 tensors x 3 steps
        self.assertEqual(counts["batched"], [3, 3])

    def test_concurrent_batches_beyond_the_pools_running_limit_complete(self):
        """Three jobs at once, each a 128-member batch on its own stream: 384
        members, more than the 256 a daemon with peers runs at once. Members
        waiting for the rest of their batch leave room for the rest, so
        every batch completes, with the exact mean. Before, the 256 threads
        could all hold members of incomplete batches (the three streams'
        members interleave in the queue) while the missing ones sat in the
        queue, and every reduce failed at the deadline."""
        daemons = start_peered(2, self.addCleanup, ["--collective_timeout=30s"])
        names = [f"t{i:03d}" for i in range(128)]
        rng = np.random.default_rng(11)
        grads = {(job, r): {name: rng.standard_normal(4, dtype=np.float32)
                            for name in names}
                 for job in range(3) for r in range(2)}
        results, errors = {}, []

        def rank(r, job):
            try:
                with gradcomp.Client(daemons[r].target) as client:
                    out = client.reduce_many(grads[(job, r)], step=0,
                                             job=f"job{job}", codec="none",
                                             batches={"all": names})
                    results[(job, r)] = {n: a for n, (a, _) in out.items()}
            except Exception as error:  # reported below with the daemon logs
                errors.append(error)

        threads = [threading.Thread(target=rank, args=(r, job))
                   for job in range(3) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertFalse(any(t.is_alive() for t in threads), "a client hung")
        self.assertEqual(errors, [], "\n".join(d.log()[-2000:] for d in daemons))
        for job in range(3):
            for name in names:
                mean = (grads[(job, 0)][name] + grads[(job, 1)][name]) / 2
                for r in range(2):
                    np.testing.assert_allclose(results[(job, r)][name], mean,
                                               rtol=1e-6, atol=1e-7)


if __name__ == "__main__":
    unittest.main()
