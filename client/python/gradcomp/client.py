"""Python client of gradcompd.

    import gradcomp
    client = gradcomp.Client()  # gradcompd's default unix socket
    avg, stats = client.reduce(grad, "fc.weight", step, codec="topk",
                               params={"ratio": 0.01})
    print(stats.ratio, stats.relative_error)

Tensors travel as raw little-endian bytes (float16, float32 or float64
numpy arrays), never as protobuf number lists. Every RPC failure raises
gradcomp.GradcompError with the gRPC code and the daemon's message.
"""
from __future__ import annotations

import dataclasses
import math
import os
import secrets
import socket
import threading
import time
from typing import Any, Iterable, Mapping, Sequence

import grpc
import numpy as np

from gradcomp import cuda_ipc, inline_wire
from gradcomp.errors import GradcompError, status_code
from gradcomp.shm import DEFAULT_SHM_PREFIX, ShmRegion, ShmTensor, check_shm_prefix

try:
    from gradcomp.v1 import gradcomp_pb2, gradcomp_pb2_grpc
except ModuleNotFoundError as error:  # the stubs are build outputs
    raise ImportError(
        "gradcomp's protobuf stubs are missing: run "
        "client/python/generate_protos.sh") from error

_PB_DTYPE = {
    np.dtype("<f2"): gradcomp_pb2.DTYPE_FLOAT16,
    np.dtype("<f4"): gradcomp_pb2.DTYPE_FLOAT32,
    np.dtype("<f8"): gradcomp_pb2.DTYPE_FLOAT64,
}
_NP_DTYPE = {pb: np_dtype for np_dtype, pb in _PB_DTYPE.items()}

# Tensors are sent inline, so lift gRPC's 4 MiB default in both directions.
# A daemon that restarts is dialled again within about a second of coming
# back: with gRPC's defaults (reconnect backoff growing to 2 minutes, and
# the name resolved again at most every 30 s) every call failed at once
# with UNAVAILABLE for 9-10 s after a restarted daemon listened again (the
# daemon is a local sidecar, so trying every second costs nothing).
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.dns_min_time_between_resolutions_ms", 200),
]

# grpc.health.v1.HealthCheckResponse: field 1, the ServingStatus enum.
_SERVING = 1
_HEALTH_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _health_status(raw: bytes) -> int:
    """The status of a serialised HealthCheckResponse (0, proto3's default,
    when the field is absent). Its one field is a varint of tag 1."""
    if len(raw) >= 2 and raw[0] == 0x08:
        return raw[1] & 0x7F
    return 0


# What the daemon (absl::StripAsciiWhitespace) trims from a client token.
_ASCII_WHITESPACE = " \t\n\v\f\r"


@dataclasses.dataclass(frozen=True)
class ReleasedJob:
    """What Client.release_job freed on the daemon."""
    tensors: int      # tensor names the job had there
    state_bytes: int  # codec state bytes, given back to the memory budget


@dataclasses.dataclass(frozen=True)
class ReduceStats:
    """What one Reduce cost and how accurate it was (see ReduceStats in the proto)."""
    codec: str
    raw_bytes: int
    wire_bytes: int
    relative_error: float
    encode_seconds: float
    collective_seconds: float
    decode_seconds: float
    total_seconds: float
    world_size: int
    dense_reason: str
    nonfinite_values: int

    @property
    def ratio(self) -> float:
        """raw_bytes / wire_bytes; inf when nothing went on the wire."""
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else float("inf")

    @classmethod
    def from_proto(cls, stats: gradcomp_pb2.ReduceStats) -> "ReduceStats":
        t = stats.timings
        return cls(codec=stats.codec, raw_bytes=stats.raw_bytes,
                   wire_bytes=stats.wire_bytes,
                   relative_error=stats.relative_error,
                   encode_seconds=t.encode_seconds,
                   collective_seconds=t.collective_seconds,
                   decode_seconds=t.decode_seconds,
                   total_seconds=t.total_seconds, world_size=stats.world_size,
                   dense_reason=stats.dense_reason,
                   nonfinite_values=stats.nonfinite_values)


