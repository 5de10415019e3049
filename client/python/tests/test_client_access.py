"""Client access end to end (docs/security.md, "Client access"): real
gradcompd processes on a unix socket and on TCP with a bearer token, the
Python client's token option and $GRADCOMP_TOKEN, and the shared-memory name
prefix.

Needs the daemon binary: `bazel build //service:gradcompd`, or $GRADCOMPD.
"""
import os
import secrets
import stat
import subprocess
import unittest
from unittest import mock

import grpc
import numpy as np

import gradcomp
from gradcomp import metrics
from gradcomp.shm import ShmRegion
from gradcomp.testing import Daemon, daemon_binary


def _refused(daemon: Daemon) -> float:
    return metrics.total(metrics.scrape(daemon.metrics_url), "gradcomp_requests_total",
                         service="gradcomp.v1.Gradcomp", code="UNAUTHENTICATED")


class TokenTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.token = secrets.token_urlsafe(32)
        cls.daemon = Daemon(token=cls.token).start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.close()

    def _info_code(self, token: str) -> grpc.StatusCode:
        with gradcomp.Client(self.daemon.target, timeout=10.0, token=token) as client:
            try:
                client.info()
                return grpc.StatusCode.OK
            except gradcomp.GradcompError as error:
                return error.code

    def test_no_token_and_a_wrong_token_are_refused_and_counted(self):
        before = _refused(self.daemon)
        with mock.patch.dict(os.environ, {"GRADCOMP_TOKEN": ""}):
            self.assertEqual(self._info_code(""), grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(self._info_code("wrong-" + self.token),
                         grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(_refused(self.daemon), before + 2)

    def test_the_right_token_is_served_inline_and_streamed(self):
        with gradcomp.Client(self.daemon.target, timeout=10.0, token=self.token) as client:
            grad = np.arange(12, dtype=np.float32).reshape(3, 4)
            avg, _ = client.reduce(grad, "w", 0)
            np.testing.assert_array_equal(avg, grad)
            results = client.reduce_many({"a": grad, "b": grad * 2}, step=1)
            self.assertEqual(len(results), 2)

    def test_the_token_comes_from_the_environment(self):
        with mock.patch.dict(os.environ, {"GRADCOMP_TOKEN": self.token}):
            with gradcomp.Client(self.daemon.target, timeout=10.0) as client:
                self.assertTrue(client.info().version)

    def test_a_token_is_trimmed_and_bytes_grpc_cannot_send_are_refused(self):
        env = {"GRADCOMP_TOKEN": self.token + "\n"}  # a secret file's newline
        with mock.patch.dict(os.environ, env):
            with gradcomp.Client(self.daemon.target, timeout=10.0) as client:
                self.assertTrue(client.info().version)
        with self.assertRaisesRegex(ValueError, "token holds 'ö'; expected printable ASCII"):
            gradcomp.Client(self.daemon.target, token="t\u00f6ken")
        # Unicode whitespace is no whitespace to the daemon's token file.
        with self.assertRaisesRegex(ValueError, r"token holds '\\xa0'"):
            gradcomp.Client(self.daemon.target, token=self.token + "\u00a0")

    def test_an_unauthenticated_error_says_what_is_expected(self):
        with gradcomp.Client(self.daemon.target, timeout=10.0, token="nope") as client:
            with self.assertRaises(gradcomp.GradcompError) as raised:
                client.info()
        self.assertIn("does not match", str(raised.exception))


class UnixSocketTest(unittest.TestCase):

    def test_served_without_a_token_with_the_documented_mode(self):
        daemon = Daemon(unix_socket=True, token=secrets.token_urlsafe(32)).start()
        try:
            mode = stat.S_IMODE(os.stat(daemon.socket_path).st_mode)
            self.assertEqual(mode, 0o660)
            self.assertTrue(stat.S_ISSOCK(os.stat(daemon.socket_path).st_mode))
            with gradcomp.Client(daemon.target, timeout=10.0, token="") as client:
                self.assertTrue(client.info().version)
        finally:
            daemon.close()

    def test_socket_mode_flag(self):
        daemon = Daemon(["--socket_mode=0600"], unix_socket=True).start()
        try:
            self.assertEqual(stat.S_IMODE(os.stat(daemon.socket_path).st_mode), 0o600)
        finally:
            daemon.close()

    def test_the_mode_decides_who_may_connect(self):
        if os.geteuid() != 0:
            self.skipTest("connecting as another user needs root")
        for mode, allowed in (("0660", False), ("0666", True)):
            daemon = Daemon([f"--socket_mode={mode}"], unix_socket=True).start()
            try:
                # Let the other user reach the socket, so that only its mode decides.
                for directory in (daemon.socket_path.parent, daemon.socket_path.parent.parent):
                    os.chmod(directory, 0o755)
                connect = subprocess.run(
                    ["/usr/bin/python3", "-c",
                     "import socket, sys; socket.socket(socket.AF_UNIX)"
                     ".connect(sys.argv[1])", str(daemon.socket_path)],
                    user="nobody", group="nogroup", extra_groups=[],
                    capture_output=True, text=True, timeout=30)
                self.assertEqual(connect.returncode == 0, allowed, (mode, connect.stderr))
                if not allowed:
                    self.assertIn("PermissionError", connect.stderr)
            finally:
                daemon.close()


class StartCheckTest(unittest.TestCase):

    def _start(self, *flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(daemon_binary()), "--metrics_listen=", "--check_config",
                               *flags], capture_output=True, text=True, timeout=60)

    def test_non_loopback_tcp_without_a_token_fails_at_start(self):
        result = self._start("--listen=0.0.0.0:50051")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("--client_token_file", result.stderr)
        self.assertIn("0.0.0.0:50051", result.stderr)

    def test_a_token_or_the_explicit_opt_out_lets_it_start(self):
        self.assertEqual(self._start("--listen=0.0.0.0:50051",
                                     "--allow_unauthenticated_tcp").returncode, 0)
        self.assertEqual(self._start("--listen=127.0.0.1:50051").returncode, 0)

    def test_a_missing_or_short_token_file_fails_at_start(self):
        result = self._start("--listen=0.0.0.0:50051", "--client_token_file=/nonexistent")
        self.assertEqual(result.returncode, 1)
        self.assertIn("/nonexistent", result.stderr)


class ShmPrefixTest(unittest.TestCase):

    def test_a_region_outside_the_prefix_is_refused(self):
        daemon = Daemon(["--allow_client_shm", "--shm_prefix=/gradcomp.allowed."]).start()
        try:
            with gradcomp.Client(daemon.target, timeout=10.0) as client, \
                    ShmRegion(4096, tag="outside") as region:
                with self.assertRaises(gradcomp.GradcompError) as raised:
                    client.register_shm("grads", region)
                self.assertEqual(raised.exception.code, grpc.StatusCode.PERMISSION_DENIED)
                self.assertIn("'/gradcomp.allowed.'", str(raised.exception))
                with ShmRegion(4096, tag="allowed") as allowed:
                    client.register_shm("grads", allowed)
                    client.unregister_shm("grads")
        finally:
            daemon.close()

    def test_a_region_of_another_uid_is_refused_naming_both(self):
        if os.geteuid() != 0:
            self.skipTest("giving an object to another user needs root")
        nobody = 65534
        daemon = Daemon(["--allow_client_shm"]).start()
        trusting = Daemon(["--allow_client_shm", f"--shm_owner_uids={nobody}"]).start()
        try:
            with ShmRegion(4096, tag="otheruid") as region, ShmRegion(4096, tag="own") as own:
                # As if `nobody` had created it: the daemon checks the owner of
                # the object it mapped (fstat).
                os.fchown(region._fd, nobody, nobody)
                with gradcomp.Client(daemon.target, timeout=10.0) as client:
                    with self.assertRaises(gradcomp.GradcompError) as raised:
                        client.register_shm("grads", region)
                    self.assertEqual(raised.exception.code,
                                     grpc.StatusCode.PERMISSION_DENIED)
                    self.assertIn("owned by uid 65534, not by this daemon's uid 0",
                                  str(raised.exception))
                    client.register_shm("own", own)
                    client.unregister_shm("own")
                with gradcomp.Client(trusting.target, timeout=10.0) as client:
                    client.register_shm("grads", region)
                    client.unregister_shm("grads")
        finally:
            daemon.close()
            trusting.close()

    def test_a_daemon_of_another_uid_opens_objects_of_a_mode_that_lets_it(self):
        # The chart's setup: the daemon runs as 65532, the trainer (here
        # root) as another uid, trusted with --shm_owner_uids. A 0600 object
        # is the trainer's alone: the daemon cannot open it.
        if os.geteuid() != 0:
            self.skipTest("running the daemon as another user needs root")
        daemon = Daemon(["--allow_client_shm", "--shm_owner_uids=0"], user=65532).start()
        try:
            with gradcomp.Client(daemon.target, timeout=10.0) as client, \
                    ShmRegion(4096, tag="private") as private, \
                    ShmRegion(4096, tag="shared", mode=0o666) as shared:
                self.assertEqual(os.stat("/dev/shm" + shared.key).st_mode & 0o777, 0o666)
                with self.assertRaises(gradcomp.GradcompError) as raised:
                    client.register_shm("private", private)
                self.assertEqual(raised.exception.code, grpc.StatusCode.PERMISSION_DENIED)
                self.assertIn("this daemon runs as uid 65532 and opens it read-write",
                              str(raised.exception))
                client.register_shm("shared", shared)
                source = shared.array(16)
                target = shared.array(16, offset=64)
                source[...] = 2.5
                client.reduce_shm("w", 0, shared.tensor("shared", source),
                                  shared.tensor("shared", target))
                self.assertTrue((target == 2.5).all())
                del source, target
                client.unregister_shm("shared")
        finally:
            daemon.close()


if __name__ == "__main__":
    unittest.main()
