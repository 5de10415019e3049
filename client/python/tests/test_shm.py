"""Shared memory end to end: gradcomp.shm regions, the Client's shm methods,
and real gradcompd processes (world size 1 and 2) started here.

Needs the daemon binary: `bazel build //service:gradcompd`, or $GRADCOMPD.
"""
import errno
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import unittest

import grpc
import numpy as np

import gradcomp
from gradcomp.shm import DEFAULT_SHM_PREFIX, ShmRegion, ShmTensor
from gradcomp.testing import Daemon, daemon_binary, start_peered
from gradcomp.v1 import gradcomp_pb2


def _gradient(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)



class ShmRegionTest(unittest.TestCase):

    def test_mode_is_set_whatever_the_umask_and_keeps_the_owners_access(self):
        before = os.umask(0o022)
        try:
            region = ShmRegion(64, tag="py-test", mode=0o666)
        finally:
            os.umask(before)
        self.addCleanup(region.release)
        self.assertEqual(os.stat("/dev/shm" + region.key).st_mode & 0o777, 0o666)
        for mode in (0o400, 0o200, 0o4600):
            with self.assertRaisesRegex(ValueError, "0o600 at least"):
                ShmRegion(64, tag="py-test", mode=mode)

    def test_views_slices_and_release(self):
        region = ShmRegion(4096, tag="py-test")
        self.assertTrue(region.key.startswith(f"/gradcomp.py-test.{os.getpid()}."))
        self.assertTrue(os.path.exists("/dev/shm" + region.key))
        a = region.array((4, 8), offset=128)
        a[...] = 1.5
        again = region.array(32, offset=128)
        self.assertTrue(np.all(again == 1.5))
        t = region.tensor("r", a)
        self.assertEqual(t, ShmTensor("r", 128, (4, 8), np.dtype(np.float32)))
        self.assertEqual(t.byte_size, 128)
        with self.assertRaises(ValueError):
            region.array(1025)  # 4100 bytes
        for shape in ((-1,), (-2, 2)):  # a view of another size than named
            with self.assertRaisesRegex(ValueError, "negative dimension"):
                region.array(shape)
        with self.assertRaises(ValueError):
            region.tensor("r", np.zeros(4, np.float32))  # not in the region
        with self.assertRaises(BufferError):
            region.release()  # `a` and `again` still view it
        del a, again
        region.release()
        region.release()
        self.assertFalse(os.path.exists("/dev/shm" + region.key))
        with self.assertRaisesRegex(ValueError, "was released"):
            region.array(4)
        with self.assertRaisesRegex(ValueError, "was released"):
            region.tensor("r", np.zeros(4, np.float32))

    def test_a_region_dropped_before_its_views_unlinks_its_name(self):
        region = ShmRegion(64, tag="py-test")
        path = "/dev/shm" + region.key
        self.addCleanup(lambda: os.path.exists(path) and os.unlink(path))
        view = region.array(4)
        del region
        self.assertFalse(os.path.exists(path))
        view[...] = 2.0  # the mapping lives on with the view
        self.assertTrue(np.all(view == 2.0))

    def test_an_error_in_a_with_block_is_raised_not_a_buffer_error(self):
        # The block's views live on in the error's traceback: release()
        # raised BufferError in the error's place, and left the object.
        path = None
        with self.assertRaisesRegex(ZeroDivisionError, "division"):
            with ShmRegion(64, tag="py-test") as region:
                path = "/dev/shm" + region.key
                self.addCleanup(lambda: os.path.exists(path) and os.unlink(path))
                view = region.array(4)
                view[...] = 1 / 0
        self.assertFalse(os.path.exists(path))

    def test_a_process_exiting_with_a_live_view_leaves_no_object(self):
        script = textwrap.dedent("""
            from gradcomp.shm import ShmRegion
            region = ShmRegion(64, tag="py-test-exit")
            view = region.array(4)
            print(region.key, flush=True)
        """)
        child = subprocess.run([sys.executable, "-c", script], check=True,
                               stdout=subprocess.PIPE, text=True)
        path = "/dev/shm" + child.stdout.strip()
        self.addCleanup(lambda: os.path.exists(path) and os.unlink(path))
        self.assertTrue(child.stdout.strip(), "the child made no region")
        self.assertFalse(os.path.exists(path))

    def test_a_forked_child_leaves_its_parents_object(self):
        region = ShmRegion(64, tag="py-test")
        self.addCleanup(region.release)
        path = "/dev/shm" + region.key
        pid = os.fork()
        if pid == 0:  # the child drops its copy, as its exit would
            try:
                region.release()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        self.assertTrue(os.path.exists(path))
        # The parent's flock is still held: no exclusive lock is granted.
        other = os.open(path, os.O_RDWR)
        self.addCleanup(os.close, other)
        with self.assertRaises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def test_release_closes_the_object_when_its_name_is_gone(self):
        region = ShmRegion(64, tag="py-test")
        path = "/dev/shm" + region.key
        other = os.open(path, os.O_RDWR)
        self.addCleanup(os.close, other)
        os.unlink(path)
        with self.assertRaises(FileNotFoundError):
            region.release()
        # The region's fd is closed, and its shared flock with it.
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        region.release()  # already released

    def test_pages_are_reserved_at_creation(self):
        # ftruncate alone leaves a tmpfs object with no blocks, to be taken
        # (or, with /dev/shm full, SIGBUS) on first write.
        with ShmRegion(1 << 20, tag="py-test") as region:
            st = os.stat("/dev/shm" + region.key)
            self.assertGreaterEqual(st.st_blocks * 512, 1 << 20)

    def test_a_region_larger_than_dev_shm_is_enospc(self):
        fs = os.statvfs("/dev/shm")
        limit = fs.f_blocks * fs.f_frsize
        size = 1 << 45  # 32 TiB: tmpfs refuses it at once, taking nothing
        if limit == 0 or limit >= size:
            self.skipTest(f"/dev/shm has no size limit below {size} bytes")
        tag = f"py-test-enospc-{os.getpid()}"
        with self.assertRaises(OSError) as error:
            ShmRegion(size, tag=tag)
        self.assertEqual(error.exception.errno, errno.ENOSPC)
        self.assertIn(f"no room for {size} bytes in /dev/shm (", str(error.exception))
        self.assertIn(f"/gradcomp.{tag}.", str(error.exception))
        self.assertIn("bytes free of", str(error.exception))
        leftovers = [name for name in os.listdir("/dev/shm")
                     if name.startswith(f"gradcomp.{tag}.")]
        self.assertEqual(leftovers, [])

    def test_bad_sizes_and_tags(self):
        with self.assertRaises(ValueError):
            ShmRegion(0)
        with self.assertRaises(ValueError):
            ShmRegion(64, tag="../etc")

    def test_bad_prefixes(self):
        for prefix in ("", "/", "team.", "/a/b.", "/" + "x" * 100):
            with self.assertRaisesRegex(ValueError, "gradcompd --shm_prefix"):
                ShmRegion(64, prefix=prefix)
            with self.assertRaisesRegex(ValueError, "gradcompd --shm_prefix"):
                gradcomp.Client("localhost:1", shm_prefix=prefix)
        # The longest prefix leaves room for the longest tag.
        ShmRegion(64, tag="t" * 128, prefix="/" + "p" * 99).release()

    def test_the_default_prefix_is_the_daemons(self):
        # Kept in two places (the client may not depend on the daemon): a
        # change to one must not leave helper-made regions refused.
        help_text = subprocess.run([str(daemon_binary()), "--helpfull"],
                                   capture_output=True, text=True).stdout
        after_flag = help_text[help_text.index("--shm_prefix"):]
        default = after_flag[after_flag.index('default: "') + len('default: "'):]
        self.assertEqual(default[:default.index('"')], DEFAULT_SHM_PREFIX)