def codec_spec(codec: str | None,
               params: Mapping[str, object] | None) -> gradcomp_pb2.CodecSpec | None:
    """A CodecSpec from a name and parameters; None lets the policy decide.

    Parameter values may be numbers, bools or strings: the proto carries
    strings, and each codec parses its own.
    """
    if codec is None:
        if params:
            raise ValueError("params given without a codec to apply them to")
        return None
    spec = gradcomp_pb2.CodecSpec(name=codec)
    for key, value in (params or {}).items():
        spec.params[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return spec


@dataclasses.dataclass(frozen=True)
class Gossip:
    """Gossip mode (the daemon's GossipSpec): instead of the average over
    every worker, a reduce returns this worker's tensor mixed with its
    neighbours' on `topology` ("ring", "torus", "torus:RxC", "full" or
    "edges:0-1,1-2:0.25,..."). `rank` 0 mixes exactly (plain gossip);
    rank r > 0 sends PowerGossip's rank-r factors of the differences on
    each edge for matrices (1-D tensors always gossip plainly), with
    `power_steps` power steps per reduce (0 = 1). `diffusion` is the step
    size gamma (0 = 1.0; the PowerGossip paper's default is 1.308).
    `choco_topk_fraction` > 0 (with rank 0) runs Choco-Gossip instead,
    sending the top fraction of each tensor's entries per round, with
    `diffusion` as its consensus step size. `fresh_factors` (PowerGossip,
    rank > 0, only) starts every edge's factors from a fresh random draw
    each round instead of warm-starting them from the last round's.
    Every worker of a job must name the same spec."""
    topology: str = "ring"
    rank: int = 1
    power_steps: int = 1
    diffusion: float = 0.0
    choco_topk_fraction: float = 0.0
    fresh_factors: bool = False

    def __post_init__(self):
        if not self.topology:
            raise ValueError("Gossip: empty topology; expected ring, torus, "
                             "torus:RxC, full or edges:...")
        if (self.rank < 0 or self.power_steps < 0 or
                not 0 <= self.diffusion < math.inf):
            raise ValueError(f"Gossip: rank, power_steps and diffusion must be "
                             f">= 0 (diffusion finite), got {self.rank}, "
                             f"{self.power_steps}, {self.diffusion}")
        if not 0 <= self.choco_topk_fraction <= 1:
            raise ValueError(f"Gossip: choco_topk_fraction must be in [0, 1] "
                             f"(0: no Choco-Gossip), got "
                             f"{self.choco_topk_fraction}")
        if self.choco_topk_fraction > 0 and self.rank != 0:
            raise ValueError(f"Gossip: Choco-Gossip (choco_topk_fraction "
                             f"{self.choco_topk_fraction}) needs rank 0, got "
                             f"rank {self.rank}")
        if self.fresh_factors and (self.rank == 0 or
                                   self.choco_topk_fraction > 0):
            raise ValueError(f"Gossip: fresh_factors is a PowerGossip option "
                             f"and needs rank > 0 without Choco-Gossip, got "
                             f"rank {self.rank}, choco_topk_fraction "
                             f"{self.choco_topk_fraction}")


def _set_mode(request: gradcomp_pb2.ReduceRequest, gossip: Gossip | None,
              consensus_distance: float | None) -> None:
    """Sets a ReduceRequest's mode, gossip spec and client-reported
    consensus distance (all unset: the global average)."""
    if gossip is None and consensus_distance is None:
        return
    if not hasattr(gradcomp_pb2, "GossipSpec"):
        raise GradcompError("Reduce", "", grpc.StatusCode.UNIMPLEMENTED,
                            "these protobuf stubs have no gossip mode: rerun "
                            "client/python/generate_protos.sh against a proto "
                            "with ReduceRequest.mode and GossipSpec")
    if gossip is not None:
        request.mode = gradcomp_pb2.REDUCE_MODE_GOSSIP
        request.gossip.CopyFrom(gradcomp_pb2.GossipSpec(
            topology=gossip.topology, rank=gossip.rank,
            power_steps=gossip.power_steps, diffusion=gossip.diffusion,
            choco_topk_fraction=gossip.choco_topk_fraction,
            fresh_factors=gossip.fresh_factors))
    if consensus_distance is not None:
        request.consensus_distance = consensus_distance


def _batch_requests(batches: Mapping[str, Sequence[str]] | None,
                    names: Sequence[str]) -> dict[str, gradcomp_pb2.ReduceBatch]:
    """{tensor name: its ReduceBatch} for the tensors of one stream. Every
    member must be among `names` (its batch waits for it) and in one batch."""
    batch_of: dict[str, gradcomp_pb2.ReduceBatch] = {}
    known = set(names)
    for batch_id, members in (batches or {}).items():
        members = list(members)
        missing = sorted(set(members) - known)
        if missing:
            raise ValueError(f"batch '{batch_id}' names tensors this call does "
                             f"not reduce: {missing}")
        batch = gradcomp_pb2.ReduceBatch(id=batch_id, members=members)
        for member in members:
            if member in batch_of:
                raise ValueError(f"tensor '{member}' is in batches "
                                 f"'{batch_of[member].id}' and '{batch_id}', "
                                 f"expected one")
            batch_of[member] = batch
    return batch_of


# SharedMemorySlice.offset and byte_size are uint64s.
_MAX_UINT64 = 2**64 - 1


def _shm_dtype(name: str, source: ShmTensor, target: ShmTensor) -> int:
    """The wire dtype of a (source, target) pair of shared-memory tensors;
    ValueError unless both have one shape and dtype and offsets a uint64
    holds, TypeError for a dtype gradcomp does not reduce."""
    if source.shape != target.shape or source.dtype != target.dtype:
        raise ValueError(f"tensor '{name}': output {target.shape} {target.dtype} "
                         f"differs from input {source.shape} {source.dtype}")
    if not (0 <= source.offset <= _MAX_UINT64 and 0 <= target.offset <= _MAX_UINT64):
        raise ValueError(f"tensor '{name}': offsets {source.offset} (input) and "
                         f"{target.offset} (output), expected 0 to 2**64 - 1")
    dtype = _PB_DTYPE.get(source.dtype)
    if dtype is None:
        raise TypeError(f"gradcomp reduces float16, float32 or float64; "
                        f"got {source.dtype}")
    return dtype


# The daemon's bound on a request's parts (kMaxRequestParts).
MAX_REQUEST_PARTS = 128

# Bytes of codec state in one message of import_state's stream: far under
# the daemon's smallest message cap (max_tensor_bytes + 1 MiB).
STATE_PIECE_BYTES = 512 << 10


def _as_parts(template: gradcomp_pb2.ReduceRequest,
              tensors: Sequence[tuple[str, ShmTensor, ShmTensor]],
              batch_of: Mapping[str, gradcomp_pb2.ReduceBatch]
              ) -> list[gradcomp_pb2.ReduceRequest] | None:
    """Shared-memory tensors [(name, source, target)], each pair already
    checked by _shm_dtype, as requests with parts: each a copy of `template`
    (job, step, dtype, codec, mode) with request_id = its index, holding a
    run of tensors in one batch of `batch_of` (by identity, as
    _batch_requests shares them) or in none, at most MAX_REQUEST_PARTS.
    None unless all are of one dtype (the template's: parts have none of
    their own), every input lies in one region, every output in one
    region, each output at the same distance from its input, and the input
    and output spans of each request do not overlap (the daemon's
    conditions). Zero-element tensors have no bytes, so no place in the
    layout: they go as parts at offset 0, which the daemon sends inline.
    Built from the tensors directly, not from a request per tensor: a
    client pays this on every step."""
    holding = [entry for entry in tensors if entry[1].byte_size > 0]
    if not holding or any(source.dtype != holding[0][1].dtype
                          for _, source, _ in tensors):
        return None
    _, first_source, first_target = holding[0]
    delta = first_target.offset - first_source.offset
    for _, source, target in holding:
        if (source.region != first_source.region
                or target.region != first_target.region
                or target.offset - source.offset != delta):
            return None
    groups: list[list[tuple[str, ShmTensor, ShmTensor]]] = []
    group_batch = None
    for entry in tensors:
        batch = batch_of.get(entry[0])
        if (not groups or len(groups[-1]) == MAX_REQUEST_PARTS
                or batch is not group_batch):
            groups.append([])
            group_batch = batch
        groups[-1].append(entry)
    chunks = []
    for index, group in enumerate(groups):
        spans = [(source.offset, source.offset + source.byte_size)
                 for _, source, _ in group if source.byte_size > 0]
        start = min((s for s, _ in spans), default=first_source.offset)
        end = max((e for _, e in spans), default=start)
        # Every output is its input moved by `delta`, so the output span is
        # the input span moved by `delta`.
        if first_source.region == first_target.region and abs(delta) < end - start:
            return None
        chunk = gradcomp_pb2.ReduceRequest()
        chunk.CopyFrom(template)
        chunk.request_id = index
        chunk.input_shm.region = first_source.region
        chunk.input_shm.offset = start
        chunk.input_shm.byte_size = end - start
        chunk.output_shm.region = first_target.region
        chunk.output_shm.offset = start + delta
        chunk.output_shm.byte_size = end - start
        batch = batch_of.get(group[0][0])
        if batch is not None:
            chunk.batch.CopyFrom(batch)
        for name, source, _ in group:
            chunk.parts.add(tensor=name, shape=source.shape,
                            offset=source.offset - start if source.byte_size else 0)
        chunks.append(chunk)
    return chunks


def _as_wire_array(array: np.ndarray) -> np.ndarray:
    """`array` as a C-ordered little-endian float array, copying only if needed."""
    array = np.asarray(array)
    if array.dtype.kind != "f" or array.dtype.itemsize not in (2, 4, 8):
        raise TypeError(f"gradcomp reduces float16, float32 or float64 arrays; "
                        f"got {array.dtype}")
    # Not ascontiguousarray: it turns a 0-d array (a scalar) into 1-d.
    return np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")


# ReduceRequest.step is an int64, and the daemon takes steps >= 0.
_MAX_STEP = 2**63 - 1


def _check_step(step: int) -> None:
    if not 0 <= step <= _MAX_STEP:
        raise ValueError(f"step {step}: expected 0 <= step <= 2**63 - 1")


class _StreamAnswers:
    """The answers of one ReduceStream for the tensors `names`, in the order
    sent: each tensor's result or failure, by name, at most one each."""

    def __init__(self, target: str, names: Sequence[str]):
        self.target = target
        self.names = names
        self.results: dict[str, object] = {}
        self.failures: dict[str, tuple[grpc.StatusCode, str]] = {}

    def _bad_reply(self, message: str) -> GradcompError:
        return GradcompError("ReduceStream", self.target, grpc.StatusCode.INTERNAL,
                             f"bad reply from gradcompd: {message}")

    def sent(self, items: Sequence, request_id: int) -> object:
        """items[request_id], the request a reply answers; GradcompError
        INTERNAL for an id that was not sent."""
        if request_id >= len(items):
            raise self._bad_reply(f"request_id {request_id}, expected one of "
                                  f"the {len(items)} sent (0 to {len(items) - 1})")
        return items[request_id]

    def _first_answer(self, name: str) -> None:
        if name in self.results or name in self.failures:
            raise self._bad_reply(f"a second answer for tensor '{name}'")

    def result(self, name: str, result: object) -> None:
        self._first_answer(name)
        self.results[name] = result

    def failure(self, name: str, error_code: int, message: str) -> None:
        self._first_answer(name)
        self.failures[name] = (status_code(error_code), message)

    def check(self, ended: grpc.RpcError | None) -> None:
        """Raises GradcompError if the stream `ended` with an error, or some
        tensors failed or got no answer, with the failures in its `failures`
        and the other tensors' results in its `completed`."""
        missing = [name for name in self.names
                   if name not in self.results and name not in self.failures]
        if ended is None and not self.failures and not missing:
            return
        # The stream's own error comes first, then the first tensor's; a
        # stream that ended well without every answer is the daemon's fault.
        code, problems = grpc.StatusCode.INTERNAL, []
        if ended is not None:
            code = ended.code()
            problems.append(ended.details() or "")
        if self.failures:
            first_code, first_details = next(iter(self.failures.values()))
            if ended is None:
                code = first_code
            problems.append(f"{len(self.failures)} of {len(self.names)} tensors "
                            f"failed, first: {first_details}")
        if missing:
            problems.append(f"the stream ended without an answer for {missing}")
        error = GradcompError("ReduceStream", self.target, code,
                              "; ".join(filter(None, problems)), self.failures)
        error.completed = {name: self.results[name] for name in self.names
                           if name in self.results}
        raise error


DEFAULT_TARGET = "unix:/run/gradcomp/gradcomp.sock"
"""Where gradcompd listens by default (its --listen)."""


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds "authorization: Bearer <token>" to every call of a channel."""

    def __init__(self, token: str):
        self._metadata = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _CallDetails(details.method, details.timeout,
                            list(details.metadata or ()) + [self._metadata],
                            details.credentials, details.wait_for_ready,
                            details.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    """A call's details with other metadata (gRPC's own type is private)."""

    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


# sockaddr_un's sun_path holds 108 bytes with the terminating NUL.
_MAX_UNIX_PATH_BYTES = 107


def _numpy_dtype(dtype: Any) -> np.dtype | None:
    """`dtype` as a little-endian numpy dtype: a numpy dtype or its name, or
    a torch dtype (torch.float16 is numpy's float16); None if it is none."""
    for name in (dtype, str(dtype).removeprefix("torch.")):
        try:
            return np.dtype(name).newbyteorder("<")
        except TypeError:  # "bfloat16", or a torch dtype in the first try
            continue
    return None


class Client:
    """A connection to one gradcompd.

    Args:
      target: "unix:/path" (default: gradcompd's default socket,
        $GRADCOMP_TARGET if set) or "host:port".
      timeout: deadline of each RPC in seconds; a Reduce waits for every
        worker of its job, so this bounds how long a straggler holds a caller.
        The default, 300 s, is longer than the daemon's own deadlines at their
        defaults (60 s per collective round, two for PowerSGD; 10 s of
        --memory_wait), so that a stalled reduce ends with the daemon's error
        naming the missing ranks, not a bare DEADLINE_EXCEEDED. A deadline
        that passes here does not stop the reduce in the daemon.
      token: sent as "authorization: Bearer <token>" on every call, for a
        daemon on TCP with --client_token_file; default $GRADCOMP_TOKEN if
        set. A daemon on its unix socket needs none.
      shm_mode: permission bits of the shared-memory objects made for this
        client (the torch hook's regions, the CUDA liveness lock); 0o600 by
        default. A daemon that runs as another uid (with --shm_owner_uids)
        must be able to open them read-write: e.g. 0o666 in a pod's own
        /dev/shm.
      shm_prefix: the start of those objects' names: the daemon's
        --shm_prefix ("/gradcomp." by default), as it maps no other.
    """

    def __init__(self, target: str | None = None, timeout: float = 300.0,
                 token: str | None = None, shm_mode: int = 0o600,
                 shm_prefix: str = DEFAULT_SHM_PREFIX):
        if target is None:
            target = os.environ.get("GRADCOMP_TARGET") or DEFAULT_TARGET
        if not target:
            raise ValueError("empty gradcompd target; expected host:port or unix:/path")
        path = next((target[len(scheme):] for scheme in ("unix://", "unix:")
                     if target.startswith(scheme)), None)
        if path is not None and len(os.fsencode(path)) > _MAX_UNIX_PATH_BYTES:
            # gRPC would fail every call with "Failed to create secure client channel".
            raise ValueError(f"the socket path of target {target!r} has "
                             f"{len(os.fsencode(path))} bytes; expected at most "
                             f"{_MAX_UNIX_PATH_BYTES} (what a unix socket address holds)")
        self.target = target
        self.timeout = timeout
        # The mode of the shared-memory objects made for this client (the
        # torch hook's regions, the CUDA liveness lock): see ShmRegion.
        self.shm_mode = shm_mode
        check_shm_prefix(shm_prefix)
        self.shm_prefix = shm_prefix
        source = "token"
        if token is None:
            token, source = os.environ.get("GRADCOMP_TOKEN") or None, "$GRADCOMP_TOKEN"
        if token:
            # Trimmed as the daemon trims its token file (a secret's
            # trailing newline): ASCII whitespace only, so a token the
            # daemon's file would refuse is refused here too. gRPC cannot
            # send other bytes as metadata.
            token = token.strip(_ASCII_WHITESPACE)
            bad = next((c for c in token if not ("!" <= c <= "~")), None)
            if bad is not None:
                raise ValueError(f"{source} holds {bad!r}; expected printable ASCII "
                                 f"without spaces, as the daemon's --client_token_file")
        self._channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        if token:
            self._channel = grpc.intercept_channel(self._channel, _BearerToken(token))
        self._stub = gradcomp_pb2_grpc.GradcompStub(self._channel)
        # The inline reduces bypass protobuf for the tensor bytes
        # (inline_wire): requests go out as bytes, replies come back as
        # (message without data, view of data).
        self._reduce = self._channel.unary_unary(
            "/gradcomp.v1.Gradcomp/Reduce",
            response_deserializer=inline_wire.decode_response)
        self._reduce_stream = self._channel.stream_stream(
            "/gradcomp.v1.Gradcomp/ReduceStream",
            response_deserializer=inline_wire.decode_stream_response)
        # Made by the first CUDA registration (_cuda_lock_key), under the
        # guard: two lock objects made by two threads, the first dropped,
        # would let the daemon reclaim the regions registered on it.
        self._cuda_lock: ShmRegion | None = None
        self._cuda_lock_guard = threading.Lock()
        # Registrations that named the lock: done, or still in flight.
        self._cuda_lock_users = 0
        # Sent as "gradcomp-client-id" metadata with the shared-memory calls:
        # the daemon's regions belong to it. Unique per Client object; made
        # here, not on first use, so that threads sharing the client agree.
        self.client_id = f"{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"

    def close(self) -> None:
        """Closes the channel and releases the CUDA regions' liveness lock:
        the daemon drops this client's CUDA regions at its next scan."""
        self._channel.close()
        with self._cuda_lock_guard:
            if self._cuda_lock is not None:
                self._cuda_lock.release()
                self._cuda_lock = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def wait_ready(self, timeout: float) -> None:
        """Blocks until the channel connects; GradcompError UNAVAILABLE if not in time."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise GradcompError("connect", self.target, grpc.StatusCode.UNAVAILABLE,
                                f"no connection within {timeout} s") from None

    def wait_serving(self, timeout: float) -> None:
        """Blocks until the daemon's health (grpc.health.v1, the service the
        kubelet probes) is SERVING: it listens, and every peer was connected
        both ways at its start-up. A reduce sent before then waits for the
        missing peers until --collective_timeout and fails. Health stays
        SERVING while the daemon runs, so this does not tell whether a peer
        that came up has gone since (gradcomp_peers_up does). GradcompError
        UNAVAILABLE, with the last status seen, if not in time."""
        check = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda empty: b"",  # service "": the daemon
            response_deserializer=_health_status)
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            left = deadline - time.monotonic()
            try:
                status = check(None, timeout=max(0.1, min(left, 5.0)))
                if status == _SERVING:
                    return
                last = _HEALTH_NAMES.get(status, f"status {status}")
            except grpc.RpcError as error:
                last = f"{error.code().name}: {error.details()}"
            if time.monotonic() + 0.2 >= deadline:
                raise GradcompError(
                    "Health/Check", self.target, grpc.StatusCode.UNAVAILABLE,
                    f"not SERVING within {timeout} s (last: {last}); a daemon "
                    f"is NOT_SERVING until all its peers are connected")
            time.sleep(0.2)

    def _call(self, rpc: str, request: object) -> object:
        try:
            return getattr(self._stub, rpc)(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise GradcompError.from_rpc_error(rpc, self.target, error) from None

    @staticmethod
    def _header(array: np.ndarray, name: str, step: int, job: str,
                spec: gradcomp_pb2.CodecSpec | None, request_id: int = 0,
                batch: gradcomp_pb2.ReduceBatch | None = None,
                gossip: Gossip | None = None,
                consensus_distance: float | None = None
                ) -> gradcomp_pb2.ReduceRequest:
        """The ReduceRequest of `array` without its data (see
        inline_wire.encode_request)."""
        header = gradcomp_pb2.ReduceRequest(
            job=job, tensor=name, step=step, dtype=_PB_DTYPE[array.dtype],
            shape=array.shape, request_id=request_id)
        if spec is not None:
            header.codec.CopyFrom(spec)
        if batch is not None:
            header.batch.CopyFrom(batch)
        _set_mode(header, gossip, consensus_distance)
        return header

    def _result(self, response: gradcomp_pb2.ReduceResponse, data: memoryview,
                shape: tuple[int, ...]) -> tuple[np.ndarray, ReduceStats]:
        dtype = _NP_DTYPE.get(response.dtype)
        if dtype is None:
            raise GradcompError("Reduce", self.target, grpc.StatusCode.INTERNAL,
                                f"tensor '{response.tensor}': response dtype "
                                f"{response.dtype} is not float16/32/64")
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if data.nbytes != expected:
            raise GradcompError("Reduce", self.target, grpc.StatusCode.INTERNAL,
                                f"tensor '{response.tensor}': {data.nbytes} "
                                f"result bytes for shape {list(shape)} of {dtype} "
                                f"({expected} expected)")
        # `data` views the received bytes, which are immutable: one copy gives
        # callers a writable array of their own.
        result = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        return result, ReduceStats.from_proto(response.stats)

    def reduce(self, array: np.ndarray, name: str, step: int,
               codec: str | None = None,
               params: Mapping[str, object] | None = None,
               job: str = "default", gossip: Gossip | None = None,
               consensus_distance: float | None = None
               ) -> tuple[np.ndarray, ReduceStats]:
        """Averages `array` over the job's workers, compressed with `codec`.

        `codec` None lets the daemon's policy choose. Returns the average in
        the input's dtype and shape, and the stats of this reduce.

        With `gossip` (a Gossip spec, the same on every worker) the result is
        instead `array` mixed with the topology's neighbours' (gossip mode).
        `consensus_distance`, if given, is reported to the daemon for its
        metrics (the trainer's own measure of how far the workers' models
        are apart).
        """
        _check_step(step)
        array = _as_wire_array(array)
        request = inline_wire.encode_request(
            self._header(array, name, step, job, codec_spec(codec, params),
                         gossip=gossip, consensus_distance=consensus_distance),
            array)
        try:
            response, data = self._reduce(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise GradcompError.from_rpc_error("Reduce", self.target, error) from None
        return self._result(response, data, array.shape)

    def reduce_many(self, tensors: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
                    step: int, codec: str | None = None,
                    params: Mapping[str, object] | None = None,
                    job: str = "default",
                    batches: Mapping[str, Sequence[str]] | None = None,
                    gossip: Gossip | None = None,
                    consensus_distance: float | None = None
                    ) -> dict[str, tuple[np.ndarray, ReduceStats]]:
        """Reduces a bucket of tensors over one ReduceStream.

        `batches` {batch id: member names} (members among `tensors`, the same
        on every worker) sends each batch's rounds as one collective
        (PowerSGD's P and Q of same-shape matrices; top-k or QSGD payloads
        of any shapes). `gossip` and
        `consensus_distance` as in reduce.

        Returns {name: (average, stats)} in the order given. If any tensor
        fails, the stream is still drained and GradcompError is raised with
        every failure in its `failures` and the other tensors' results in its
        `completed`; so too if the stream ends early (at the deadline, say),
        with its code, and its message names the tensors left unanswered.
        """
        _check_step(step)
        items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
        names = [name for name, _ in items]
        if len(set(names)) != len(names):
            raise ValueError("reduce_many: tensor names must be unique")
        arrays = [_as_wire_array(array) for _, array in items]
        spec = codec_spec(codec, params)
        batch_of = _batch_requests(batches, names)
        # Every header now, so that a bad argument raises here rather than
        # inside gRPC; each tensor's bytes join its header only as gRPC sends
        # it, so the bucket is never copied whole.
        headers = [self._header(array, name, step, job, spec, request_id=i,
                                batch=batch_of.get(name), gossip=gossip,
                                consensus_distance=consensus_distance)
                   for i, (name, array) in enumerate(zip(names, arrays))]
        requests = map(inline_wire.encode_request, headers, arrays)
        answers = _StreamAnswers(self.target, names)
        ended = None
        call = self._reduce_stream(requests, timeout=self.timeout)
        try:
            for reply, data in call:
                if reply.error_code != 0:
                    answers.failure(answers.sent(names, reply.request_id),
                                    reply.error_code, reply.error_message)
                    continue
                i = reply.result.request_id
                answers.result(answers.sent(names, i),
                               self._result(reply.result, data, arrays[i].shape))
        except grpc.RpcError as error:
            ended = error
        finally:
            # A bad reply raises mid-stream: the daemon stops reducing, and
            # gRPC sending, a bucket nobody waits for. After the last reply
            # this does nothing.
            call.cancel()
        answers.check(ended)
        return {name: answers.results[name] for name in names}

    def info(self) -> gradcomp_pb2.GetInfoResponse:
        """Version, wire format, codecs and their properties, world size, policy hash."""
        return self._call("GetInfo", gradcomp_pb2.GetInfoRequest())

    def get_policy(self) -> tuple[gradcomp_pb2.Policy, str]:
        """The daemon's policy and its hash."""
        response = self._call("GetPolicy", gradcomp_pb2.GetPolicyRequest())
        return response.policy, response.hash

    def set_policy(self, policy: gradcomp_pb2.Policy,
                   from_step: int | None = None) -> str:
        """Replaces the daemon's policy; returns the new hash. With
        `from_step` it decides steps >= from_step only, and earlier steps
        keep the policy they had: send the same call to every rank, with a
        step none has reached, and all switch at that step."""
        request = gradcomp_pb2.SetPolicyRequest(policy=policy)
        if from_step is not None:
            request.from_step = from_step
        response = self._call("SetPolicy", request)
        if from_step is not None and not response.HasField("from_step"):
            raise GradcompError(
                "SetPolicy", self.target, grpc.StatusCode.FAILED_PRECONDITION,
                f"the daemon does not know from_step (a version before it) and "
                f"applied the policy (hash {response.hash}) to every step at "
                f"once; upgrade it, or set the policy only while no step runs")
        return response.hash

    def declare_tensors(self, tensors: Mapping[str, tuple[Sequence[int], object]],
                        job: str = "default", generation: int = 0) -> str:
        """Declares the job's tensor list, {name: (shape, numpy dtype)}, the
        same on every worker. Each daemon checks that all ranks declared the
        same list (FAILED_PRECONDITION naming both ranks otherwise) and then
        accepts only declared tensors for `job`. Declare again with a new
        `generation` to change the list. Returns the list's hash."""
        declarations = []
        for name, (shape, dtype) in tensors.items():
            pb_dtype = _PB_DTYPE.get(_numpy_dtype(dtype))
            if pb_dtype is None:
                raise TypeError(f"tensor {name!r}: dtype {dtype} is not "
                                "one of float16, float32, float64")
            declarations.append(gradcomp_pb2.TensorDeclaration(
                name=name, dtype=pb_dtype, shape=[int(d) for d in shape]))
        response = self._call("DeclareTensors", gradcomp_pb2.DeclareTensorsRequest(
            job=job, tensors=declarations, generation=generation))
        return response.list_hash

    def export_state(self, job: str = "default") -> bytes:
        """The daemon's codec state of `job` (residuals, momenta, warm starts)
        as an opaque blob for a trainer's checkpoint. It comes in pieces
        (ExportStateStream), so it may be larger than a gRPC message."""
        try:
            pieces = self._stub.ExportStateStream(
                gradcomp_pb2.ExportStateRequest(job=job), timeout=self.timeout)
            return b"".join(piece.state for piece in pieces)
        except grpc.RpcError as error:
            raise GradcompError.from_rpc_error("ExportStateStream", self.target,
                                               error) from None

    def import_state(self, state: bytes, job: str = "default") -> None:
        """Restores codec state exported by export_state, sent in pieces
        (ImportStateStream); a bad blob raises GradcompError INVALID_ARGUMENT
        and imports nothing."""
        blob = memoryview(state)

        def pieces():
            sent = 0
            while True:
                piece = bytes(blob[sent:sent + STATE_PIECE_BYTES])
                if sent == 0:
                    yield gradcomp_pb2.ImportStateRequest(
                        job=job, state_bytes=len(blob), state=piece)
                else:
                    yield gradcomp_pb2.ImportStateRequest(state=piece)
                sent += len(piece)
                if sent >= len(blob):
                    return

        try:
            self._stub.ImportStateStream(pieces(), timeout=self.timeout)
        except grpc.RpcError as error:
            raise GradcompError.from_rpc_error("ImportStateStream", self.target,
                                               error) from None

    def release_job(self, job: str = "default") -> ReleasedJob:
        """Ends `job` on this daemon: frees its codec state, declared tensor
        list, gossip mode and rendezvous steps. Call it on every worker after
        the job's last reduce (export_state first to keep the state); a later
        reduce of `job` starts afresh. FAILED_PRECONDITION while a reduce of
        the job is in flight on the daemon."""
        response = self._call("ReleaseJob", gradcomp_pb2.ReleaseJobRequest(job=job))
        return ReleasedJob(tensors=response.tensors, state_bytes=response.state_bytes)

    # Shared memory (gradcomp.shm; the daemon needs --allow_client_shm).

    def _shm_call(self, rpc: str, request: object) -> object:
        try:
            return getattr(self._stub, rpc)(
                request, timeout=self.timeout,
                metadata=(("gradcomp-client-id", self.client_id),))
        except grpc.RpcError as error:
            raise GradcompError.from_rpc_error(rpc, self.target, error) from None

    def register_shm(self, name: str, region: ShmRegion, offset: int = 0,
                     byte_size: int | None = None) -> None:
        """Registers bytes [offset, offset + byte_size) of `region` (default: to
        its end) as `name`, which must be unique on the daemon."""
        if not 0 <= offset < region.byte_size:
            raise ValueError(f"register_shm '{name}': offset {offset}, expected 0 "
                             f"to {region.byte_size - 1} (the region holds "
                             f"{region.byte_size} bytes)")
        size = region.byte_size - offset if byte_size is None else byte_size
        if not 0 < size <= region.byte_size - offset:
            raise ValueError(f"register_shm '{name}': byte_size {size}, expected "
                             f"1 to {region.byte_size - offset} (the region holds "
                             f"{region.byte_size} bytes, from offset {offset})")
        self._shm_call("RegisterSystemSharedMemory",
                       gradcomp_pb2.RegisterSystemSharedMemoryRequest(
                           name=name, shm_key=region.key, offset=offset,
                           byte_size=size))
        region.registered[name] = (offset, size)

    def unregister_shm(self, name: str = "") -> None:
        """Unregisters region `name`, or every region of this client if empty.
        FAILED_PRECONDITION while a request is using it."""
        self._shm_call("UnregisterSharedMemory",
                       gradcomp_pb2.UnregisterSharedMemoryRequest(name=name))

    def shm_status(self, name: str = "") -> dict[str, int]:
        """{region name: byte size} of this client's regions (or the one named)."""
        response = self._shm_call("SharedMemoryStatus",
                                  gradcomp_pb2.SharedMemoryStatusRequest(name=name))
        return {region.name: region.byte_size for region in response.regions}

    def _cuda_lock_key(self) -> str:
        """The key of this client's liveness lock for its CUDA regions: a
        1-byte shm object whose shared flock it holds until close() (or the
        process dies), after which the daemon reclaims the regions. A child
        forked meanwhile inherits the lock and keeps them alive too."""
        with self._cuda_lock_guard:
            if self._cuda_lock is None:
                self._cuda_lock = ShmRegion(1, tag="cuda-lock", mode=self.shm_mode,
                                            prefix=self.shm_prefix)
            self._cuda_lock_users += 1
            return self._cuda_lock.key

    def _cuda_lock_unused(self) -> None:
        """A registration that named the lock failed: with no other one
        done or in flight, the lock goes (the daemon never learnt its key,
        so nothing would reclaim it should this process be killed)."""
        with self._cuda_lock_guard:
            self._cuda_lock_users -= 1
            if self._cuda_lock_users == 0 and self._cuda_lock is not None:
                self._cuda_lock.release()
                self._cuda_lock = None

    def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int,
                          byte_size: int) -> None:
        """Registers `byte_size` bytes of CUDA device memory that this process
        exported (cudaIpcGetMemHandle), from the allocation's start, as `name`,
        tied to this client's liveness lock (reclaimed by the daemon once
        this client is closed or its process exits).
        FAILED_PRECONDITION "this gradcompd has no usable CUDA device" on a
        daemon without a GPU; INVALID_ARGUMENT for a handle it cannot open."""
        request = gradcomp_pb2.RegisterCudaSharedMemoryRequest(
            name=name, raw_handle=raw_handle, device_id=device_id,
            byte_size=byte_size)
        request.lock_key = self._cuda_lock_key()
        try:
            self._shm_call("RegisterCudaSharedMemory", request)
        except BaseException:
            self._cuda_lock_unused()
            raise

    def register_cuda_tensor(self, name: str, tensor) -> ShmTensor:
        """Registers a contiguous torch CUDA tensor's memory as region `name`
        and returns the tensor as a slice of it, for reduce_shm (input and
        output may be the same tensor's slices only if they do not overlap:
        use two tensors). Keep the tensor alive while it is registered.

        The slice's dtype is the tensor's, so it must be one numpy has:
        ValueError for another (torch.bfloat16, say) before anything is
        registered."""
        try:
            dtype = cuda_ipc.numpy_dtype(tensor)
        except TypeError:
            raise ValueError(
                f"register_cuda_tensor '{name}': {tensor.dtype} has no numpy "
                f"dtype for the slice; expected torch.float16, torch.float32 or "
                f"torch.float64 (what reduce_shm reduces), or torch.uint8 for a "
                f"buffer of bytes") from None
        handle = cuda_ipc.cuda_ipc_handle(tensor)
        self.register_cuda_shm(name, handle.raw, handle.device,
                               handle.region_bytes)
        return ShmTensor(name, handle.offset, tuple(tensor.shape), dtype)

    @staticmethod
    def _shm_request(name: str, step: int, job: str, source: ShmTensor,
                     target: ShmTensor, spec: gradcomp_pb2.CodecSpec | None,
                     request_id: int = 0,
                     batch: gradcomp_pb2.ReduceBatch | None = None,
                     gossip: Gossip | None = None,
                     consensus_distance: float | None = None
                     ) -> gradcomp_pb2.ReduceRequest:
        request = gradcomp_pb2.ReduceRequest(
            job=job, tensor=name, step=step,
            dtype=_shm_dtype(name, source, target), shape=source.shape,
            request_id=request_id)
        if source.byte_size == 0:
            # No bytes to point at (the daemon refuses an empty slice).
            request.data = b""
        else:
            request.input_shm.CopyFrom(gradcomp_pb2.SharedMemorySlice(
                region=source.region, offset=source.offset,
                byte_size=source.byte_size))
            request.output_shm.CopyFrom(gradcomp_pb2.SharedMemorySlice(
                region=target.region, offset=target.offset,
                byte_size=target.byte_size))
        if spec is not None:
            request.codec.CopyFrom(spec)
        if batch is not None:
            request.batch.CopyFrom(batch)
        _set_mode(request, gossip, consensus_distance)
        return request

    def reduce_shm(self, name: str, step: int, source: ShmTensor,
                   target: ShmTensor, codec: str | None = None,
                   params: Mapping[str, object] | None = None,
                   job: str = "default", gossip: Gossip | None = None,
                   consensus_distance: float | None = None) -> ReduceStats:
        """Averages the tensor at `source` over the job's workers into
        `target` (both from ShmRegion.tensor, not overlapping); `gossip` and
        `consensus_distance` as in reduce."""
        _check_step(step)
        response = self._shm_call("Reduce", self._shm_request(
            name, step, job, source, target, codec_spec(codec, params),
            gossip=gossip, consensus_distance=consensus_distance))
        return ReduceStats.from_proto(response.stats)

    def reduce_many_shm(self, tensors: Mapping[str, tuple[ShmTensor, ShmTensor]],
                        step: int, codec: str | None = None,
                        params: Mapping[str, object] | None = None,
                        job: str = "default",
                        batches: Mapping[str, Sequence[str]] | None = None,
                        gossip: Gossip | None = None,
                        consensus_distance: float | None = None,
                        parts: bool = True
                        ) -> dict[str, ReduceStats]:
        """reduce_shm for a bucket {name: (source, target)} over one
        ReduceStream; `batches`, `gossip`, `consensus_distance` and failures
        as in reduce_many, with {name: stats} in GradcompError.completed.

        With `parts` (the default), tensors laid out alike in one input and
        one output region (a bucket and its copy) go as requests with parts,
        up to MAX_REQUEST_PARTS tensors of one batch per request, which spares the client
        and the daemon a message per tensor; any other layout, or `parts`
        False, sends a request per tensor. Results and failures are the same.
        """
        _check_step(step)
        names = list(tensors)
        spec = codec_spec(codec, params)
        batch_of = _batch_requests(batches, names)
        entries = [(name, *tensors[name]) for name in names]
        dtypes = [_shm_dtype(*entry) for entry in entries]  # every pair checked
        chunks = None
        if parts and entries:
            template = gradcomp_pb2.ReduceRequest(job=job, step=step,
                                                  dtype=dtypes[0])
            if spec is not None:
                template.codec.CopyFrom(spec)
            _set_mode(template, gossip, consensus_distance)
            chunks = _as_parts(template, entries, batch_of)
        if chunks is not None:
            requests = chunks
        else:
            requests = [self._shm_request(name, step, job, *tensors[name], spec,
                                          request_id=i, batch=batch_of.get(name),
                                          gossip=gossip,
                                          consensus_distance=consensus_distance)
                        for i, name in enumerate(names)]
        answers = _StreamAnswers(self.target, names)

        def record(reply: gradcomp_pb2.ReduceStreamResponse,
                   sent_names: Sequence[str]) -> None:
            if reply.error_code != 0:
                answers.failure(answers.sent(sent_names, reply.request_id),
                                reply.error_code, reply.error_message)
            else:
                answers.result(answers.sent(sent_names, reply.result.request_id),
                               ReduceStats.from_proto(reply.result.stats))

        ended = None
        call = self._stub.ReduceStream(
            iter(requests), timeout=self.timeout,
            metadata=(("gradcomp-client-id", self.client_id),))
        try:
            for reply in call:
                if chunks is None:
                    record(reply, names)
                    continue
                part_names = [part.tensor for part in
                              answers.sent(chunks, reply.request_id).parts]
                if reply.part_results:
                    for part in reply.part_results:
                        record(part, part_names)
                elif reply.error_code != 0:  # the request was refused whole
                    for name in part_names:
                        answers.failure(name, reply.error_code, reply.error_message)
        except grpc.RpcError as error:
            ended = error
        finally:
            # A bad reply raises mid-stream: the daemon stops reducing, and
            # gRPC sending, a bucket nobody waits for. After the last reply
            # this does nothing.
            call.cancel()
        answers.check(ended)
        return {name: answers.results[name] for name in names}
