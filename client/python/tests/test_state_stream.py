"""Client.export_state / import_state against a real daemon whose client
message cap (--max_tensor_bytes + 1 MiB) is smaller than a job's codec
state: the state goes in pieces, and comes back whole. In one message, as
the unary ExportState / ImportState carry it, it does not go at all."""
import unittest

import grpc
import numpy as np

import gradcomp
from gradcomp.testing import Daemon

TENSOR_FLOATS = 16384          # 64 KiB: the daemon's largest tensor
TENSORS = 24                   # top-k residual and momentum: 3 MiB of state
TOPK = {"codec": "topk", "params": {"ratio": 0.01}}


class StateStreamTest(unittest.TestCase):

    def setUp(self):
        self.daemon = Daemon([f"--max_tensor_bytes={TENSOR_FLOATS * 4}"]).start()
        self.addCleanup(self.daemon.close)
        self.client = gradcomp.Client(self.daemon.target, timeout=60.0)
        self.addCleanup(self.client.close)
        rng = np.random.default_rng(5)
        self.grads = {f"w{i}": rng.standard_normal(TENSOR_FLOATS).astype(np.float32)
                      for i in range(TENSORS)}

    def _step(self, job: str, step: int) -> dict[str, np.ndarray]:
        return {name: self.client.reduce(grad, name, step=step, job=job, **TOPK)[0]
                for name, grad in self.grads.items()}

    def test_state_larger_than_a_message_round_trips(self):
        self._step("big", 0)
        state = self.client.export_state("big")
        cap = TENSOR_FLOATS * 4 + (1 << 20)
        self.assertGreater(len(state), 2 * cap)
        self.assertGreater(len(state), gradcomp.client.STATE_PIECE_BYTES)

        # One message is over the cap: refused by gRPC, nothing imported.
        with self.assertRaises(grpc.RpcError) as refused:
            self.client._stub.ImportState(
                gradcomp.client.gradcomp_pb2.ImportStateRequest(job="one", state=state),
                timeout=60.0)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)

        self.client.import_state(state, "copy")
        self.assertEqual(self.client.export_state("copy"), state)
        # The copy's next step is the original's.
        here, there = self._step("big", 1), self._step("copy", 1)
        for name in self.grads:
            np.testing.assert_array_equal(here[name], there[name])

    def test_a_bad_blob_in_pieces_imports_nothing(self):
        self._step("big", 0)
        state = self.client.export_state("big")
        truncated = state[:len(state) - 100]
        with self.assertRaises(gradcomp.GradcompError) as bad:
            self.client.import_state(truncated, "cut")
        self.assertEqual(bad.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("ImportStateStream", str(bad.exception))
        # Nothing of it was imported: the job has no state to export.
        self.assertLess(len(self.client.export_state("cut")), 64)


if __name__ == "__main__":
    unittest.main()
