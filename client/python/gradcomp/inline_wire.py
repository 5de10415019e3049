"""Reduce messages with the tensor bytes spliced in and viewed out by hand.

Through protobuf, an inline tensor is copied four times each way (array ->
bytes -> message -> serialized bytes, then serialized bytes -> message ->
bytes -> array), each time into fresh memory, which costs more than the
copies themselves. The wire format makes that unnecessary: a message's fields
may come in any order, so a request is its serialized header (every field
but `data`) followed by the `data` field written once straight from the
array's buffer, and a response's `data` field is found by walking the few
top-level fields and returned as a view into the bytes gRPC received.

    raw = encode_request(header, array)            # one copy of the tensor
    response, data = decode_response(raw_reply)    # data: memoryview, no copy
    reply, data = decode_stream_response(raw_stream_reply)
"""
from __future__ import annotations

import numpy as np

from gradcomp.v1 import gradcomp_pb2

_REQUEST_DATA = 6      # ReduceRequest.data
_RESPONSE_DATA = 5     # ReduceResponse.data
_STREAM_RESULT = 1     # ReduceStreamResponse.result
_LEN = 2               # wire type of bytes, strings and messages


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("truncated or overlong varint in a Reduce message")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _find_len_field(buf: memoryview, start: int, end: int,
                    number: int) -> list[tuple[int, int, int]]:
    """(tag start, value start, value end) of every length-delimited field
    `number` among the top-level fields of buf[start:end]."""
    found = []
    pos = start
    while pos < end:
        tag_start = pos
        key, pos = _read_varint(buf, pos, end)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = _read_varint(buf, pos, end)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == _LEN:
            length, pos = _read_varint(buf, pos, end)
            if field == number:
                found.append((tag_start, pos, pos + length))
            pos += length
        else:
            raise ValueError(f"unexpected wire type {wire_type} in a Reduce message")
        if pos > end:
            raise ValueError("a field runs past the end of a Reduce message")
    return found


def encode_request(header: gradcomp_pb2.ReduceRequest, array: np.ndarray) -> bytes:
    """The serialized ReduceRequest of `header` with `array`'s bytes as its
    data; `array` must be C-contiguous and `header` must not hold data."""
    body = memoryview(array.reshape(-1)).cast("B")
    return b"".join((header.SerializeToString(),
                     _varint(_REQUEST_DATA << 3 | _LEN), _varint(body.nbytes), body))


def _split(buf: memoryview, start: int, end: int) -> tuple[bytes, memoryview] | None:
    """A ReduceResponse in buf[start:end] as (its bytes without data, a view
    of data); None when data is absent or repeated (left to protobuf)."""
    fields = _find_len_field(buf, start, end, _RESPONSE_DATA)
    if len(fields) != 1:
        return None
    tag_start, value_start, value_end = fields[0]
    rest = b"".join((buf[start:tag_start], buf[value_end:end]))
    return rest, buf[value_start:value_end]


def decode_response(raw: bytes) -> tuple[gradcomp_pb2.ReduceResponse, memoryview]:
    """A serialized ReduceResponse as (the message without data, a view of
    data into `raw`)."""
    buf = memoryview(raw)
    split = _split(buf, 0, len(buf))
    if split is None:
        response = gradcomp_pb2.ReduceResponse.FromString(raw)
        return response, memoryview(response.data)
    rest, data = split
    return gradcomp_pb2.ReduceResponse.FromString(rest), data


def decode_stream_response(
        raw: bytes) -> tuple[gradcomp_pb2.ReduceStreamResponse, memoryview]:
    """A serialized ReduceStreamResponse as (the message without
    result.data, a view of result.data into `raw`, empty for an error)."""
    buf = memoryview(raw)
    results = _find_len_field(buf, 0, len(buf), _STREAM_RESULT)
    split = _split(buf, results[0][1], results[0][2]) if len(results) == 1 else None
    if split is None:
        reply = gradcomp_pb2.ReduceStreamResponse.FromString(raw)
        return reply, memoryview(reply.result.data)
    tag_start, value_start, value_end = results[0]
    rest, data = split
    result_field = b"".join((_varint(_STREAM_RESULT << 3 | _LEN), _varint(len(rest)), rest))
    reply = gradcomp_pb2.ReduceStreamResponse.FromString(
        b"".join((buf[:tag_start], result_field, buf[value_end:])))
    return reply, data
