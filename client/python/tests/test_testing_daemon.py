"""gradcomp.testing: Daemon's temporary directory (the log stays readable
after stop(), and close() or leaving the `with` block removes the
directory, log, unix socket and token file included), and free_port()
never handing out a port twice.

Needs the daemon: `bazel build //service:gradcompd` or $GRADCOMPD.
"""
import unittest

from gradcomp.testing import Daemon, free_port


class DaemonDirectoryTest(unittest.TestCase):

    def test_log_is_readable_after_stop_and_gone_after_close(self):
        daemon = Daemon(token="t" * 32, unix_socket=True).start()
        self.addCleanup(daemon.close)
        directory = daemon.log_path.parent
        self.assertTrue(daemon.socket_path.exists())
        daemon.stop()
        self.assertFalse(daemon.running())
        self.assertTrue(daemon.log(), "the stopped daemon's log is empty")
        daemon.close()
        self.assertFalse(directory.exists())
        self.assertEqual(daemon.log(), "")
        daemon.close()  # a second close is harmless

    def test_leaving_the_with_block_removes_the_directory(self):
        with Daemon() as daemon:
            directory = daemon.log_path.parent
            self.assertTrue(daemon.running())
            self.assertTrue(directory.is_dir())
        self.assertFalse(daemon.running())
        self.assertFalse(directory.exists())

    def test_a_daemon_that_does_not_start_leaves_no_directory(self):
        daemon = Daemon(["--no_such_flag"], start_timeout=10)
        directory = daemon.log_path.parent
        with self.assertRaisesRegex(RuntimeError, "no_such_flag"):
            daemon.start()
        self.assertFalse(directory.exists())


class FreePortTest(unittest.TestCase):

    def test_no_port_is_handed_out_twice(self):
        # The kernel gives a released port out again within a few hundred
        # binds; a peer port chosen but not yet bound must not come back
        # as another daemon's --listen port.
        ports = [free_port() for _ in range(500)]
        self.assertEqual(len(ports), len(set(ports)))


if __name__ == "__main__":
    unittest.main()
