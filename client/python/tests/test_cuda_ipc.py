"""CUDA IPC from Python: gradcomp.cuda_ipc and Client.register_cuda_*
against a real gradcompd started here.

Without a GPU (CI) the daemon must refuse a well-formed handle with
FAILED_PRECONDITION "this gradcompd has no usable CUDA device" and malformed
ones with INVALID_ARGUMENT. With a GPU and a CUDA torch, a CUDA tensor is
registered and reduced through, and must equal the inline path.

Needs the daemon binary: `bazel build //service:gradcompd`, or $GRADCOMPD.
"""
import fcntl
import os
import unittest

import grpc
import numpy as np
import torch

import gradcomp
from gradcomp import cuda_ipc
from gradcomp.testing import Daemon
from gradcomp.v1 import gradcomp_pb2


class CudaIpcHandleTest(unittest.TestCase):

    def test_cpu_tensors_are_refused(self):
        with self.assertRaisesRegex(ValueError, "expected a CUDA tensor"):
            cuda_ipc.cuda_ipc_handle(torch.zeros(4))

    def test_numpy_dtype(self):
        self.assertEqual(cuda_ipc.numpy_dtype(torch.zeros(1, dtype=torch.float16)),
                         np.dtype(np.float16))


class _DaemonTest(unittest.TestCase):
    """One daemon with client shared memory on for the class's tests."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(["--allow_client_shm"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.close()


class CudaRegistrationTest(_DaemonTest):

    def test_malformed_requests_are_invalid_arguments(self):
        with gradcomp.Client(self.daemon.target) as client:
            for handle, device, size in ((b"x" * 10, 0, 64),
                                         (bytes(64), -1, 64),
                                         (bytes(64), 0, 0)):
                with self.assertRaises(gradcomp.GradcompError) as error:
                    client.register_cuda_shm("dev", handle, device, size)
                self.assertEqual(error.exception.code,
                                 grpc.StatusCode.INVALID_ARGUMENT)
            self.assertEqual(client.shm_status(), {})

    @unittest.skipIf(torch.cuda.is_available(), "a GPU answers here")
    def test_without_a_gpu_the_daemon_says_why(self):
        with gradcomp.Client(self.daemon.target) as client:
            with self.assertRaises(gradcomp.GradcompError) as error:
                client.register_cuda_shm("dev", bytes(64), 0, 4096)
            self.assertEqual(error.exception.code,
                             grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("this gradcompd has no usable CUDA device: ",
                          error.exception.details)
            self.assertEqual(client.shm_status(), {})

    @unittest.skipUnless(torch.cuda.is_available(), "needs a CUDA torch and GPU")
    def test_a_cuda_tensor_reduces_like_the_inline_path(self):
        g = torch.linspace(-3, 3, 4096, dtype=torch.float32)
        source = g.cuda()
        target = torch.zeros_like(source)
        with gradcomp.Client(self.daemon.target) as client:
            src = client.register_cuda_tensor("py.src", source)
            dst = client.register_cuda_tensor("py.dst", target)
            client.reduce_shm("fc.cuda", 1, src, dst, codec="fp16")
            torch.cuda.synchronize()
            inline, _ = client.reduce(g.numpy(), "fc.inline", 1, codec="fp16")
            np.testing.assert_array_equal(target.cpu().numpy(), inline)
            client.unregister_shm("py.src")
            client.unregister_shm("py.dst")


def lock_held(key: str) -> bool:
    """True while some open file description holds a flock on /dev/shm/key."""
    fd = os.open("/dev/shm" + key, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


class CudaLivenessLockTest(_DaemonTest):
    """The lock object a Client ties its CUDA regions to, and what the
    daemon makes of lock keys (it checks the lock before any GPU)."""

    def test_one_held_lock_per_client_until_close(self):
        client = gradcomp.Client(self.daemon.target)
        key = client._cuda_lock_key()
        self.assertTrue(key.startswith("/gradcomp.cuda-lock."), key)
        self.assertEqual(client._cuda_lock_key(), key)
        self.assertEqual(os.path.getsize("/dev/shm" + key), 1)
        self.assertTrue(lock_held(key))
        other = gradcomp.Client(self.daemon.target)
        self.assertNotEqual(other._cuda_lock_key(), key)
        other.close()
        client.close()
        self.assertFalse(os.path.exists("/dev/shm" + key))
        client.close()  # twice is fine

    def test_registration_sends_the_lock(self):
        with gradcomp.Client(self.daemon.target) as client:
            sent = []
            send = client._shm_call

            def recording(rpc, request):
                sent.append((request, lock_held(request.lock_key)))
                return send(rpc, request)

            client._shm_call = recording
            with self.assertRaises(gradcomp.GradcompError):
                client.register_cuda_shm("dev", bytes(64), 0, 4096)
            # The request names the client's lock, made for the call and
            # held during it.
            self.assertEqual(len(sent), 1)
            request, held = sent[0]
            self.assertTrue(request.lock_key.startswith("/gradcomp.cuda-lock."))
            self.assertTrue(held)
            # The daemon registered nothing on it, so it is gone at once: a
            # process killed later would otherwise leave it in /dev/shm,
            # where nothing reclaims a key the daemon never learnt.
            self.assertIsNone(client._cuda_lock)
            self.assertFalse(os.path.exists("/dev/shm" + request.lock_key))

    def test_bad_lock_keys_are_refused_before_the_device(self):
        cases = (("/gradcomp.absent-lock", grpc.StatusCode.NOT_FOUND, "lock_key: "),
                 ("/elsewhere", grpc.StatusCode.PERMISSION_DENIED,
                  "lock_key '/elsewhere' is outside the allowed prefix"))
        with gradcomp.Client(self.daemon.target) as client:
            for key, code, says in cases:
                request = gradcomp_pb2.RegisterCudaSharedMemoryRequest(
                    name="dev", raw_handle=bytes(64), device_id=0,
                    byte_size=4096, lock_key=key)
                with self.assertRaises(gradcomp.GradcompError) as error:
                    client._shm_call("RegisterCudaSharedMemory", request)
                self.assertEqual(error.exception.code, code, key)
                self.assertIn(says, error.exception.details)
            self.assertEqual(client.shm_status(), {})


if __name__ == "__main__":
    unittest.main()
