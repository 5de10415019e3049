"""The Python client against a real gradcompd (world size 1), started here.

Needs the daemon binary: `bazel build //service:gradcompd`, or $GRADCOMPD.
"""
import concurrent.futures
import signal
import time
import unittest

import grpc
import numpy as np

import gradcomp
from gradcomp import metrics
from gradcomp.testing import Daemon, free_port, start_peered
from gradcomp.v1 import gradcomp_pb2


def _gradient(shape, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.standard_t(3.0, size=shape) * 1e-3).astype(dtype)


def _fp16_policy(glob: str) -> gradcomp_pb2.Policy:
    """fp16 for the tensors `glob` matches, dense from 16 elements, 1-D too."""
    return gradcomp_pb2.Policy(
        rules=[gradcomp_pb2.PolicyRule(name_glob=glob,
                                       codec=gradcomp_pb2.CodecSpec(name="fp16"))],
        dense_below_numel=16, dense_1d=False)


class ClientTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        # Every reduce measured: the tests compare each one's reported error.
        cls.daemon = Daemon(["--error_sample_rate=1"]).start()
        cls.client = gradcomp.Client(cls.daemon.target, timeout=60.0)
        cls.info = cls.client.info()
        cls.codecs = {c.name: c for c in cls.info.codecs}

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()

    def tearDown(self):
        self.assertTrue(self.daemon.running(),
                        f"gradcompd exited; its log:\n{self.daemon.log()[-4000:]}")

    def test_info(self):
        self.assertEqual(self.info.world_size, 1)
        self.assertEqual(self.info.rank, 0)
        self.assertTrue(self.info.version)
        self.assertGreaterEqual(self.info.wire_format_version, 1)
        for name in ("none", "fp16", "bf16", "topk", "qsgd"):
            self.assertIn(name, self.codecs)
        self.assertTrue(self.codecs["none"].summable)
        self.assertTrue(self.codecs["topk"].stateful)

    def test_none_is_exact_in_every_dtype_and_shape(self):
        for dtype, shape in ((np.float32, (3, 5, 7)), (np.float16, (64,)),
                             (np.float32, ()), (np.float64, (4, 4)),
                             (np.float32, (0, 3))):
            with self.subTest(dtype=dtype, shape=shape):
                x = _gradient(shape, dtype=dtype)
                out, stats = self.client.reduce(x, f"exact/{np.dtype(dtype)}/{shape}",
                                                step=0, codec="none")
                self.assertEqual(out.dtype, x.dtype)
                self.assertEqual(out.shape, x.shape)
                # Codecs compute in fp32: float64 comes back rounded to fp32.
                want = x.astype(np.float32).astype(dtype)
                np.testing.assert_array_equal(out, want)
                self.assertEqual(stats.codec, "none")
                self.assertEqual(stats.raw_bytes, x.size * 4)
                self.assertEqual(stats.world_size, 1)

    def test_result_is_writable_and_big_endian_input_accepted(self):
        x = _gradient((100,)).astype(">f4")
        out, _ = self.client.reduce(x, "endian", step=0, codec="none")
        np.testing.assert_array_equal(out, x.astype("<f4"))
        out[0] = 1.0

    def test_fp16_codec_within_half_precision(self):
        x = _gradient((1000,), seed=1) * 100  # mostly fp16 normal range
        out, stats = self.client.reduce(x, "fp16", step=0, codec="fp16")
        self.assertEqual(out.dtype, np.float32)
        np.testing.assert_allclose(out, x, rtol=2.0 ** -11, atol=2.0 ** -24)
        self.assertLess(stats.wire_bytes, stats.raw_bytes)

    def test_compressing_codecs_report_the_error_of_their_result(self):
        x = _gradient((64, 256), seed=2)
        norm = np.linalg.norm(x.astype(np.float64))
        for codec in self.codecs:
            with self.subTest(codec=codec):
                # A fresh tensor at step 0: no residual or momentum yet, so
                # with one worker the result is D(C(x)) and its error is the
                # daemon's reported one.
                out, stats = self.client.reduce(x, f"err/{codec}", step=0, codec=codec)
                self.assertEqual(stats.codec, codec)
                self.assertEqual(out.shape, x.shape)
                mine = np.linalg.norm(x.astype(np.float64) - out) / norm
                self.assertTrue(np.isfinite(stats.relative_error), stats)
                self.assertAlmostEqual(stats.relative_error, mine,
                                       delta=1e-4 + 1e-3 * mine)

    def test_topk_keeps_the_largest_entries(self):
        # sample=1 selects the exact top k; by default DGC estimates the
        # threshold from a sample and keeps about k.
        x = _gradient((10000,), seed=3)
        out, stats = self.client.reduce(x, "topk/ratio", step=0, codec="topk",
                                        params={"ratio": 0.01, "sample": 1})
        kept = np.flatnonzero(out)
        self.assertEqual(len(kept), 100)
        threshold = np.sort(np.abs(x))[-100]
        self.assertTrue(np.all(np.abs(x[kept]) >= threshold))
        np.testing.assert_array_equal(out[kept], x[kept])
        self.assertGreater(stats.ratio, 10)

    def test_tensor_larger_than_grpc_default_limit(self):
        x = _gradient((2048, 1000), seed=4)  # 8 MB, like ResNet-50's fc.weight
        out, stats = self.client.reduce(x, "large", step=0, codec="none")
        np.testing.assert_array_equal(out, x)
        self.assertEqual(stats.raw_bytes, x.nbytes)

    def test_reduce_many_returns_every_tensor_in_order(self):
        tensors = {f"bucket/{i}": _gradient((i + 1, 33), seed=i) for i in range(6)}
        results = self.client.reduce_many(tensors, step=0, codec="none")
        self.assertEqual(list(results), list(tensors))
        for name, (out, stats) in results.items():
            np.testing.assert_array_equal(out, tensors[name])
            self.assertEqual(stats.raw_bytes, tensors[name].nbytes)

    def test_reduce_many_reports_every_failed_tensor(self):
        tensors = {"bad/a": _gradient((8,)), "bad/b": _gradient((9,))}
        with self.assertRaises(gradcomp.GradcompError) as caught:
            self.client.reduce_many(tensors, step=0, codec="no-such-codec")
        self.assertEqual(set(caught.exception.failures), set(tensors))
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("no-such-codec", str(caught.exception))

    def test_bad_requests_get_invalid_argument(self):
        x = _gradient((16,))
        cases = [
            dict(codec="no-such-codec"),
            dict(codec="topk", params={"ratio": 2.0}),
            dict(codec="topk", params={"no_such_param": 1}),
        ]
        for kwargs in cases:
            with self.subTest(**kwargs):
                with self.assertRaises(gradcomp.GradcompError) as caught:
                    self.client.reduce(x, "bad", step=0, **kwargs)
                self.assertEqual(caught.exception.code,
                                 grpc.StatusCode.INVALID_ARGUMENT)
                self.assertEqual(caught.exception.rpc, "Reduce")
        # Still serving.
        out, _ = self.client.reduce(x, "after-bad", step=0, codec="none")
        np.testing.assert_array_equal(out, x)

    def test_nan_and_inf_are_refused_by_compressing_codecs_and_passed_by_dense(self):
        x = _gradient((4096,))
        bad = x.copy()
        bad[17], bad[900] = np.nan, -np.inf
        with self.assertRaises(gradcomp.GradcompError) as caught:
            self.client.reduce(bad, "nan/topk", step=0, codec="topk")
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("input holds 2 NaN/Inf values (first at index 17", caught.exception.details)
        # Refused before the codec's state took them in: the next step of the
        # same tensor is finite.
        out, _ = self.client.reduce(x, "nan/topk", step=1, codec="topk")
        self.assertTrue(np.isfinite(out).all())
        # A dense codec passes them through, as an allreduce would.
        out, _ = self.client.reduce(bad, "nan/none", step=0, codec="none")
        self.assertTrue(np.isnan(out[17]) and out[900] == -np.inf)
        np.testing.assert_array_equal(np.delete(out, [17, 900]), np.delete(x, [17, 900]))

    def test_the_largest_step_is_reduced(self):
        x = _gradient((8,))
        out, _ = self.client.reduce(x, "last-step", step=2**63 - 1, codec="none")
        np.testing.assert_array_equal(out, x)

    def test_declared_tensor_list_guards_the_job(self):
        x = _gradient((4, 8))
        digest = self.client.declare_tensors(
            {"declared.w": ((4, 8), np.float32)}, job="declared")
        self.assertEqual(len(digest), 16)
        out, _ = self.client.reduce(x, "declared.w", step=0, job="declared", codec="none")
        np.testing.assert_array_equal(out, x)
        with self.assertRaises(gradcomp.GradcompError) as caught:
            self.client.reduce(x, "undeclared", step=0, job="declared", codec="none")
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("declared list", str(caught.exception))
        with self.assertRaisesRegex(TypeError, "int32"):
            self.client.declare_tensors({"i": ((2,), np.int32)}, job="declared")
        # Not numpy's bare "data type not understood": the tensor is named.
        with self.assertRaisesRegex(TypeError, "tensor 'b': dtype bfloat16 is not one of"):
            self.client.declare_tensors({"b": ((2,), "bfloat16")}, job="declared")

    def test_a_torch_dtype_declares_as_its_numpy_twin(self):
        try:
            import torch
        except ImportError:
            self.skipTest("needs torch (Debian: python3-torch)")
        # The same list as numpy's dtypes: the same hash (before, torch
        # dtypes were refused as "torch.float32 is not one of ... float32").
        numpy_digest = self.client.declare_tensors(
            {"w": ((4, 8), np.float32), "h": ((2,), np.float16)}, job="torch-declared")
        torch_digest = self.client.declare_tensors(
            {"w": ((4, 8), torch.float32), "h": ((2,), torch.float16)}, job="torch-declared")
        self.assertEqual(torch_digest, numpy_digest)
        with self.assertRaisesRegex(TypeError, "dtype torch.bfloat16 is not one of"):
            self.client.declare_tensors({"b": ((2,), torch.bfloat16)}, job="torch-declared")

    def test_client_side_type_errors(self):
        with self.assertRaisesRegex(TypeError, "int32"):
            self.client.reduce(np.arange(4, dtype=np.int32), "ints", step=0)
        with self.assertRaisesRegex(ValueError, "unique"):
            self.client.reduce_many([("a", _gradient((2,))), ("a", _gradient((2,)))], step=0)

    def test_policy_round_trip(self):
        original, original_hash = self.client.get_policy()
        self.assertEqual(original_hash, self.info.policy_hash)
        policy = _fp16_policy("policy-test/*")
        try:
            new_hash = self.client.set_policy(policy)
            self.assertNotEqual(new_hash, original_hash)
            got, got_hash = self.client.get_policy()
            self.assertEqual(got_hash, new_hash)
            self.assertEqual(got.rules[0].codec.name, "fp16")
            _, stats = self.client.reduce(_gradient((64,)), "policy-test/w", step=0)
            self.assertEqual(stats.codec, "fp16")
            _, stats = self.client.reduce(_gradient((8,)), "policy-test/tiny", step=0)
            self.assertEqual(stats.codec, "none")
            self.assertEqual(stats.dense_reason, "small")
        finally:
            self.assertEqual(self.client.set_policy(original), original_hash)

    def test_policy_from_a_step(self):
        original, original_hash = self.client.get_policy()
        policy = _fp16_policy("scheduled/*")
        try:
            new_hash = self.client.set_policy(policy, from_step=5)
            self.assertEqual(self.client.get_policy()[1], new_hash)
            for step, codec in ((4, "none"), (5, "fp16"), (6, "fp16")):
                _, stats = self.client.reduce(_gradient((64,)), "scheduled/w", step=step)
                self.assertEqual(stats.codec, codec, f"step {step}")
        finally:
            # Without a step it replaces the schedule: every step again.
            self.assertEqual(self.client.set_policy(original), original_hash)
        _, stats = self.client.reduce(_gradient((64,)), "scheduled/w", step=7)
        self.assertEqual(stats.codec, "none")

    def test_metrics_count_reduces_and_bytes(self):
        before = metrics.scrape(self.daemon.metrics_url)
        x = _gradient((50, 20))
        for step in range(3):
            self.client.reduce(x, "metrics/qsgd", step=step, codec="qsgd")
        after = metrics.scrape(self.daemon.metrics_url)

        def growth(name, **labels):
            return (metrics.total(after, name, **labels) -
                    metrics.total(before, name, **labels))

        self.assertEqual(growth("gradcomp_reduce_total", codec="qsgd", code="OK"), 3)
        self.assertEqual(growth("gradcomp_raw_bytes_total", codec="qsgd"), 3 * x.size * 4)
        wire = growth("gradcomp_wire_bytes_total", codec="qsgd")
        self.assertGreater(wire, 0)
        self.assertLess(wire, 3 * x.size * 4)


