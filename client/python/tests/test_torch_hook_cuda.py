"""The torch hook's CUDA IPC path, the parts that run without a GPU.

- cuda_slot_layout: aligned, non-overlapping input and output halves.
- _CudaStaging: one region at a time; a new or grown bucket that does not
  fit gets a new region of at least twice the size (the old one
  unregistered first), a smaller one keeps its slot; close() unregisters.
- cuda_ipc.memory_handle: bare and versioned torch handles. Driven on CPU tensors with a recording client.
- The transport choice for CUDA buckets against a real gradcompd without a
  GPU: auto falls back to host memory with one warning that says why,
  cuda_ipc=True fails with the daemon's FAILED_PRECONDITION, cuda_ipc=False
  asks nothing, a remote daemon is never sent a handle.

tests/gpu/hook_cuda_ipc.py runs the hook on CUDA gradients on a GPU.
Needs the daemon: `bazel build //service:gradcompd` or $GRADCOMPD.
"""
import unittest
import warnings
from unittest import mock

import grpc

try:
    import torch
except ImportError:
    torch = None

import gradcomp
from gradcomp import cuda_ipc
from gradcomp.shm import ShmTensor
from gradcomp.testing import Daemon


def _model() -> "torch.nn.Module":
    return torch.nn.Sequential(torch.nn.Linear(8, 4))


def _cpu_handle(tensor) -> cuda_ipc.CudaIpcHandle:
    """A well-formed handle for a CPU tensor: what cuda_ipc_handle gives for
    a CUDA one, so that the daemon is asked as it would be on a GPU host."""
    nbytes = tensor.numel() * tensor.element_size()
    return cuda_ipc.CudaIpcHandle(device=0, raw=bytes(cuda_ipc.HANDLE_BYTES),
                                  region_bytes=nbytes, offset=0)


def _expandable_segment_handle(tensor) -> cuda_ipc.CudaIpcHandle:
    """What cuda_ipc_handle does for memory from an expandable segment
    (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): torch's handle has
    type 'e', which has no cudaIpcMemHandle_t."""
    cuda_ipc.memory_handle(bytes([1, ord("e")]) + bytes(cuda_ipc.HANDLE_BYTES))
    raise AssertionError("memory_handle accepted an expandable segment")


class _RecordingClient:
    """register_cuda_tensor / unregister_shm as calls in order; regions
    start at byte 512 of their allocation."""
    client_id = "test"

    def __init__(self):
        self.calls = []

    def register_cuda_tensor(self, name, tensor):
        self.calls.append(("register", name, tensor.numel()))
        return ShmTensor(name, 512, tuple(tensor.shape), cuda_ipc.numpy_dtype(tensor))

    def unregister_shm(self, name=""):
        self.calls.append(("unregister", name))


@unittest.skipIf(torch is None, "needs torch (Debian: python3-torch)")
class CudaSlotLayoutTest(unittest.TestCase):

    def test_halves_are_aligned_and_disjoint(self):
        import gradcomp.torch as gtorch
        slots, total = gtorch.cuda_slot_layout({3: 10, 0: 256, 1: 257})
        self.assertEqual(slots, {0: (0, 256), 1: (512, 1024), 3: (1536, 1792)})
        self.assertEqual(total, 2048)

    def test_no_buckets(self):
        import gradcomp.torch as gtorch
        self.assertEqual(gtorch.cuda_slot_layout({}), ({}, 0))


class MemoryHandleTest(unittest.TestCase):

    def test_bare_and_versioned_handles(self):
        raw = bytes(range(64))
        self.assertEqual(cuda_ipc.memory_handle(raw), raw)
        self.assertEqual(cuda_ipc.memory_handle(b"\x02c" + raw), raw)
        self.assertEqual(cuda_ipc.memory_handle(b"\x03c" + raw), raw)

    def test_other_handles_are_refused(self):
        with self.assertRaisesRegex(ValueError, "expandable_segments"):
            cuda_ipc.memory_handle(b"\x02e" + bytes(80))
        with self.assertRaisesRegex(ValueError, "10-byte CUDA IPC handle"):
            cuda_ipc.memory_handle(bytes(10))


