"""The exception every gradcomp client call raises when the daemon says no."""
from __future__ import annotations

from typing import Mapping

import grpc

_CODES_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def status_code(value: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a google.rpc.Code number (UNKNOWN if unheard of)."""
    return _CODES_BY_VALUE.get(value, grpc.StatusCode.UNKNOWN)


class GradcompError(Exception):
    """A failed call to gradcompd.

    Attributes:
      rpc: the RPC that failed, e.g. "Reduce".
      target: the daemon's address.
      code: the grpc.StatusCode, e.g. grpc.StatusCode.INVALID_ARGUMENT.
      details: the daemon's message.
      failures: for ReduceStream, every failed tensor -> (code, details).
      completed: for ReduceStream, what the tensors answered before the
        error returned: name -> (average, stats) from Client.reduce_many,
        name -> stats from Client.reduce_many_shm.
    """

    def __init__(self, rpc: str, target: str, code: grpc.StatusCode,
                 details: str,
                 failures: Mapping[str, tuple[grpc.StatusCode, str]] | None = None):
        self.rpc = rpc
        self.target = target
        self.code = code
        self.details = details
        self.failures = dict(failures or {})
        self.completed: dict = {}
        super().__init__(f"{rpc} to gradcompd at {target} failed: "
                         f"{code.name}: {details}")

    def __reduce__(self):
        # Pickled whole (a worker process's error reaches its pool as it
        # was raised): the default pickles only the message.
        return (_rebuild, (type(self), self.rpc, self.target, self.code,
                           self.details, self.failures, self.completed))

    @classmethod
    def from_rpc_error(cls, rpc: str, target: str,
                       error: grpc.RpcError) -> "GradcompError":
        # Every RpcError a grpc stub raises is also a grpc.Call.
        return cls(rpc, target, error.code(), error.details() or "")


def _rebuild(cls: type, rpc: str, target: str, code: grpc.StatusCode, details: str,
             failures: Mapping[str, tuple[grpc.StatusCode, str]],
             completed: dict) -> GradcompError:
    error = cls(rpc, target, code, details, failures)
    error.completed = completed
    return error