class PeeredStreamTest(unittest.TestCase):
    """World size 2, where rank 1 reduces only some of rank 0's tensors."""

    def test_a_stream_past_its_deadline_keeps_what_was_answered(self):
        daemons = start_peered(2, self.addCleanup)
        clients = [gradcomp.Client(d.target, timeout=60.0) for d in daemons]
        for client in clients:
            self.addCleanup(client.close)
        x = _gradient((8,))
        rank1 = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.addCleanup(rank1.shutdown)

        def reduce_on_rank1(*names):
            return rank1.submit(clients[1].reduce_many, {name: x for name in names},
                                step=0, codec="none")

        # The ranks connect on their first collective: one first, untimed.
        warm_up = reduce_on_rank1("warm-up")
        clients[0].reduce_many({"warm-up": x}, step=0, codec="none")
        warm_up.result()
        only_a = reduce_on_rank1("a")
        # Long enough for "a" on a busy machine; "b" waits it out.
        clients[0].timeout = 20.0
        with self.assertRaises(gradcomp.GradcompError) as caught:
            clients[0].reduce_many({"a": x, "b": x}, step=0, codec="none")
        self.assertEqual(list(only_a.result()), ["a"])
        error = caught.exception
        self.assertEqual(error.code, grpc.StatusCode.DEADLINE_EXCEEDED, error)
        self.assertEqual(error.failures, {})
        self.assertEqual(list(error.completed), ["a"])
        np.testing.assert_array_equal(error.completed["a"][0], x)
        self.assertIn("the stream ended without an answer for ['b']", str(error))


