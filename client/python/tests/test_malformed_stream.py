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

    def test_reduce_stream_answers_around_a_bad_message_and_says_so(self):
        call = self._raw("ReduceStream", "stream_stream",
                         gradcomp_pb2.ReduceStreamResponse)(
            iter([_request(1), GARBAGE, _request(2)]), timeout=60)
        answered = set()
        with self.assertRaises(grpc.RpcError) as ended:
            for reply in call:
                self.assertEqual(reply.error_code, 0, reply.error_message)
                answered.add(reply.result.request_id)
        self.assertEqual(answered, {1, 2})
        self.assertEqual(ended.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("1 message(s) of this stream could not be parsed",
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
        self.assertIn("the stream ended after 32 of the 64 bytes",
                      refused.exception.details())


if __name__ == "__main__":
    unittest.main()