class ShmOffByDefaultTest(unittest.TestCase):

    def test_register_is_refused_with_the_flag_to_use(self):
        with Daemon() as daemon, gradcomp.Client(daemon.target) as client, \
                ShmRegion(64, tag="py-test") as region:
            with self.assertRaises(gradcomp.GradcompError) as error:
                client.register_shm("r", region)
            self.assertEqual(error.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("--allow_client_shm", str(error.exception))


class ShmPrefixTest(unittest.TestCase):

    def test_a_daemon_with_another_prefix_maps_regions_named_with_it(self):
        with Daemon(["--allow_client_shm", "--shm_prefix=/py-team."]) as daemon, \
                gradcomp.Client(daemon.target, shm_prefix="/py-team.") as client:
            with ShmRegion(64, tag="py-test") as region:
                with self.assertRaises(gradcomp.GradcompError) as error:
                    client.register_shm("r", region)
                self.assertEqual(error.exception.code, grpc.StatusCode.PERMISSION_DENIED)
                self.assertIn("'/py-team.'", str(error.exception))
            with ShmRegion(64, tag="py-test", prefix=client.shm_prefix) as region:
                self.assertTrue(region.key.startswith("/py-team.py-test."))
                client.register_shm("r", region)
                source, target = region.array(8), region.array(8, offset=32)
                source[...] = np.arange(8, dtype=np.float32)
                client.reduce_shm("t", 0, region.tensor("r", source),
                                  region.tensor("r", target))
                np.testing.assert_array_equal(target, np.arange(8, dtype=np.float32))
                del source, target
                client.unregister_shm("r")


class ShmDaemonTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(["--allow_client_shm"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.close()

    def setUp(self):
        self.client = gradcomp.Client(self.daemon.target)
        self.addCleanup(self.client.close)
        self.region = ShmRegion(1 << 20, tag="py-test")
        self.addCleanup(self.region.release)
        self.addCleanup(self.client.unregister_shm)

    def test_status_names_the_regions_key(self):
        self.client.register_shm("grads", self.region)
        response = self.client._shm_call(
            "SharedMemoryStatus", gradcomp_pb2.SharedMemoryStatusRequest())
        self.assertEqual(len(response.regions), 1)
        region = response.regions[0]
        self.assertEqual((region.name, region.kind, region.byte_size),
                         ("grads", "system", 1 << 20))
        self.assertEqual(region.key, self.region.key)
        self.assertEqual(region.in_flight, 0)
        self.assertEqual(region.lock_key, "")

    def test_reduce_reads_and_writes_the_region(self):
        self.client.register_shm("grads", self.region)
        self.assertEqual(self.client.shm_status(), {"grads": 1 << 20})
        grad = _gradient((256, 256), seed=1)
        source = self.region.array(grad.shape)
        target = self.region.array(grad.shape, offset=grad.nbytes)
        source[...] = grad
        stats = self.client.reduce_shm("fc.weight", 0,
                                       self.region.tensor("grads", source),
                                       self.region.tensor("grads", target))
        self.assertEqual(stats.codec, "none")
        self.assertEqual(stats.raw_bytes, grad.nbytes)
        np.testing.assert_array_equal(target, grad)

        stats = self.client.reduce_shm("fc.weight", 1,
                                       self.region.tensor("grads", source),
                                       self.region.tensor("grads", target),
                                       codec="qsgd", params={"bits": 8})
        self.assertEqual(stats.codec, "qsgd")
        self.assertLess(np.linalg.norm(target - grad) / np.linalg.norm(grad), 0.1)
        del source, target

    def test_a_region_registered_from_an_offset_reads_and_writes_its_views(self):
        self.client.register_shm("grads", self.region, offset=4096, byte_size=8192)
        before = self.region.array(1024, offset=0)
        before[...] = 7.0
        grad = _gradient((1024,), seed=3)
        source = self.region.array(grad.shape, offset=4096)
        target = self.region.array(grad.shape, offset=8192)
        source[...] = grad
        self.assertEqual(self.region.tensor("grads", source).offset, 0)
        self.client.reduce_shm("bias", 0, self.region.tensor("grads", source),
                               self.region.tensor("grads", target))
        np.testing.assert_array_equal(target, grad)
        np.testing.assert_array_equal(before, np.full(1024, 7.0, np.float32))
        with self.assertRaisesRegex(ValueError, r"outside \[4096, 12288\)"):
            self.region.tensor("grads", before)
        del before, source, target

    def test_reduce_many_shm_over_one_stream(self):
        self.client.register_shm("bucket", self.region)
        tensors, expected, offset = {}, {}, 0
        for i, shape in enumerate([(64, 64), (1000,), (3, 5, 7)]):
            grad = _gradient(shape, seed=i).astype(np.float16 if i == 1 else np.float32)
            source = self.region.array(shape, grad.dtype, offset)
            target = self.region.array(shape, grad.dtype, offset + grad.nbytes)
            offset += 2 * grad.nbytes + 64
            source[...] = grad
            tensors[f"t{i}"] = (self.region.tensor("bucket", source),
                                self.region.tensor("bucket", target))
            expected[f"t{i}"] = (grad, target)
        stats = self.client.reduce_many_shm(tensors, step=0)
        self.assertEqual(list(stats), ["t0", "t1", "t2"])
        for name, (grad, target) in expected.items():
            np.testing.assert_array_equal(target, grad, err_msg=name)
        del expected

    def _bucket(self, shapes, seed=0):
        """Tensors laid out one after another in the region's first half,
        their outputs alike in the second: {name: (source, target)}, and
        the gradients."""
        half = self.region.byte_size // 2
        tensors, grads, offset = {}, {}, 0
        for i, shape in enumerate(shapes):
            grad = _gradient(shape, seed=seed + i)
            source = self.region.array(shape, offset=offset)
            source[...] = grad
            target = self.region.array(shape, offset=half + offset)
            target[...] = np.nan
            tensors[f"t{i}"] = (self.region.tensor("bucket", source),
                                self.region.tensor("bucket", target))
            grads[f"t{i}"] = grad
            offset += grad.nbytes
        return tensors, grads

    def _results(self, tensors):
        return {name: self.region.array(target.shape,
                                        offset=target.offset).copy()
                for name, (_, target) in tensors.items()}

    def test_a_zero_element_tensor_in_a_bucket(self):
        # A model with a zero-sized parameter: its part is answered with the
        # others (the daemon sends it inline), not a refused bucket.
        self.client.register_shm("bucket", self.region)
        tensors, grads = self._bucket([(16, 8), (0, 4), (5,)])
        template = gradcomp_pb2.ReduceRequest(job="default", step=0,
                                              dtype=gradcomp_pb2.DTYPE_FLOAT32)
        (chunk,) = gradcomp.client._as_parts(
            template, [(name, *pair) for name, pair in tensors.items()], {})
        self.assertEqual([p.tensor for p in chunk.parts], ["t0", "t1", "t2"])
        # With parts and without: a request per tensor sends it inline.
        for step, parts in enumerate([True, False]):
            stats = self.client.reduce_many_shm(tensors, step=step, parts=parts)
            self.assertEqual(list(stats), ["t0", "t1", "t2"])
            self.assertEqual(stats["t1"].raw_bytes, 0)
            results = self._results(tensors)
            for name, grad in grads.items():
                np.testing.assert_array_equal(results[name], grad, err_msg=name)

    def test_an_empty_tensor_of_another_dtype_leads_the_bucket(self):
        # The requests' dtype is every part's: an empty fp16 tensor first
        # must not make the fp32 tensors behind it go as fp16 (which the
        # daemon accepts: 4 fp16 values fit a 4-float slice).
        self.client.register_shm("bucket", self.region)
        tensors, grads = self._bucket([(4,), (16, 8)])
        empty = self.region.array((0,), np.float16)
        tensors = {"empty": (self.region.tensor("bucket", empty),
                             self.region.tensor("bucket", empty)), **tensors}
        self.assertIsNone(gradcomp.client._as_parts(
            gradcomp_pb2.ReduceRequest(),
            [(name, *pair) for name, pair in tensors.items()], {}))
        stats = self.client.reduce_many_shm(tensors, step=0)
        self.assertEqual(list(stats), ["empty", "t0", "t1"])
        results = self._results(tensors)
        for name, grad in grads.items():
            np.testing.assert_array_equal(results[name], grad, err_msg=name)

    def test_a_bucket_goes_as_requests_with_parts(self):
        self.client.register_shm("bucket", self.region)
        # 300 tensors: three requests of at most 128 parts, and runs of two
        # batches and of none.
        shapes = [(16, 8) if i % 3 else (5,) for i in range(300)]
        tensors, grads = self._bucket(shapes)
        names = list(tensors)
        template = gradcomp_pb2.ReduceRequest(job="default", step=0,
                                              dtype=gradcomp_pb2.DTYPE_FLOAT32)
        chunks = gradcomp.client._as_parts(
            template, [(name, *tensors[name]) for name in names], {})
        self.assertEqual([len(c.parts) for c in chunks], [128, 128, 44])
        self.assertEqual([c.parts[0].tensor for c in chunks], ["t0", "t128", "t256"])
        self.assertEqual([c.request_id for c in chunks], [0, 1, 2])
        # Each request spans its parts' bytes, in and out, at the parts'
        # offsets; the template's fields are every request's.
        half = self.region.byte_size // 2
        for chunk in chunks:
            first = tensors[chunk.parts[0].tensor][0]
            last = tensors[chunk.parts[-1].tensor][0]
            self.assertEqual(chunk.input_shm.offset, first.offset)
            self.assertEqual(chunk.input_shm.byte_size,
                             last.offset + last.byte_size - first.offset)
            self.assertEqual(chunk.output_shm.offset, half + first.offset)
            self.assertEqual(chunk.output_shm.byte_size, chunk.input_shm.byte_size)
            self.assertEqual((chunk.job, chunk.step, chunk.tensor), ("default", 0, ""))
            for part in chunk.parts:
                source = tensors[part.tensor][0]
                self.assertEqual(part.offset, source.offset - first.offset)
                self.assertEqual(tuple(part.shape), source.shape)
        batches = {"a": names[10:20], "b": names[20:140]}
        batch_of = gradcomp.client._batch_requests(batches, names)
        chunks = gradcomp.client._as_parts(
            template, [(name, *tensors[name]) for name in names], batch_of)
        # Runs of one batch or none, at most 128 each.
        self.assertEqual([(c.batch.id, len(c.parts)) for c in chunks],
                         [("", 10), ("a", 10), ("b", 120), ("", 128), ("", 32)])
        for step, parts in enumerate([True, False]):
            stats = self.client.reduce_many_shm(
                tensors, step=step, codec="fp16", batches=batches, parts=parts)
            self.assertEqual(list(stats), names)
            self.assertTrue(all(s.codec == "fp16" for s in stats.values()))
            results = self._results(tensors)
            for name, grad in grads.items():
                np.testing.assert_allclose(results[name], grad, rtol=1e-3,
                                           atol=1e-4, err_msg=name)
            if parts:
                with_parts = results
        # Parts or not, the same bits.
        for name in names:
            np.testing.assert_array_equal(with_parts[name], results[name])

    def test_a_part_that_fails_fails_alone(self):
        # The region ends 4 bytes before the last output.
        tensors, grads = self._bucket([(8, 8), (10,), (4,)])
        end = tensors["t2"][1].offset + tensors["t2"][1].byte_size
        self.client.register_shm("bucket", self.region, byte_size=end - 4)
        with self.assertRaises(gradcomp.GradcompError) as error:
            self.client.reduce_many_shm(tensors, step=0)
        self.assertEqual(list(error.exception.failures), ["t2"])
        self.assertIn("tensor 't2' step 0: output_shm", str(error.exception))
        results = self._results(tensors)
        np.testing.assert_array_equal(results["t0"], grads["t0"])
        np.testing.assert_array_equal(results["t1"], grads["t1"])
        self.client.reduce_many_shm({"t0": tensors["t0"]}, step=1)  # still serving

    def test_layouts_the_daemon_cannot_split_go_per_tensor(self):
        a = ShmTensor("r", 0, (4,), np.dtype(np.float32))
        b = ShmTensor("r", 16, (4,), np.dtype(np.float32))
        out_a = ShmTensor("r", 64, (4,), np.dtype(np.float32))
        out_b = ShmTensor("r", 96, (4,), np.dtype(np.float32))
        template = gradcomp_pb2.ReduceRequest(job="j", step=0,
                                              dtype=gradcomp_pb2.DTYPE_FLOAT32)

        def as_parts(*entries):
            return gradcomp.client._as_parts(template, entries, {})

        out_b_alike = ShmTensor("r", 80, (4,), b.dtype)
        self.assertIsNotNone(as_parts(("a", a, out_a), ("b", b, out_b_alike)))
        # Outputs not laid out as the inputs.
        self.assertIsNone(as_parts(("a", a, out_a), ("b", b, out_b)))
        # Inputs in two regions.
        self.assertIsNone(as_parts(
            ("a", a, out_a), ("b", ShmTensor("s", 16, (4,), b.dtype), out_b_alike)))
        # Two dtypes.
        f64 = np.dtype(np.float64)
        self.assertIsNone(as_parts(
            ("a", a, out_a),
            ("b", ShmTensor("r", 16, (2,), f64), ShmTensor("r", 80, (2,), f64))))
        # Each output just after its input: the spans overlap.
        self.assertIsNone(as_parts(
            ("a", a, ShmTensor("r", 16, (4,), a.dtype)),
            ("b", ShmTensor("r", 32, (4,), a.dtype), ShmTensor("r", 48, (4,), a.dtype))))
        # An output before its input: overlapping it, then just clear of it.
        self.assertIsNone(as_parts(("a", ShmTensor("r", 8, (4,), a.dtype), a)))
        self.assertIsNotNone(as_parts(("a", ShmTensor("r", 16, (4,), a.dtype), a)))

    def test_errors(self):
        self.client.register_shm("grads", self.region, offset=4096, byte_size=8192)
        good = ShmTensor("grads", 0, (1024,), np.dtype(np.float32))
        out = ShmTensor("grads", 4096, (1024,), np.dtype(np.float32))
        cases = [
            ("past the end", ShmTensor("grads", 4100, (1024,), good.dtype), out,
             grpc.StatusCode.INVALID_ARGUMENT, "expected offset + byte_size <= 8192"),
            ("wraps around", ShmTensor("grads", 2**64 - 8, (1024,), good.dtype), out,
             grpc.StatusCode.INVALID_ARGUMENT, "ends past its 8192 bytes"),
            ("unknown region", ShmTensor("nope", 0, (1024,), good.dtype), out,
             grpc.StatusCode.NOT_FOUND, "no shared-memory region 'nope'"),
            ("overlap", good, ShmTensor("grads", 2048, (1024,), good.dtype),
             grpc.StatusCode.INVALID_ARGUMENT, "overlap"),
        ]
        for what, source, target, code, message in cases:
            with self.subTest(what), self.assertRaises(gradcomp.GradcompError) as error:
                self.client.reduce_shm("w", 0, source, target)
            self.assertEqual(error.exception.code, code, what)
            self.assertIn(message, str(error.exception), what)
        with self.assertRaises(gradcomp.GradcompError) as error:
            self.client.unregister_shm("nope")
        self.assertEqual(error.exception.code, grpc.StatusCode.NOT_FOUND)
        self.client.reduce_shm("w", 0, good, out)  # still serving

    def test_two_clients_with_the_same_region_name(self):
        self.client.register_shm("shared-name", self.region)
        with gradcomp.Client(self.daemon.target) as other, \
                ShmRegion(64, tag="py-test") as theirs:
            with self.assertRaises(gradcomp.GradcompError) as error:
                other.register_shm("shared-name", theirs)
            self.assertEqual(error.exception.code, grpc.StatusCode.ALREADY_EXISTS)
            self.assertIn("already registered by another client;", str(error.exception))
            # Not the owner's id: a caller could send it and use the region.
            self.assertNotIn(self.client.client_id, str(error.exception))
            self.assertEqual(other.shm_status(), {})

    def test_a_killed_client_is_reclaimed_and_counted(self):
        before = self.daemon.metric("gradcomp_shm_regions_reclaimed_total")
        script = textwrap.dedent("""
            import sys, time
            import gradcomp
            from gradcomp.shm import ShmRegion
            region = ShmRegion(1 << 16, tag="py-test-victim")
            gradcomp.Client(sys.argv[1]).register_shm("victim", region)
            print(region.key, flush=True)
            time.sleep(600)
        """)
        child = subprocess.Popen([sys.executable, "-c", script, self.daemon.target],
                                 stdout=subprocess.PIPE, text=True)
        key = child.stdout.readline().strip()
        self.addCleanup(lambda: os.path.exists("/dev/shm" + key) and
                        os.unlink("/dev/shm" + key))
        self.assertTrue(key, "the child did not register its region")
        self.assertEqual(self.daemon.metric("gradcomp_shm_regions"), 1)
        # SIGTERM, as torchrun stops workers: Python's default handling runs
        # no cleanup, so the object is left in /dev/shm for the daemon.
        child.send_signal(signal.SIGTERM)
        child.wait()
        child.stdout.close()
        # The daemon looks for abandoned regions every second; wait for the
        # outcome, with a deadline only against a hang.
        deadline = time.monotonic() + 30
        while (self.daemon.metric("gradcomp_shm_regions_reclaimed_total") == before
               and time.monotonic() < deadline):
            time.sleep(0.1)
        self.assertEqual(self.daemon.metric("gradcomp_shm_regions_reclaimed_total"),
                         before + 1)
        self.assertEqual(self.daemon.metric("gradcomp_shm_regions"), 0)
        # And the object the child left is unlinked (just after the count).
        while os.path.exists("/dev/shm" + key) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertFalse(os.path.exists("/dev/shm" + key), f"{key} left in /dev/shm")
        # The name is free again.
        self.client.register_shm("victim", self.region)


class ShmTwoDaemonsTest(unittest.TestCase):
    """World size 2: each rank's client reduces through its own daemon's
    shared memory, and both get the average."""

    def test_average_of_two_ranks_through_shared_memory(self):
        daemons = start_peered(2, self.addCleanup, ["--allow_client_shm"])
        grads = [_gradient((512, 128), seed=10 + r) for r in range(2)]
        results, errors = [None, None], []

        def rank(r):
            try:
                with gradcomp.Client(daemons[r].target) as client, \
                        ShmRegion(2 * grads[r].nbytes, tag=f"py-test-r{r}") as region:
                    client.register_shm(f"job.rank{r}", region)
                    source = region.array(grads[r].shape)
                    target = region.array(grads[r].shape, offset=grads[r].nbytes)
                    source[...] = grads[r]
                    for step in range(3):
                        client.reduce_shm("fc.weight", step,
                                          region.tensor(f"job.rank{r}", source),
                                          region.tensor(f"job.rank{r}", target),
                                          job="job")
                    results[r] = target.copy()
                    client.unregister_shm()
                    del source, target
            except Exception as error:  # reported below, with the daemon logs
                errors.append(error)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [], "\n".join(d.log()[-2000:] for d in daemons))
        expected = (grads[0] + grads[1]) / 2
        for r in range(2):
            np.testing.assert_allclose(results[r], expected, rtol=1e-6, atol=1e-7)


if __name__ == "__main__":
    unittest.main()