class DaemonShutdownTest(unittest.TestCase):

    def test_sigterm_ends_a_reduce_waiting_for_a_peer(self):
        """A stopping daemon answers a reduce that waits for a peer at
        once, instead of holding its exit until the collective's deadline
        (10 minutes here; a pod's grace period is 30 s)."""
        daemons = start_peered(2, self.addCleanup, ["--collective_timeout=10m"])
        client = gradcomp.Client(daemons[0].target, timeout=900.0)
        self.addCleanup(client.close)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.addCleanup(pool.shutdown)
        waiting = pool.submit(client.reduce, _gradient((8,)), "w", 0, codec="none")
        while daemons[0].metric("gradcomp_peer_waiting", peer="1") != 1:
            self.assertFalse(waiting.done(), waiting.done() and waiting.exception())
            time.sleep(0.05)
        daemons[0].process.send_signal(signal.SIGTERM)
        # Bounds a hang only: without the shutdown it took the 10 minutes.
        self.assertEqual(daemons[0].process.wait(timeout=120), 0, daemons[0].log())
        with self.assertRaises(gradcomp.GradcompError) as caught:
            waiting.result(timeout=60)
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("rank 0 is shutting down (SIGTERM); its in-flight reduces end",
                      caught.exception.details)


class WaitServingTest(unittest.TestCase):
    """wait_serving follows the daemon's health: NOT_SERVING while a peer
    is missing, SERVING once the mesh is up (a reduce before then waits
    out --collective_timeout and fails)."""

    def test_waits_for_the_peers(self):
        peers = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
        first = Daemon(["--rank=0", "--world_size=2", f"--peers={peers}"]).start()
        self.addCleanup(first.__exit__, None, None, None)
        with gradcomp.Client(first.target, timeout=5.0) as client:
            with self.assertRaises(gradcomp.GradcompError) as caught:
                client.wait_serving(timeout=1.0)
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertIn("not SERVING within 1.0 s (last: NOT_SERVING)",
                          str(caught.exception))
            second = Daemon(["--rank=1", "--world_size=2", f"--peers={peers}"]).start()
            self.addCleanup(second.__exit__, None, None, None)
            client.wait_serving(timeout=60.0)

    def test_no_daemon_is_named_at_the_timeout(self):
        with gradcomp.Client(f"127.0.0.1:{free_port()}", timeout=5.0) as client:
            with self.assertRaises(gradcomp.GradcompError) as caught:
                client.wait_serving(timeout=0.5)
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("(last: UNAVAILABLE", str(caught.exception))


class NoDaemonTest(unittest.TestCase):

    def test_unavailable(self):
        with gradcomp.Client(f"127.0.0.1:{free_port()}", timeout=5.0) as client:
            with self.assertRaises(gradcomp.GradcompError) as caught:
                client.info()
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("GetInfo to gradcompd at 127.0.0.1:", str(caught.exception))

    def test_a_socket_path_longer_than_an_address_holds_is_refused(self):
        # gRPC failed every call with "Failed to create secure client
        # channel", the reason only in its own log.
        with self.assertRaisesRegex(ValueError, "has 108 bytes; expected at most 107"):
            gradcomp.Client("unix:/" + "p" * 107)
        gradcomp.Client("unix:/" + "p" * 106).close()


if __name__ == "__main__":
    unittest.main()
