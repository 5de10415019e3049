"""How the Client reports bad arguments and broken or bad ReduceStreams,
against a stand-in for gradcompd served here (no daemon binary needed)
whose replies each test scripts.
"""
import concurrent.futures
import pickle
import threading
import types
import unittest
from unittest import mock

import grpc
import numpy as np

import gradcomp
from gradcomp import cuda_ipc
from gradcomp.shm import ShmRegion, ShmTensor
from gradcomp.v1 import gradcomp_pb2, gradcomp_pb2_grpc


def _result(request, request_id=None):
    """A reply with `request`'s own data as its result."""
    return gradcomp_pb2.ReduceStreamResponse(result=gradcomp_pb2.ReduceResponse(
        tensor=request.tensor, step=request.step,
        request_id=request.request_id if request_id is None else request_id,
        dtype=request.dtype, data=request.data,
        stats=gradcomp_pb2.ReduceStats(codec="none", raw_bytes=len(request.data))))


def _error(request, code, message, request_id=None):
    return gradcomp_pb2.ReduceStreamResponse(
        error_code=code.value[0], error_message=message, tensor=request.tensor,
        request_id=request.request_id if request_id is None else request_id)


class _Daemon(gradcomp_pb2_grpc.GradcompServicer):
    """ReduceStream reads every request, then yields what answer(requests,
    context) yields (which may end the call with context.abort)."""

    def __init__(self):
        self.answer = None

    def ReduceStream(self, request_iterator, context):
        yield from self.answer(list(request_iterator), context)

    def SetPolicy(self, request, context):
        # As a daemon that predates SetPolicyRequest.from_step: it applies
        # the policy at once and echoes no step.
        return gradcomp_pb2.SetPolicyResponse(hash="0123456789abcdef")


class StandInTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.daemon = _Daemon()
        cls.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        gradcomp_pb2_grpc.add_GradcompServicer_to_server(cls.daemon, cls.server)
        port = cls.server.add_insecure_port("127.0.0.1:0")
        cls.server.start()
        cls.client = gradcomp.Client(f"127.0.0.1:{port}", timeout=30.0)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop(None)

    def setUp(self):
        self.daemon.answer = None


class OlderDaemonTest(StandInTest):

    def test_a_step_a_daemon_ignored_is_an_error(self):
        policy = gradcomp_pb2.Policy()
        self.assertEqual(self.client.set_policy(policy), "0123456789abcdef")
        with self.assertRaises(gradcomp.GradcompError) as caught:
            self.client.set_policy(policy, from_step=100)
        self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("does not know from_step", str(caught.exception))


