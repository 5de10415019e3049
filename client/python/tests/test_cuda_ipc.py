"""CUDA IPC from Python: gradcomp.cuda_ipc and Client.register_cuda_*
against a real gradcompd started here.

Without a GPU (CI) the daemon must refuse a well-formed handle with
FAILED_PRECONDITION "this gradcompd has no usable CUDA device" and malformed
ones with INVALID_ARGUMENT. With a GPU and a CUDA torch, a CUDA tensor is
registered and reduced through, and must equal the inline path.

Needs the daemon binary: `bazel build //service:gradcompd`, or $GRADCOMPD.
"""
import unittest

import grpc
import numpy as np
import torch

import gradcomp
from gradcomp import cuda_ipc
from gradcomp.testing import Daemon


class CudaIpcHandleTest(unittest.TestCase):

    def test_cpu_tensors_are_refused(self):
        with self.assertRaisesRegex(ValueError, "expected a CUDA tensor"):
            cuda_ipc.cuda_ipc_handle(torch.zeros(4))

    def test_numpy_dtype(self):
        self.assertEqual(cuda_ipc.numpy_dtype(torch.zeros(1, dtype=torch.float16)),
                         np.dtype(np.float16))


class CudaRegistrationTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(["--allow_client_shm"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

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


if __name__ == "__main__":
    unittest.main()
