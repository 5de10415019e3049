"""Streams with a message that is not a valid protobuf, sent as raw bytes
to a real daemon. gRPC's sync server reads such a message as the end of the
stream: the daemon must still answer the requests around it and say what
happened, not end with OK (ReduceStream), and must import nothing from a
blob it did not get whole (ImportStateStream)."""
import unittest

import grpc
import numpy as np

from gradcomp.testing import Daemon
from gradcomp.v1 import gradcomp_pb2

GARBAGE = b"\xff\xff\xff"  # field 31 of wire type 7: no protobuf parses it


def _request(request_id: int) -> bytes:
    values = np.arange(16, dtype=np.float32) + request_id
    return gradcomp_pb2.ReduceRequest(
        job="raw", tensor=f"t{request_id}", step=0, request_id=request_id,
        dtype=gradcomp_pb2.DTYPE_FLOAT32, shape=[16],
        data=values.tobytes()).SerializeToString()


class MalformedStreamTest(unittest.TestCase):

    def setUp(self):
        self.daemon = Daemon().start()
        self.addCleanup(self.daemon.close)
        self.channel = grpc.insecure_channel(self.daemon.target)
        self.addCleanup(self.channel.close)

    def _raw(self, method: str, kind: str, response):
        return getattr(self.channel, kind)(
            f"/gradcomp.v1.Gradcomp/{method}",
            request_serializer=lambda raw: raw,
            response_deserializer=response.FromString)

    def test_reduce_stream_answers_around_bad_messages_and_says_so(self):
        # One bad message, and a run of three (a second read alone passed
        # over the first of a run and took the second for the end).
        messages = [_request(1), GARBAGE, _request(2), GARBAGE, GARBAGE,
                    GARBAGE, _request(3)]
        call = self._raw("ReduceStream", "stream_stream",
                         gradcomp_pb2.ReduceStreamResponse)(iter(messages), timeout=60)
        answered = set()
        with self.assertRaises(grpc.RpcError) as ended:
            for reply in call:
                self.assertEqual(reply.error_code, 0, reply.error_message)
                answered.add(reply.result.request_id)
        self.assertEqual(answered, {1, 2, 3})
        self.assertEqual(ended.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("4 message(s) of this stream could not be parsed",
                      ended.exception.details())

    def test_import_state_stream_cut_by_a_bad_message_imports_nothing(self):
        blob = b"GCST" + bytes(60)  # any bytes: never parsed as state
        first = gradcomp_pb2.ImportStateRequest(
            job="raw", state_bytes=len(blob), state=blob[:32]).SerializeToString()
        rest = gradcomp_pb2.ImportStateRequest(state=blob[32:]).SerializeToString()
        with self.assertRaises(grpc.RpcError) as refused:
            self._raw("ImportStateStream", "stream_unary",
                      gradcomp_pb2.ImportStateResponse)(
                iter([first, GARBAGE, rest]), timeout=60)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("a message could not be parsed", refused.exception.details())

    def test_import_state_stream_with_a_bad_message_in_it_imports_nothing(self):
        # The whole blob, a bad message, then more: without the bad message
        # the extra bytes are refused, and with it the blob was imported.
        blob = b"GCST" + bytes(60)
        first = gradcomp_pb2.ImportStateRequest(
            job="raw", state_bytes=len(blob), state=blob).SerializeToString()
        extra = gradcomp_pb2.ImportStateRequest(state=b"x").SerializeToString()
        with self.assertRaises(grpc.RpcError) as refused:
            self._raw("ImportStateStream", "stream_unary",
                      gradcomp_pb2.ImportStateResponse)(
                iter([first, GARBAGE, extra]), timeout=60)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("a message could not be parsed", refused.exception.details())


if __name__ == "__main__":
    unittest.main()
