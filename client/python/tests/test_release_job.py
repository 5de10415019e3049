"""Client.release_job against two real peered daemons: a job's codec state
goes back to the memory budget, a busy job is refused, and the job's name
runs again from step 0 as a new job would."""
import concurrent.futures
import time
import unittest

import grpc
import numpy as np

import gradcomp
from gradcomp import metrics
from gradcomp.testing import start_peered

TOPK = {"codec": "topk", "params": {"ratio": 0.01}}



class ReleaseJobTest(unittest.TestCase):

    def setUp(self):
        self.daemons = start_peered(2, self.addCleanup)
        self.clients = [gradcomp.Client(d.target, timeout=60.0) for d in self.daemons]
        for client in self.clients:
            self.addCleanup(client.close)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        self.addCleanup(self.pool.shutdown)
        rng = np.random.default_rng(3)
        self.grads = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2)]

    def _step(self, job: str, step: int) -> list[np.ndarray]:
        """One top-k reduce of "w" on both ranks; their averages."""
        futures = [self.pool.submit(client.reduce, grad, "w", step=step, job=job, **TOPK)
                   for client, grad in zip(self.clients, self.grads)]
        return [future.result()[0] for future in futures]

    def test_release_frees_the_state_and_the_name_starts_afresh(self):
        first = self._step("run", 0)
        for step in range(1, 4):
            self._step("run", step)
        held = [d.metric("gradcomp_memory_budget_in_use_bytes") for d in self.daemons]
        self.assertTrue(all(bytes_ > 0 for bytes_ in held), held)
        for daemon in self.daemons:
            self.assertEqual(daemon.metric("gradcomp_jobs_held"), 1)

        for client, daemon, before in zip(self.clients, self.daemons, held):
            released = client.release_job("run")
            self.assertEqual(released.tensors, 1)
            self.assertEqual(released.state_bytes, before)
            samples = metrics.scrape(daemon.metrics_url)
            self.assertEqual(metrics.total(samples, "gradcomp_memory_budget_in_use_bytes"), 0)
            self.assertEqual(metrics.total(samples, "gradcomp_jobs_released_total"), 1)
            self.assertEqual(metrics.total(samples, "gradcomp_jobs_held"), 0)

        # Step 0 again, after step 3: neither rank takes the other's first
        # message for a stale one, and no residual is left to add.
        again = self._step("run", 0)
        for rank in range(2):
            np.testing.assert_array_equal(again[rank], first[rank])

    def test_a_job_with_a_reduce_in_flight_is_refused(self):
        self._step("busy", 0)  # the ranks connect on their first collective
        # Rank 0 alone: its reduce waits for rank 1's.
        waiting = self.pool.submit(self.clients[0].reduce, self.grads[0], "w",
                                   step=1, job="busy", **TOPK)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.clients[0].release_job("busy")
            except gradcomp.GradcompError as error:
                self.assertEqual(error.code, grpc.StatusCode.FAILED_PRECONDITION, error)
                self.assertIn("in flight", str(error))
                break
            # Not yet admitted (or already released): try again.
            self.assertLess(time.monotonic(), deadline, "the reduce never became busy")
            time.sleep(0.01)
        self.clients[1].reduce(self.grads[1], "w", step=1, job="busy", **TOPK)
        waiting.result()


if __name__ == "__main__":
    unittest.main()
