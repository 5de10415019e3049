"""inline_wire against protobuf's own encoding and parsing (no daemon)."""
import math
import unittest

import numpy as np

from gradcomp import inline_wire
from gradcomp.v1 import gradcomp_pb2


def _stats() -> gradcomp_pb2.ReduceStats:
    return gradcomp_pb2.ReduceStats(
        codec="topk", raw_bytes=4096, wire_bytes=300, relative_error=0.25,
        timings=gradcomp_pb2.StageTimings(encode_seconds=0.5, total_seconds=1.5),
        world_size=4, dense_reason="", nonfinite_values=0)


class InlineWireTest(unittest.TestCase):

    def test_request_parses_as_the_protobuf_request(self):
        for array in (np.arange(300, dtype=np.float32).reshape(10, 30),
                      np.asarray(np.float16(2.5)),          # a scalar
                      np.zeros((0, 3), dtype=np.float64)):   # empty
            header = gradcomp_pb2.ReduceRequest(
                job="j", tensor="fc.weight", step=7, dtype=gradcomp_pb2.DTYPE_FLOAT32,
                shape=array.shape, request_id=3,
                codec=gradcomp_pb2.CodecSpec(name="topk", params={"ratio": "0.01"}))
            raw = inline_wire.encode_request(header, array)
            parsed = gradcomp_pb2.ReduceRequest.FromString(raw)
            expected = gradcomp_pb2.ReduceRequest()
            expected.CopyFrom(header)
            expected.data = array.tobytes()
            self.assertEqual(parsed, expected, array.shape)
            self.assertEqual(parsed.WhichOneof("input"), "data")

    def test_response_data_is_a_view_and_the_rest_parses(self):
        data = np.linspace(-1, 1, 1000, dtype=np.float32).tobytes()
        response = gradcomp_pb2.ReduceResponse(
            tensor="fc.weight", step=2, request_id=9, dtype=gradcomp_pb2.DTYPE_FLOAT32,
            data=data, stats=_stats())
        raw = response.SerializeToString()
        parsed, view = inline_wire.decode_response(raw)
        self.assertEqual(view.tobytes(), data)
        self.assertIs(view.obj, raw)  # no copy of the tensor
        expected = gradcomp_pb2.ReduceResponse()
        expected.CopyFrom(response)
        expected.ClearField("data")
        self.assertEqual(parsed, expected)

    def test_stream_result_and_stream_error(self):
        data = bytes(range(256)) * 5
        reply = gradcomp_pb2.ReduceStreamResponse(result=gradcomp_pb2.ReduceResponse(
            tensor="w", request_id=4, dtype=gradcomp_pb2.DTYPE_FLOAT16, data=data,
            stats=_stats()))
        parsed, view = inline_wire.decode_stream_response(reply.SerializeToString())
        self.assertEqual(view.tobytes(), data)
        self.assertEqual(parsed.result.request_id, 4)
        self.assertEqual(parsed.result.stats, _stats())
        self.assertEqual(parsed.result.data, b"")

        error = gradcomp_pb2.ReduceStreamResponse(
            error_code=3, error_message="tensor 'w' step 1: bad", tensor="w", request_id=4)
        parsed, view = inline_wire.decode_stream_response(error.SerializeToString())
        self.assertEqual(parsed, error)
        self.assertEqual(view.nbytes, 0)

    def test_response_without_data_parses(self):
        response = gradcomp_pb2.ReduceResponse(tensor="empty", stats=_stats())
        parsed, view = inline_wire.decode_response(response.SerializeToString())
        self.assertEqual(parsed, response)
        self.assertEqual(view.nbytes, 0)
        self.assertTrue(math.isclose(parsed.stats.relative_error, 0.25))

    def test_truncated_messages_are_errors(self):
        raw = gradcomp_pb2.ReduceResponse(tensor="w", data=b"x" * 100).SerializeToString()
        with self.assertRaisesRegex(ValueError, "past the end"):
            inline_wire.decode_response(raw[:50])
        with self.assertRaisesRegex(ValueError, "varint"):
            inline_wire.decode_response(b"\x08\x80")


if __name__ == "__main__":
    unittest.main()