@unittest.skipIf(torch is None, "needs torch (Debian: python3-torch)")
class CudaStagingTest(unittest.TestCase):

    def setUp(self):
        import gradcomp.torch as gtorch
        self.client = _RecordingClient()
        self.staging = gtorch._CudaStaging(self.client, "job", torch.device("cpu"))

    def test_a_bucket_that_does_not_fit_gets_a_new_region(self):
        region, first, second, source, target = self.staging.slot(0, 1000)
        self.assertEqual((region, first, second), ("job.test.cuda.1", 512, 512 + 1024))
        self.assertEqual((source.numel(), target.numel()), (1000, 1000))

        self.assertEqual(self.staging.slot(0, 1000)[:3], (region, first, second))
        self.assertEqual(self.staging.slot(0, 600)[:3], (region, first, second))
        self.assertEqual(len(self.client.calls), 1)

        self.staging.slot(1, 100)  # a new bucket: 2560 bytes, doubled
        region3, first3, second3, *_ = self.staging.slot(0, 2000)  # bucket 0 grows
        self.assertEqual(self.client.calls, [
            ("register", "job.test.cuda.1", 2048),
            ("unregister", "job.test.cuda.1"),
            ("register", "job.test.cuda.2", 4096),
            ("unregister", "job.test.cuda.2"),
            ("register", "job.test.cuda.3", 8192)])
        self.assertEqual((region3, first3, second3), ("job.test.cuda.3", 512, 512 + 2048))
        # Bucket 1 kept its room in the new buffer.
        self.assertEqual(self.staging.slot(1, 100)[:3],
                         ("job.test.cuda.3", 512 + 4096, 512 + 4096 + 256))
        # A bucket that fits in the buffer's room keeps the region.
        self.assertEqual(self.staging.slot(2, 1000)[:3],
                         ("job.test.cuda.3", 512 + 4608, 512 + 4608 + 1024))
        self.assertEqual(len(self.client.calls), 5)

    def test_slots_are_views_of_one_buffer(self):
        _, _, _, source0, target0 = self.staging.slot(0, 8)
        self.staging.slot(1, 8)
        _, _, _, source0, target0 = self.staging.slot(0, 8)
        _, _, _, source1, target1 = self.staging.slot(1, 8)
        for i, view in enumerate((source0, target0, source1, target1)):
            view.fill_(i + 1)
        self.assertEqual([int(v.sum()) for v in (source0, target0, source1, target1)],
                         [8, 16, 24, 32])

    def test_close_unregisters_once(self):
        self.staging.probe()
        self.staging.close()
        self.staging.close()
        self.assertEqual(self.client.calls, [("register", "job.test.cuda.1", 256),
                                             ("unregister", "job.test.cuda.1")])


@unittest.skipIf(torch is None, "needs torch (Debian: python3-torch)")
class CudaTransportChoiceTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(["--allow_client_shm"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.close()

    def _state(self, target: str, cuda_ipc: bool | None):
        import gradcomp.torch as gtorch
        state = gtorch.HookState(_model(), target, job="choice", cuda_ipc=cuda_ipc)
        self.addCleanup(state.close)
        return state

    def _choose(self, state, handle=_cpu_handle) -> list[warnings.WarningMessage]:
        with warnings.catch_warnings(record=True) as caught, \
                mock.patch("gradcomp.cuda_ipc.cuda_ipc_handle", handle):
            warnings.simplefilter("always")
            state._choose_cuda_transport(torch.device("cpu"))
        return [w for w in caught if issubclass(w.category, RuntimeWarning)]

    @unittest.skipIf(torch is not None and torch.cuda.is_available(), "a GPU answers here")
    def test_a_daemon_without_a_gpu_means_host_memory_and_one_warning(self):
        state = self._state(self.daemon.target, None)
        caught = self._choose(state)
        self.assertEqual(state.cuda_transport, "host")
        self.assertIn("this gradcompd has no usable CUDA device", state.cuda_transport_reason)
        self.assertEqual(len(caught), 1)
        self.assertIn("copied through host memory", str(caught[0].message))
        self.assertIn("no usable CUDA device", str(caught[0].message))
        self.assertEqual(state.client.shm_status(), {})

    @unittest.skipIf(torch is not None and torch.cuda.is_available(), "a GPU answers here")
    def test_cuda_ipc_required_fails_with_the_daemons_reason(self):
        state = self._state(self.daemon.target, True)
        with self.assertRaises(gradcomp.GradcompError) as error:
            self._choose(state)
        self.assertEqual(error.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(state.cuda_transport, "")

    def test_an_expandable_segment_means_host_memory_and_one_warning(self):
        # clients.md: auto mode falls back to host memory; cuda_ipc=True
        # raises the reason.
        state = self._state(self.daemon.target, None)
        caught = self._choose(state, _expandable_segment_handle)
        self.assertEqual(state.cuda_transport, "host")
        self.assertIn("expandable segment", state.cuda_transport_reason)
        self.assertEqual(len(caught), 1)
        self.assertIn("expandable segment", str(caught[0].message))
        state = self._state(self.daemon.target, True)
        with self.assertRaisesRegex(ValueError, "expandable segment"):
            self._choose(state, _expandable_segment_handle)
        self.assertEqual(state.cuda_transport, "")

    def test_cuda_ipc_off_asks_nothing_and_warns_nothing(self):
        state = self._state("127.0.0.1:1", False)  # nothing listens there
        self.assertEqual(self._choose(state), [])
        self.assertEqual((state.cuda_transport, state.cuda_transport_reason),
                         ("host", "cuda_ipc=False"))

    def test_a_remote_daemon_is_never_sent_a_handle(self):
        state = self._state("remote.invalid:50051", None)
        caught = self._choose(state)
        self.assertEqual((state.cuda_transport, state.cuda_transport_reason),
                         ("host", "the daemon is remote"))
        self.assertEqual(len(caught), 1)
        state = self._state("remote.invalid:50051", True)
        with self.assertRaisesRegex(ValueError, "cuda_ipc=True.*not on this host"):
            self._choose(state)


if __name__ == "__main__":
    unittest.main()
