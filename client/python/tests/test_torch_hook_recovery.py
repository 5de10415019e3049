"""gradcomp.torch.hook when its daemon restarts or goes away, under real DDP
(a Gloo group of one in this process) and a real gradcompd with client
shared memory.

- A daemon restarted between two steps no longer knows the hook's
  shared-memory regions: the hook registers the bucket's region again and
  the step still gives the average (with one worker, the local gradient).
- A restart between two codec groups of a bucket: the retry sends only
  the group not yet reduced.
- A region the daemon still does not know after that fails the bucket with
  the daemon's NOT_FOUND: one retry, not more.
- close() after a restart, before any bucket, is no error: the new daemon
  holds none of the hook's regions.
- close() with the daemon gone releases every region and closes the client,
  then raises the daemon's UNAVAILABLE.
- _CudaStaging, driven on CPU tensors with a recording client: renew()
  registers the same buffer under a new name, the slots where they were; a
  close() whose unregister fails still forgets the buffer, so a later
  bucket gets a new region.

Needs the daemon: `bazel build //service:gradcompd` or $GRADCOMPD.
"""
import glob
import os
import unittest
from unittest import mock

import grpc

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    torch = None

from gradcomp.errors import GradcompError
from gradcomp.shm import ShmTensor
from gradcomp.testing import Daemon
from tests.test_torch_hook import GlooGroupOfOne, _batch, _model


def _hook_regions() -> set:
    """The shared-memory objects of this process's torch hooks."""
    return set(glob.glob(f"/dev/shm/gradcomp.torch-hook.{os.getpid()}.*"))


@unittest.skipIf(torch is None, "needs torch (Debian: python3-torch)")
class DaemonRestartTest(GlooGroupOfOne):

    def setUp(self):
        import gradcomp.torch as gtorch
        self.daemon = Daemon(["--allow_client_shm"], unix_socket=True).start()
        self.addCleanup(self.daemon.close)
        self.model = _model()
        ddp = nn.parallel.DistributedDataParallel(self.model)
        self.state = gtorch.HookState(self.model, self.daemon.target,
                                      job="restart", shm=True)
        self.addCleanup(self.state.close)
        ddp.register_comm_hook(self.state, gtorch.hook)
        self.ddp = ddp

    def _step(self, step: int) -> None:
        """Backward through the hook; its gradients must be the local ones,
        the average over one worker."""
        x, y = _batch(step)
        self.ddp.zero_grad()
        F.cross_entropy(self.ddp(x), y).backward()
        reference = _model()  # the same weights: no optimizer step is taken
        F.cross_entropy(reference(x), y).backward()
        for (name, param), expected in zip(self.model.named_parameters(),
                                           reference.parameters()):
            self.assertTrue(torch.equal(param.grad, expected.grad),
                            f"step {step}: the gradient of {name} is not the average")

    def _restart(self) -> None:
        self.daemon.stop()
        self.daemon.start()  # the same unix socket, so the same target

    def test_restarted_daemon_gets_the_region_again(self):
        self._step(0)
        self._restart()
        self._step(1)
        self.assertEqual(self.state.transport, "shm")
        self.assertEqual(len(self.state.client.shm_status()), 1)  # the bucket's
        self.assertEqual(self.state.stats.steps, 2)

    def test_region_unknown_after_the_retry_fails_the_bucket(self):
        self._step(0)
        self._restart()
        client = self.state.client
        # Registrations the new daemon never gets: it answers NOT_FOUND again.
        with mock.patch.object(client, "register_shm") as register, \
                mock.patch.object(client, "reduce_many_shm",
                                  wraps=client.reduce_many_shm) as reduce:
            with self.assertRaisesRegex(RuntimeError,
                                        "NOT_FOUND.*no shared-memory region"):
                self._step(1)
        self.assertEqual(register.call_count, 1)
        self.assertEqual(reduce.call_count, 2)

    def test_a_restart_between_codec_groups_retries_only_the_rest(self):
        import gradcomp.torch as gtorch
        # Two codec groups in the bucket: the weight of the first layer with
        # top-k, the other tensors left to the policy.
        self.state.close()
        self.state = gtorch.HookState(
            self.model, self.daemon.target, job="groups", shm=True,
            codecs={"0.weight": gtorch.Codec("topk", {"ratio": 0.5})})
        self.addCleanup(self.state.close)  # setUp's cleanup closes the first
        ddp = nn.parallel.DistributedDataParallel(self.model)
        ddp.register_comm_hook(self.state, gtorch.hook)
        client = self.state.client
        real = client.reduce_many_shm
        sent = []

        def reduce_then_restart(tensors, **kwargs):
            sent.append(sorted(tensors))
            result = real(tensors, **kwargs)
            if len(sent) == 1:
                self._restart()  # after the first group, before the second
            return result

        x, y = _batch(0)
        with mock.patch.object(client, "reduce_many_shm", side_effect=reduce_then_restart):
            F.cross_entropy(ddp(x), y).backward()
        # The second group failed on the new daemon and went again under the
        # new name; the first, done, was not sent twice.
        self.assertEqual(len(sent), 3, sent)
        self.assertEqual(sent[1], sent[2])
        self.assertNotEqual(sent[0], sent[1])
        self.assertEqual(self.state.stats.steps, 1)
        self.assertEqual(self.state.stats.reduces, 4)

    def test_close_after_a_restart_is_no_error(self):
        self._step(0)
        regions = _hook_regions()
        self._restart()
        self.state.close()
        self.assertFalse(regions & _hook_regions())