class ReduceManyAnswersTest(StandInTest):
    tensors = {name: np.full(4, i, np.float32) for i, name in enumerate("abc")}

    def test_a_stream_that_ends_in_an_error_keeps_what_was_answered(self):
        def answer(requests, context):
            a, b, _ = requests
            yield _result(a)
            yield _error(b, grpc.StatusCode.INVALID_ARGUMENT, "b is bad")
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

        self.daemon.answer = answer
        with self.assertRaises(gradcomp.GradcompError) as caught:
            self.client.reduce_many(self.tensors, step=0)
        error = caught.exception
        self.assertEqual(error.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertEqual(error.failures,
                         {"b": (grpc.StatusCode.INVALID_ARGUMENT, "b is bad")})
        self.assertEqual(list(error.completed), ["a"])
        np.testing.assert_array_equal(error.completed["a"][0], self.tensors["a"])
        self.assertIn("Deadline Exceeded; 1 of 3 tensors failed, first: b is bad; "
                      "the stream ended without an answer for ['c']", str(error))

    def test_a_tensor_left_unanswered_beside_a_failure_is_named(self):
        def answer(requests, context):
            a, b, _ = requests
            yield _error(b, grpc.StatusCode.NOT_FOUND, "b is gone")
            yield _result(a)

        self.daemon.answer = answer
        with self.assertRaises(gradcomp.GradcompError) as caught:
            self.client.reduce_many(self.tensors, step=0)
        error = caught.exception
        self.assertEqual(error.code, grpc.StatusCode.NOT_FOUND)
        self.assertEqual(list(error.failures), ["b"])
        self.assertEqual(list(error.completed), ["a"])
        self.assertIn("the stream ended without an answer for ['c']", str(error))

    def test_an_answer_to_a_request_never_sent_is_internal(self):
        replies = {
            "result": lambda a: _result(a, request_id=3),
            "error": lambda a: _error(a, grpc.StatusCode.ABORTED, "?", request_id=3),
        }
        for what, reply in replies.items():
            with self.subTest(what):
                self.daemon.answer = lambda requests, context: iter([reply(requests[0])])
                with self.assertRaises(gradcomp.GradcompError) as caught:
                    self.client.reduce_many(self.tensors, step=0)
                self.assertEqual(caught.exception.code, grpc.StatusCode.INTERNAL)
                self.assertIn("bad reply from gradcompd: request_id 3, expected one "
                              "of the 3 sent (0 to 2)", str(caught.exception))


class ReduceManyShmAnswersTest(StandInTest):
    # Laid out alike in one region: with parts, one request of three parts.
    tensors = {name: (ShmTensor("r", 16 * i, (4,), np.dtype(np.float32)),
                      ShmTensor("r", 1024 + 16 * i, (4,), np.dtype(np.float32)))
               for i, name in enumerate("abc")}

    def _parts(self, replies):
        """answer() for a request with parts: the part replies `replies`
        makes of the parts (as requests), in one reply."""
        def answer(requests, context):
            (request,) = requests
            parts = [gradcomp_pb2.ReduceRequest(tensor=part.tensor, request_id=i)
                     for i, part in enumerate(request.parts)]
            yield gradcomp_pb2.ReduceStreamResponse(
                request_id=request.request_id, part_results=replies(parts))
        return answer

    def test_a_stream_that_ends_in_an_error_keeps_what_was_answered(self):
        def answer(requests, context):
            yield _result(requests[0])
            context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon went away")

        self.daemon.answer = answer
        with self.assertRaises(gradcomp.GradcompError) as caught:
            self.client.reduce_many_shm(self.tensors, step=0, parts=False)
        error = caught.exception
        self.assertEqual(error.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(error.failures, {})
        self.assertEqual(list(error.completed), ["a"])
        self.assertEqual(error.completed["a"].codec, "none")
        self.assertIn("the stream ended without an answer for ['b', 'c']", str(error))

    def test_failures_come_with_the_completed_tensors(self):
        self.daemon.answer = self._parts(lambda parts: [
            _result(parts[0]), _error(parts[1], grpc.StatusCode.INVALID_ARGUMENT, "no"),
            _result(parts[2])])
        with self.assertRaises(gradcomp.GradcompError) as caught:
            self.client.reduce_many_shm(self.tensors, step=0)
        self.assertEqual(list(caught.exception.failures), ["b"])
        self.assertEqual(list(caught.exception.completed), ["a", "c"])

    def test_answers_to_requests_never_sent_are_internal(self):
        cases = {
            "result per tensor": (False, lambda requests, context: iter(
                [_result(requests[0], request_id=7)])),
            "error per tensor": (False, lambda requests, context: iter(
                [_error(gradcomp_pb2.ReduceRequest(), grpc.StatusCode.ABORTED, "?",
                        request_id=7)])),
            "part result": (True, self._parts(lambda parts: [
                _result(parts[0]), _result(parts[1]), _result(parts[2], request_id=7)])),
            "part error": (True, self._parts(lambda parts: [
                _result(parts[0]), _result(parts[1]),
                _error(gradcomp_pb2.ReduceRequest(), grpc.StatusCode.ABORTED, "?",
                       request_id=7)])),
            "request": (True, lambda requests, context: iter(
                [gradcomp_pb2.ReduceStreamResponse(request_id=7)])),
        }
        for what, (parts, answer) in cases.items():
            with self.subTest(what):
                self.daemon.answer = answer
                with self.assertRaises(gradcomp.GradcompError) as caught:
                    self.client.reduce_many_shm(self.tensors, step=0, parts=parts)
                self.assertEqual(caught.exception.code, grpc.StatusCode.INTERNAL)
                self.assertIn("bad reply from gradcompd: request_id 7, expected one of "
                              "the", str(caught.exception))

    def test_a_second_answer_for_a_tensor_is_internal(self):
        self.daemon.answer = lambda requests, context: iter(
            [_result(requests[0]), _result(requests[1]), _result(requests[1]),
             _result(requests[2])])
        with self.assertRaises(gradcomp.GradcompError) as caught:
            self.client.reduce_many_shm(self.tensors, step=0, parts=False)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INTERNAL)
        self.assertIn("a second answer for tensor 'b'", str(caught.exception))


class BadReplyCancelsTheStreamTest(StandInTest):
    """A bad reply ends the call at once, though the caller keeps the error
    (and with its traceback the client's frame, which would otherwise keep
    the stream open until the deadline)."""

    def _answer_then_wait(self, reply):
        ended = threading.Event()

        def answer(requests, context):
            context.add_callback(ended.set)
            yield reply(requests)
            ended.wait(20)  # until the client cancels; the deadline is 30 s
        self.daemon.answer = answer
        return ended

    def test_after_reduce_many(self):
        ended = self._answer_then_wait(lambda requests: _result(requests[0], 9))
        kept = None
        try:
            self.client.reduce_many({"a": np.ones(4, np.float32)}, step=0)
        except gradcomp.GradcompError as error:
            kept = error
        self.assertIn("request_id 9", str(kept))
        self.assertTrue(ended.wait(10), "the stream was left open")

    def test_after_reduce_many_shm(self):
        ended = self._answer_then_wait(lambda requests: _result(requests[0], 9))
        source = ShmTensor("r", 0, (4,), np.dtype(np.float32))
        target = ShmTensor("r", 16, (4,), np.dtype(np.float32))
        kept = None
        try:
            self.client.reduce_many_shm({"a": (source, target)}, step=0, parts=False)
        except gradcomp.GradcompError as error:
            kept = error
        self.assertIn("request_id 9", str(kept))
        self.assertTrue(ended.wait(10), "the stream was left open")


class GradcompErrorTest(unittest.TestCase):

    def test_it_pickles_whole(self):
        # As a worker process's error reaches its pool.
        error = gradcomp.GradcompError(
            "ReduceStream", "127.0.0.1:1", grpc.StatusCode.INVALID_ARGUMENT,
            "bad", {"w": (grpc.StatusCode.INVALID_ARGUMENT, "bad")})
        error.completed = {"b": "its stats"}
        again = pickle.loads(pickle.dumps(error))
        self.assertIsInstance(again, gradcomp.GradcompError)
        self.assertEqual(str(again), str(error))
        for field in ("rpc", "target", "code", "details", "failures", "completed"):
            self.assertEqual(getattr(again, field), getattr(error, field), field)


class ArgumentTest(StandInTest):
    """Bad arguments raise ValueError naming them before any call."""

    def test_steps_outside_int64_or_negative(self):
        x = np.zeros(4, np.float32)
        source = ShmTensor("r", 0, (4,), x.dtype)
        target = ShmTensor("r", 16, (4,), x.dtype)
        calls = {
            "reduce": lambda step: self.client.reduce(x, "t", step),
            "reduce_many": lambda step: self.client.reduce_many({"t": x}, step),
            "reduce_shm": lambda step: self.client.reduce_shm("t", step, source, target),
            "reduce_many_shm": lambda step: self.client.reduce_many_shm(
                {"t": (source, target)}, step),
        }
        for what, call in calls.items():
            for step in (-1, 2**63):
                with self.subTest(what, step=step):
                    with self.assertRaisesRegex(
                            ValueError, rf"^step {step}: expected 0 <= step <= 2\*\*63 - 1$"):
                        call(step)

    def test_reduce_many_raises_a_bad_request_field_itself(self):
        # Not gRPC's "Exception iterating requests!": the requests are built
        # before the stream starts.
        with self.assertRaisesRegex(TypeError, "7 has type int"):
            self.client.reduce_many({7: np.zeros(4, np.float32)}, step=0)

    def test_register_shm_offset_and_byte_size_within_the_region(self):
        with ShmRegion(64, tag="py-test") as region:
            cases = [
                (dict(offset=128), r"offset 128, expected 0 to 63 \(the region holds 64 bytes\)"),
                (dict(offset=-1), "offset -1, expected 0 to 63"),
                (dict(offset=64), "offset 64, expected 0 to 63"),
                (dict(byte_size=65), r"byte_size 65, expected 1 to 64 \(the region holds "
                                     r"64 bytes, from offset 0\)"),
                (dict(offset=16, byte_size=49), "byte_size 49, expected 1 to 48"),
                (dict(byte_size=0), "byte_size 0, expected 1 to 64"),
            ]
            for kwargs, message in cases:
                with self.subTest(**kwargs), self.assertRaisesRegex(ValueError, message):
                    self.client.register_shm("r", region, **kwargs)

    def test_shm_offsets_outside_uint64(self):
        good = ShmTensor("r", 0, (4,), np.dtype(np.float32))
        for bad in (ShmTensor("r", -8, (4,), good.dtype),
                    ShmTensor("r", 2**64, (4,), good.dtype)):
            for source, target in ((bad, good), (good, bad)):
                with self.subTest(source=source.offset, target=target.offset):
                    with self.assertRaisesRegex(
                            ValueError, rf"tensor 't': offsets {source.offset} \(input\) "
                                        rf"and {target.offset} \(output\), expected 0 to "
                                        rf"2\*\*64 - 1"):
                        self.client.reduce_shm("t", 0, source, target)


class RegisterCudaTensorTest(unittest.TestCase):
    """register_cuda_tensor with stand-ins for a torch tensor and its IPC
    handle, and the registration recorded rather than sent."""

    def setUp(self):
        self.client = gradcomp.Client("unix:/nonexistent/gradcomp.sock")
        self.addCleanup(self.client.close)
        handle = cuda_ipc.CudaIpcHandle(device=0, raw=bytes(cuda_ipc.HANDLE_BYTES),
                                        region_bytes=4096, offset=512)
        self.addCleanup(mock.patch.stopall)
        mock.patch.object(cuda_ipc, "cuda_ipc_handle", return_value=handle).start()
        self.registered = mock.patch.object(self.client, "register_cuda_shm").start()

    def test_a_dtype_numpy_lacks_is_refused_before_registering(self):
        tensor = types.SimpleNamespace(dtype="torch.bfloat16", shape=(8,))
        with self.assertRaisesRegex(
                ValueError, r"register_cuda_tensor 'g': torch.bfloat16 has no numpy "
                            r"dtype for the slice; expected torch.float16, "
                            r"torch.float32 or torch.float64"):
            self.client.register_cuda_tensor("g", tensor)
        self.registered.assert_not_called()

    def test_float_and_byte_tensors_register(self):
        for dtype in ("float16", "float32", "float64", "uint8"):
            with self.subTest(dtype):
                tensor = types.SimpleNamespace(dtype=f"torch.{dtype}", shape=(8,))
                self.assertEqual(self.client.register_cuda_tensor("g", tensor),
                                 ShmTensor("g", 512, (8,), np.dtype(dtype)))
                self.registered.assert_called_with("g", bytes(64), 0, 4096)


if __name__ == "__main__":
    unittest.main()