@unittest.skipIf(torch is None, "needs torch (Debian: python3-torch)")
class CloseWithoutDaemonTest(GlooGroupOfOne):

    def test_close_releases_every_region_and_the_client_then_raises(self):
        import gradcomp.torch as gtorch
        before = _hook_regions()
        with Daemon(["--allow_client_shm"], unix_socket=True) as daemon:
            # Two regions: once DDP rebuilds its buckets (after step 0), the
            # 2 MiB last layer fills the first bucket (1 MiB at most, one
            # tensor at least), the first layer goes in a second one.
            model = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 128))
            ddp = nn.parallel.DistributedDataParallel(model)
            state = gtorch.HookState(model, daemon.target, job="close", shm=True)
            ddp.register_comm_hook(state, gtorch.hook)
            for step in range(2):
                x, y = _batch(step)
                F.cross_entropy(ddp(x), y).backward()
            regions = _hook_regions() - before
            self.assertGreater(len(regions), 1)
            daemon.stop()
            with mock.patch.object(state.client, "close",
                                   wraps=state.client.close) as close_client:
                with self.assertRaises(GradcompError) as raised:
                    state.close()
        self.assertEqual((raised.exception.rpc, raised.exception.code),
                         ("UnregisterSharedMemory", grpc.StatusCode.UNAVAILABLE))
        self.assertFalse(regions & _hook_regions())
        close_client.assert_called_once_with()


class _RecordingClient:
    """register_cuda_tensor / unregister_shm as calls in order; regions start
    at byte 512 of their allocation; unregister_shm raises `unregister_error`
    when set."""
    client_id = "test"

    def __init__(self):
        self.calls = []
        self.unregister_error = None

    def register_cuda_tensor(self, name, tensor):
        self.calls.append(("register", name, tensor.data_ptr()))
        return ShmTensor(name, 512, tuple(tensor.shape), None)

    def unregister_shm(self, name=""):
        self.calls.append(("unregister", name))
        if self.unregister_error is not None:
            raise self.unregister_error


@unittest.skipIf(torch is None, "needs torch (Debian: python3-torch)")
class CudaStagingRecoveryTest(unittest.TestCase):

    def setUp(self):
        import gradcomp.torch as gtorch
        self.client = _RecordingClient()
        self.staging = gtorch._CudaStaging(self.client, "job", torch.device("cpu"))

    def test_renew_registers_the_same_buffer_under_a_new_name(self):
        region, first, second, _, _ = self.staging.slot(0, 100)
        renewed = self.staging.renew()
        self.assertNotEqual(renewed, region)
        self.assertEqual(self.staging.slot(0, 100)[:3], (renewed, first, second))
        (_, _, pointer), registered = self.client.calls
        self.assertEqual(registered, ("register", renewed, pointer))

    def test_failed_close_forgets_the_buffer(self):
        region = self.staging.slot(0, 100)[0]
        self.client.unregister_error = GradcompError(
            "UnregisterSharedMemory", "test", grpc.StatusCode.UNAVAILABLE, "gone")
        with self.assertRaises(GradcompError):
            self.staging.close()
        self.client.unregister_error = None
        renewed = self.staging.slot(0, 100)[0]  # fits the old buffer's slot
        self.assertNotEqual(renewed, region)
        self.assertEqual([call[:2] for call in self.client.calls],
                         [("register", region), ("unregister", region),
                          ("register", renewed)])


if __name__ == "__main__":
    unittest.main()
