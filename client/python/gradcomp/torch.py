"""A PyTorch DDP communication hook that averages gradients through gradcompd.

    import gradcomp.torch
    state = gradcomp.torch.HookState(model, "unix:/run/gradcomp/gradcomp.sock", job="mnist")
    ddp_model.register_comm_hook(state, gradcomp.torch.hook)

Each DDP bucket's gradients go to the local gradcompd over one ReduceStream,
one request per parameter, named by the parameter's name in the model (the
same on every rank), so the daemons rendezvous by name and step whatever the
bucket layout. The daemons compress, exchange and average; the hook writes
the averages back into the bucket and completes the Future DDP waits on.
The RPC runs on a background thread, so backward keeps computing the next
buckets while one is on the wire.

Tensors travel through shared memory when the daemon is on this host and
accepts it (`--allow_client_shm`): one region per bucket, the bucket copied
in and the averages copied out, no tensor bytes over gRPC. Otherwise, or
with shm=False, they travel inline. A daemon that restarted has forgotten
the regions: the hook registers a bucket's region again when the daemon
says it does not know it, and sends the bucket once more; one that came
back without shared memory gets the buckets inline from then on (unless
shm=True).

CUDA buckets go through CUDA IPC when the daemon is on this host and has a
usable GPU: the hook registers one device buffer of its own with the
daemon (RegisterCudaSharedMemory), copies each bucket into its slot on the
device, and copies the averages back on the device; the gradients never
pass through the client's host memory. The buffer is made anew (a new
region) when the buckets outgrow it, and unregistered by close(). Against a daemon
without a GPU, a remote one, or with cuda_ipc=False, CUDA buckets are
copied to host memory and take the path above; the hook warns once.

The step the daemon sees is HookState.step: it advances after the last
bucket of each iteration. state_dict()/load_state_dict() carry it together
with the daemon's codec state (error-feedback residuals, DGC momenta,
PowerSGD warm starts) through ExportState/ImportState, so a checkpoint
resumes exactly where training stopped.

Gossip mode (HookState(..., gossip=gradcomp.Gossip("ring", rank=1))) trains
decentralised, as D-PSGD and PowerGossip do: the hook sends each bucket's
PARAMETERS, not its gradients, through the daemons' gossip, writes the
mixed parameters back in place, and hands DDP the bucket's local gradient
unchanged. The optimizer then applies the local gradient to the mixed
model: x_i <- sum_j w_ij x_j - lr g_i(x_i). No worker ever holds the
average; docs/gossip.md ("Training through the hook") says why this way.
To resume in gossip mode, load each worker's own model checkpoint AFTER
wrapping the model in DDP: DDP's constructor copies rank 0's parameters to
every rank, which would replace the workers' differing models.

Mixed precision with a loss scaler (torch.cuda.amp.GradScaler, fp16):
pass grad_scaler=True. The daemons refuse Inf/NaN for compressing codecs
(they would poison the codec state), so an overflowing rank's bucket would
fail. Instead the hook agrees with the other ranks on every bucket: a rank
whose bucket holds Inf/NaN sends zeros, and every rank gets the bucket
back as NaN, so that every rank's scaler skips the step and lowers its
scale, as with DDP's own allreduce. One dense 1-element reduce per bucket
carries the agreement, beside the bucket's.
"""
# No `from __future__ import annotations`: DDP checks the hook's annotations
# against dist.GradBucket and torch.futures.Future by value, not as strings.
import concurrent.futures
import contextlib
import dataclasses
import errno
import functools
import ipaddress
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator, Mapping

import grpc
import numpy as np
import torch

from gradcomp.client import Client, Gossip, ReleasedJob
from gradcomp.errors import GradcompError
from gradcomp.shm import ShmRegion, ShmTensor


@dataclasses.dataclass(frozen=True)
class Codec:
    """A codec and its parameters, as the daemon's CodecSpec takes them."""
    name: str
    params: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def key(self) -> tuple:
        return self.name, tuple(sorted((k, str(v)) for k, v in self.params.items()))


@dataclasses.dataclass
class StepStats:
    """What the hook sent, summed over every tensor of every bucket."""
    steps: int = 0        # iterations completed (last buckets seen)
    reduces: int = 0      # tensors reduced
    raw_bytes: int = 0    # numel * 4 of those tensors: a dense fp32 exchange
    wire_bytes: int = 0   # compressed bytes this worker sent, all rounds
    batched: int = 0      # tensors reduced in a batch (same-shape or GATHER)
    overflows: int = 0    # buckets returned non-finite for GradScaler (grad_scaler=True)


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One gradient of a bucket: where it lies in the bucket's buffer (or,
    in gossip mode, in the copy of the parameters laid out as the buffer)."""
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int        # its byte offset in the buffer

    def view(self, buffer: np.ndarray) -> np.ndarray:
        """This tensor's elements in `buffer`, a flat array laid out as the
        bucket's buffer (no copy)."""
        start = self.offset // buffer.itemsize
        count = int(np.prod(self.shape, dtype=np.int64))
        return buffer[start:start + count].reshape(self.shape)

    def slice(self, region: str, base: int) -> ShmTensor:
        """This tensor in registered region `region`, whose byte `base`
        holds the buffer's first byte."""
        return ShmTensor(region, base + self.offset, self.shape, self.dtype)


def _split(names: list[str], max_members: int) -> list[list[str]]:
    """`names` in order, in batches of at most `max_members`; singletons,
    which have nothing to batch with, are left out."""
    batches = [names[start:start + max_members]
               for start in range(0, len(names), max_members)]
    return [members for members in batches if len(members) > 1]


def same_shape_batches(tensors: Iterable[tuple[str, tuple[int, ...], str]],
                       max_members: int = 64) -> dict[str, list[str]]:
    """{batch id: member names} for (name, shape, dtype) tensors: those of
    two or more dimensions with the same shape and dtype, in the order
    given, at most `max_members` per batch; singletons are left out."""
    by_shape: dict[tuple, list[str]] = {}
    for name, shape, dtype in tensors:
        if len(shape) >= 2:
            by_shape.setdefault((tuple(shape), dtype), []).append(name)
    batches = {}
    for (shape, dtype), names in by_shape.items():
        for members in _split(names, max_members):
            batches[f"{'x'.join(map(str, shape))}.{dtype}.{members[0]}"] = members
    return batches


# The gradient dtypes gradcompd reduces, as the numpy dtypes of ShmTensor.
_NUMPY_DTYPES = {torch.float16: np.dtype(np.float16),
                 torch.float32: np.dtype(np.float32),
                 torch.float64: np.dtype(np.float64)}


def _host(address: str) -> str:
    """The host of "host", "host:port", "[v6]:port" or a bare IPv6 address."""
    if address.startswith("["):
        return address[1:].partition("]")[0]
    if address.count(":") > 1:
        return address
    return address.partition(":")[0]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _transient(error: Exception) -> bool:
    """Whether a transport probe failed for a reason that says nothing of
    the transport: the daemon was not there (starting, restarting) or did
    not answer in time. Such a probe is asked again, not taken as a no."""
    return isinstance(error, GradcompError) and error.code in (
        grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _is_local(target: str) -> bool:
    """Whether gRPC target `target` is on this host: a unix socket, or
    loopback as host:port, dns:[//authority/]host:port or an ipv4:/ipv6:
    address list."""
    scheme, _, rest = target.partition(":")
    if scheme in ("unix", "unix-abstract"):
        return True
    if scheme == "dns":
        addresses = [rest[2:].partition("/")[2] if rest.startswith("//") else rest]
    elif scheme in ("ipv4", "ipv6"):
        addresses = rest.split(",")
    else:
        addresses = [target]
    return all(_is_loopback(_host(address)) for address in addresses)


def _unknown_region(error: GradcompError, name: str) -> bool:
    """Whether `error` is the daemon saying it has no region `name`
    (service/memory/shared_memory_registry.cc): a daemon that restarted
    since the region was registered."""
    return (error.code == grpc.StatusCode.NOT_FOUND
            and f"no shared-memory region '{name}'" in error.details)


def _shm_off(error: GradcompError) -> bool:
    """Whether `error` is the daemon saying it takes no client shared memory
    (service/api/convert.h, kClientShmOff): one restarted without
    --allow_client_shm since the hook chose shared memory."""
    return (error.code == grpc.StatusCode.FAILED_PRECONDITION
            and "client shared memory is off on this daemon" in error.details)


def _unregister(client: Client, name: str) -> None:
    """Unregisters region `name`; one the daemon does not know (it restarted
    since, perhaps with shared memory off) is gone already."""
    try:
        client.unregister_shm(name)
    except GradcompError as error:
        if not (_unknown_region(error, name) or _shm_off(error)):
            raise


def _close_all(steps: Iterable[Callable[[], None]]) -> None:
    """Calls every one of `steps`, even after one fails, then raises the
    first error."""
    first = None
    for step in steps:
        try:
            step()
        except BaseException as error:
            first = first or error
    if first is not None:
        raise first


class _ShmStaging:
    """One shared-memory region per bucket: the bucket's gradients in the
    first half, the daemon's averages in the second."""

    def __init__(self, client: Client, job: str):
        self._client = client
        self._job = job
        self._regions: dict[int, tuple[str, ShmRegion]] = {}
        self._generation = 0

    def region(self, index: int, nbytes: int) -> tuple[str, ShmRegion]:
        """The region of bucket `index`, made anew when the bucket's size
        changes (DDP rebuilds its buckets after the first iteration)."""
        current = self._regions.get(index)
        if current is not None and current[1].byte_size == 2 * nbytes:
            return current
        if current is not None:
            self._drop(index)
        region = ShmRegion(2 * nbytes, tag="torch-hook", mode=self._client.shm_mode,
                           prefix=self._client.shm_prefix)
        return self._register(index, region), region

    def renew(self, index: int) -> str:
        """Registers bucket `index`'s region again, under a new name, with a
        daemon that no longer knows it (one that restarted); the new name."""
        _, region = self._regions.pop(index)
        return self._register(index, region)

    def _register(self, index: int, region: ShmRegion) -> str:
        """Registers `region` as bucket `index`'s under a new name, or
        releases it if that fails."""
        self._generation += 1
        name = f"{self._job}.{self._client.client_id}.bucket{index}.{self._generation}"
        try:
            self._client.register_shm(name, region)
        except BaseException:
            region.release()
            raise
        self._regions[index] = (name, region)
        return name

    def _drop(self, index: int) -> None:
        name, region = self._regions.pop(index)
        try:
            _unregister(self._client, name)
        finally:
            region.release()

    def drop_after(self, last: int) -> None:
        """Unregisters and releases the regions of buckets after `last`, a
        step's last bucket: DDP's rebuild after the first step can leave
        fewer buckets, and their regions would hold /dev/shm until close()."""
        _close_all(functools.partial(self._drop, index)
                   for index in list(self._regions) if index > last)

    def close(self) -> None:
        """Unregisters and releases every region, even after a failure;
        raises the first error."""
        _close_all(functools.partial(self._drop, index) for index in list(self._regions))


# Slot offsets in the CUDA buffer are multiples of this: every dtype's
# alignment, and cudaMalloc's, so the daemon's copies stay aligned.
_CUDA_ALIGN = 256


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _CUDA_ALIGN) * _CUDA_ALIGN


def cuda_slot_layout(sizes: Mapping[int, int]) -> tuple[dict[int, tuple[int, int]], int]:
    """({bucket index: (input offset, output offset)}, total bytes) of one
    buffer holding, for each bucket of `sizes` ({index: bytes}) in index
    order, its gradients then the daemon's averages, each half aligned."""
    slots, end = {}, 0
    for index in sorted(sizes):
        half = _aligned(sizes[index])
        slots[index] = (end, end + half)
        end += 2 * half
    return slots, end


class _CudaStaging:
    """One device buffer per hook, registered with the daemon as one CUDA IPC
    region, with a slot per bucket (cuda_slot_layout): the bucket is copied
    into its slot's first half on the device, the daemon writes the averages
    into the second half.

    One region at a time: the daemon opens each IPC handle, which names the
    whole allocation of torch's caching allocator, and two registrations of
    one allocation would open it twice. A new or grown bucket re-lays the
    slots (buckets go one at a time, so none is in use), in the same buffer
    while they fit, else in a new buffer of twice the size or more, as a new
    region: the old one is unregistered first. Few buffers are made because
    torch keeps an exported buffer's memory after it is freed (it waits for
    an importer that would release it through torch, which a daemon never
    does)."""

    def __init__(self, client: Client, job: str, device: torch.device):
        self._client = client
        self._job = job
        self._device = device
        self._sizes: dict[int, int] = {}
        self._slots: dict[int, tuple[int, int]] = {}
        self._buffer: torch.Tensor | None = None
        self._region: ShmTensor | None = None
        self._generation = 0

    def probe(self) -> None:
        """Registers a buffer with no slots yet: GradcompError if the daemon
        cannot open this process's CUDA memory, OSError if the client cannot
        make the regions' liveness lock object in /dev/shm, ValueError if
        torch's allocator gives memory without an IPC handle (expandable
        segments), RuntimeError if torch cannot export it."""
        self._allocate(_CUDA_ALIGN)

    def slot(self, index: int, nbytes: int) -> tuple[str, int, int, torch.Tensor, torch.Tensor]:
        """(region, input base, output base, input, output) of bucket
        `index`: the bases are the halves' byte offsets in the region, the
        tensors are uint8 views of the halves on the device."""
        if self._sizes.get(index, -1) < nbytes:
            sizes = {**self._sizes, index: nbytes}
            slots, total = cuda_slot_layout(sizes)
            capacity = 0 if self._buffer is None else self._buffer.numel()
            if total > capacity:
                self._allocate(max(total, 2 * capacity))
            self._sizes, self._slots = sizes, slots
        first, second = self._slots[index]
        start = self._region.offset
        return (self._region.region, start + first, start + second,
                self._buffer[first:first + nbytes], self._buffer[second:second + nbytes])

    def renew(self) -> str:
        """Registers the buffer again, under a new name, with a daemon that
        no longer knows its region (one that restarted); the new name. The
        slots stay where they are. If that fails, the buffer and its slots
        are forgotten, as by close()."""
        try:
            self._region = self._register(self._buffer)
        except BaseException:
            self._forget()
            raise
        return self._region.region

    def _allocate(self, nbytes: int) -> None:
        sizes, slots = self._sizes, self._slots
        self.close()
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=self._device)
        self._region = self._register(buffer)
        self._buffer, self._sizes, self._slots = buffer, sizes, slots

    def _register(self, buffer: torch.Tensor) -> ShmTensor:
        self._generation += 1
        name = f"{self._job}.{self._client.client_id}.cuda.{self._generation}"
        return self._client.register_cuda_tensor(name, buffer)

    def _forget(self) -> None:
        self._buffer, self._region, self._sizes, self._slots = None, None, {}, {}

    def close(self) -> None:
        """Unregisters the region (before its memory is freed); the buffer
        and its slots are forgotten even if that fails."""
        try:
            if self._region is not None:
                _unregister(self._client, self._region.region)
        finally:
            self._forget()


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The net inside DDP and torch.compile's OptimizedModule (which holds it
    as `_orig_mod`), in any nesting: its parameters are named as in the net,
    whichever wrapper a rank hands the hook, so that names match across ranks
    and the policy's globs see "fc.weight", not "_orig_mod.fc.weight"."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


class HookState:
    """The state register_comm_hook passes to `hook`.

    Args:
      model: the module DDP wraps (or the DDP model itself, or either
        compiled with torch.compile); the net's named_parameters() give the
        tensor names the daemons meet by.
      target: the local gradcompd, "host:port" or "unix:/path".
      job: the daemon's job; codec state and rendezvous are per job.
      codecs: optional codec per parameter name; names not in it are left to
        the daemon's policy (which must be the same on every rank).
      timeout: seconds one call to the daemon may take, stragglers
        included (a bucket makes one per codec group, and one more after a
        daemon restart); with `client`, that client's timeout applies.
      shm: True: shared memory or an error; False: inline bytes; None: shared
        memory if the daemon is on this host and accepts it, else inline.
      client: an existing Client to use instead of connecting to `target`;
        close() leaves it open for its owner to close.
      batch_same_shape: like powerSGD_hook's batch_tensors_with_same_shape:
        a bucket's PowerSGD matrices of equal shape and dtype reduce their P
        and Q rounds in one collective per batch instead of one per tensor.
        It batches the matrices of equal shape whose codec here is
        "powersgd" or is left to the policy; those the policy gives another
        codec still reduce correctly (as one allgather per batch).
      batch_gather: True (the default): each bucket's tensors (those of one
        requested codec; at most MAX_BATCH) form one batch, whatever their
        shapes and codecs: the daemon sends their payloads in one message
        per peer instead of one per tensor, each small tensor sent dense
        summed from it and a large one on its own (docs/clients.md). A
        top-k daemon spends a quarter to a third less CPU per step
        (docs/benchmarks.md). False: one collective per tensor.
      gossip: train decentralised (see the module docstring): each bucket's
        parameters are mixed with the topology's neighbours' in place and
        its gradient stays local. None: gradients are averaged.
      cuda_ipc: for CUDA buckets. True: CUDA IPC or an error; False: copy
        them to host memory; None: CUDA IPC if the daemon is on this host
        and has a usable GPU, else host memory with one warning.
      grad_scaler: training with a loss scaler (GradScaler, fp16 autocast):
        a bucket with Inf/NaN on any rank comes back NaN on every rank, and
        the overflowing rank's codec state sees zeros (see the module
        docstring). Not in gossip mode.

    In gossip mode, set `consensus_distance` (e.g. after an evaluation) to
    have every later request report it to the daemon, which exports it as
    gradcomp_gossip_consensus_distance.
    """

    # A batch's members each hold a daemon thread while they wait for each
    # other; larger groups are split.
    MAX_BATCH = 64

    def __init__(self, model: torch.nn.Module, target: str, job: str = "default",
                 codecs: Mapping[str, Codec] | None = None, timeout: float = 300.0,
                 shm: bool | None = None, client: Client | None = None,
                 batch_same_shape: bool = False, gossip: Gossip | None = None,
                 cuda_ipc: bool | None = None, batch_gather: bool = True,
                 grad_scaler: bool = False):
        if grad_scaler and gossip is not None:
            raise ValueError("grad_scaler=True averages gradients; gossip mode mixes "
                             "parameters and never sees the scaled gradients")
        self.names = {id(p): name for name, p in _unwrapped(model).named_parameters()}
        unknown = sorted(set(codecs or {}) - set(self.names.values()))
        if unknown:
            raise ValueError(f"codecs name parameters the model does not have: {unknown}")
        self.codecs = dict(codecs or {})
        self.job = job
        self.batch_same_shape = batch_same_shape
        self.batch_gather = batch_gather
        self.gossip = gossip
        self.consensus_distance: float | None = None
        self._own_client = client is None
        self.client = client or Client(target, timeout=timeout)
        self.step = 0
        self.stats = StepStats()
        # The codec the daemon used for each tensor at its latest reduce.
        self.last_codecs: dict[str, str] = {}
        # "shm" or "inline", and why, once the first bucket has gone.
        self.transport = ""
        self.transport_reason = ""
        self._shm_wanted = shm
        self._staging: _ShmStaging | None = None
        # For CUDA buckets: "cuda_ipc" or "host", and why, once the first
        # CUDA bucket has gone.
        self.cuda_transport = ""
        self.cuda_transport_reason = ""
        self._cuda_wanted = cuda_ipc
        self._cuda_staging: _CudaStaging | None = None
        self._cuda_streams: dict[torch.device, torch.cuda.Stream] = {}
        self._lock = threading.Lock()
        # One thread: buckets go out in the order DDP hands them over, and the
        # daemons match them by name and step, not by arrival order.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gradcomp-hook")
        # (step, bucket index) of the last bucket that failed; read and
        # written on the executor's one thread only.
        self._failed: tuple[int, int] | None = None
        # grad_scaler: the overflow flags, one thread so that they too go
        # out in bucket order, while the buckets travel.
        self.grad_scaler = grad_scaler
        self._flags = (concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gradcomp-hook-flags")
            if grad_scaler else None)

    def close(self) -> None:
        """Waits for the buckets in flight, unregisters the staging regions
        and closes the client if this state made it: every step, even after
        one fails (a daemon gone); then raises the first error."""
        self._executor.shutdown(wait=True)
        if self._flags is not None:
            self._flags.shutdown(wait=True)
        stagings = [s for s in (self._staging, self._cuda_staging) if s is not None]
        _close_all([*(s.close for s in stagings),
                    *([self.client.close] if self._own_client else [])])

    def state_dict(self) -> dict[str, Any]:
        """The step and the daemon's codec state of this job, for a checkpoint.

        Call it between iterations (after optimizer.step()), when no bucket
        is in flight.
        """
        return {"job": self.job, "step": self.step,
                "daemon_state": self.client.export_state(self.job)}

    def release_job(self) -> ReleasedJob:
        """Ends this job on the daemon once training is over: frees its
        codec state, tensor list and gossip state there. Call it on every
        worker after the last step (and after any state_dict()); a reduce
        of the job after it starts afresh. Before close(), which closes the
        client."""
        return self.client.release_job(self.job)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores what state_dict() saved into this job's daemon.

        Into a daemon that has served this job since (a trainer restarted
        beside its running sidecar), call release_job() first on every
        worker, before wrapping the model in DDP: docs/peers.md says why."""
        if state["job"] != self.job:
            raise ValueError(f"checkpoint holds job '{state['job']}', this hook "
                             f"reduces job '{self.job}'")
        self.client.import_state(state["daemon_state"], self.job)
        self.step = int(state["step"])

    def _tensors(self, bucket: torch.distributed.GradBucket) -> list[_Tensor]:
        """The bucket's gradients: names, shapes and places in its buffer."""
        buffer = bucket.buffer()
        if buffer.layout != torch.strided:  # nn.Embedding(sparse=True), say
            names = [self.names.get(id(p), "?") for p in bucket.parameters()]
            raise TypeError(f"the bucket of {', '.join(names)} holds a "
                            f"{buffer.layout} gradient; gradcomp reduces dense "
                            f"(torch.strided) gradients only")
        base, size = buffer.data_ptr(), buffer.numel() * buffer.element_size()
        tensors = []
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            name = self.names.get(id(param))
            if name is None:
                raise ValueError(f"a bucket holds a parameter of shape "
                                 f"{list(param.shape)} that is not among the "
                                 f"model's named_parameters()")
            # An empty gradient has no storage (data_ptr() is 0): it takes
            # no room, and any place in the buffer holds it.
            offset = grad.data_ptr() - base if grad.numel() else 0
            if not 0 <= offset <= size - grad.numel() * grad.element_size():
                raise ValueError(f"gradient of '{name}' is not a view of its "
                                 f"bucket's buffer (byte offset {offset} of {size})")
            dtype = _NUMPY_DTYPES.get(grad.dtype)
            if dtype is None:
                raise TypeError(f"gradient of '{name}' is {grad.dtype}; gradcomp "
                                f"reduces {', '.join(map(str, _NUMPY_DTYPES))} only")
            tensors.append(_Tensor(name, tuple(grad.shape), dtype, offset))
        return tensors

    def _groups(self, tensors: list[_Tensor]) -> list[tuple[Codec | None, list[_Tensor]]]:
        """Tensors grouped by the codec the caller chose (None: the daemon's
        policy); one ReduceStream per group."""
        groups: dict[tuple | None, tuple[Codec | None, list[_Tensor]]] = {}
        for t in tensors:
            codec = self.codecs.get(t.name)
            groups.setdefault(codec and codec.key(), (codec, []))[1].append(t)
        return list(groups.values())

    def _batches(self, codec: Codec | None,
                 tensors: list[_Tensor]) -> dict[str, list[str]]:
        """The batches of one group's PowerSGD tensors (batch_same_shape)
        and of the rest of its tensors (batch_gather). Everything it reads
        is the same on every rank, so the batches are too."""
        batches = {}
        # The group's matrices of equal shape when it asks for PowerSGD or
        # leaves the codec to the policy (which may pick PowerSGD): not the
        # codecs the daemon used last step, which a rank whose client
        # restarted does not share; the daemon sends a round that is not
        # all PowerSGD of one shape as one allgather message instead.
        if self.batch_same_shape and self.gossip is None and (
                codec is None or codec.name == "powersgd"):
            batches.update(same_shape_batches(
                [(t.name, t.shape, t.dtype.str) for t in tensors], self.MAX_BATCH))
        if self.batch_gather and self.gossip is None:  # gossip has no batches
            # Every other tensor of the group, whatever codec it gets: the
            # daemon sends their payloads in one message (a large dense one
            # goes alone), so the batches depend on nothing but the bucket.
            same_shape = {name for members in batches.values() for name in members}
            names = [t.name for t in tensors if t.name not in same_shape]
            for members in _split(names, self.MAX_BATCH):
                batches[f"gather.{members[0]}"] = members
        return batches

    def _choose_transport(self) -> None:
        if self._shm_wanted is False:
            self.transport, self.transport_reason = "inline", "shm=False"
            return
        if not _is_local(self.client.target):
            if self._shm_wanted:
                raise ValueError(f"shm=True, but gradcompd at {self.client.target} "
                                 f"is not on this host (expected unix: or loopback)")
            self.transport, self.transport_reason = "inline", "the daemon is remote"
            return
        staging = _ShmStaging(self.client, self.job)
        try:
            staging.region(-1, 4)  # a probe: does the daemon map our regions?
            staging.close()
        except (GradcompError, OSError) as error:
            if self._shm_wanted or _transient(error):
                raise  # undecided: the next bucket asks again
            self.transport, self.transport_reason = "inline", str(error)
            return
        self._staging = staging
        self.transport, self.transport_reason = "shm", "the daemon is local"

    def _choose_cuda_transport(self, device: torch.device) -> None:
        if self._cuda_wanted is False:
            self.cuda_transport, self.cuda_transport_reason = "host", "cuda_ipc=False"
            return
        if not _is_local(self.client.target):
            if self._cuda_wanted:
                raise ValueError(f"cuda_ipc=True, but gradcompd at {self.client.target} "
                                 f"is not on this host (expected unix: or loopback)")
            reason = "the daemon is remote"
        else:
            staging = _CudaStaging(self.client, self.job, device)
            try:
                staging.probe()
            # OSError: no lock object; ValueError: no IPC handle for this
            # memory (an expandable segment); RuntimeError: torch's export.
            except (GradcompError, OSError, ValueError, RuntimeError) as error:
                if self._cuda_wanted or _transient(error):
                    raise  # undecided: the next bucket asks again
                reason = str(error)
            else:
                self._cuda_staging = staging
                self.cuda_transport = "cuda_ipc"
                self.cuda_transport_reason = "the daemon is local and opens CUDA IPC handles"
                return
        self.cuda_transport, self.cuda_transport_reason = "host", reason
        warnings.warn(f"gradcomp.torch: CUDA gradients of job '{self.job}' are copied "
                      f"through host memory, not passed by CUDA IPC: {reason}",
                      RuntimeWarning, stacklevel=2)

    @contextlib.contextmanager
    def _device_stream(self, buffer: torch.Tensor,
                       ready: torch.cuda.Event | None) -> Iterator[None]:
        """For a CUDA buffer: runs the block on this hook's stream of its
        device, after `ready` (the bucket complete on DDP's stream), and
        waits for the block's device work before leaving, so the daemon
        never reads a half-copied bucket and DDP gets finished averages."""
        if not buffer.is_cuda:
            yield
            return
        stream = self._cuda_streams.get(buffer.device)
        if stream is None:
            stream = self._cuda_streams[buffer.device] = torch.cuda.Stream(buffer.device)
        with torch.cuda.device(buffer.device), torch.cuda.stream(stream):
            if ready is not None:
                stream.wait_event(ready)
            yield
            stream.synchronize()

    def _reduce_buffer(self, index: int, buffer: torch.Tensor, tensors: list[_Tensor],
                       step: int, last: bool) -> None:
        """Averages the flat `buffer` in place: CPU buffers as numpy, CUDA
        ones through CUDA IPC or a host copy. CUDA: call it inside
        _device_stream."""
        if not buffer.is_cuda:
            self._reduce(index, buffer.numpy(), tensors, step, last)
            return
        if not self.cuda_transport:
            self._choose_cuda_transport(buffer.device)
        if self._cuda_staging is None:
            host = buffer.cpu()
            self._reduce(index, host.numpy(), tensors, step, last)
            buffer.copy_(host)
            return
        nbytes = buffer.numel() * buffer.element_size()
        region, first, second, source, target = self._cuda_staging.slot(index, nbytes)
        source.view(buffer.dtype).copy_(buffer)
        # The daemon reads through its own CUDA context: the copy must be done.
        torch.cuda.current_stream().synchronize()
        stats: dict = {}
        batched = self._reduce_registered(region, self._cuda_staging.renew,
                                          first, second, tensors, step, stats)
        buffer.copy_(target.view(buffer.dtype))
        self._record(stats, batched, last)

    def _reduce_registered(self, region: str, renew: Callable[[], str], first: int,
                           second: int, tensors: list[_Tensor],
                           step: int, stats: dict) -> int:
        """_reduce_slices, and once more under the name renew() registers the
        same memory as if the daemon no longer knows `region` (it restarted
        since): any other error, or that one again, propagates. The retry
        sends only the codec groups not yet reduced: the peers are done with
        the others' step, and a second reduce of it would wait for them.
        `stats` gets each group's {name: ReduceStats} as it completes."""
        try:
            return self._reduce_slices(region, first, second, tensors, step, stats)
        except GradcompError as error:
            if not _unknown_region(error, region):
                raise
        return self._reduce_slices(renew(), first, second, tensors, step, stats)

    def _reduce_slices(self, region: str, first: int, second: int,
                       tensors: list[_Tensor], step: int,
                       stats: dict) -> int:
        """Reduces a buffer registered as `region`, bytes from `first`, into
        its copy from `second`, group by codec group, adding each group's
        {name: ReduceStats} to `stats` as it completes and skipping the
        groups already there; the number of tensors batched."""
        batched = 0
        for codec, group in self._groups(tensors):
            batches = self._batches(codec, group)
            batched += sum(map(len, batches.values()))
            if all(t.name in stats for t in group):
                continue
            slices = {t.name: (t.slice(region, first), t.slice(region, second))
                      for t in group}
            stats.update(self.client.reduce_many_shm(
                slices, step=step, job=self.job, codec=codec and codec.name,
                params=codec and codec.params, batches=batches,
                gossip=self.gossip,
                consensus_distance=self.consensus_distance))
        return batched

    def _reduce(self, index: int, buffer: np.ndarray, tensors: list[_Tensor],
                step: int, last: bool) -> None:
        if not self.transport:
            self._choose_transport()
        stats: dict = {}
        batched = 0
        inline = True
        staged = self._staged_region(index, buffer.nbytes)
        if staged is not None:
            name, region = staged
            region.array(buffer.shape, buffer.dtype)[...] = buffer
            try:
                batched = self._reduce_registered(
                    name, functools.partial(self._staging.renew, index),
                    0, buffer.nbytes, tensors, step, stats)
                buffer[...] = region.array(buffer.shape, buffer.dtype, offset=buffer.nbytes)
                inline = False
            except GradcompError as error:
                if self._shm_wanted is not None or not _shm_off(error):
                    raise
                # A daemon restarted without shared memory: the groups it
                # reduced before (none, unless it restarted mid-bucket) keep
                # their averages, and the rest go inline, now and from now on.
                averages = region.array(buffer.shape, buffer.dtype, offset=buffer.nbytes)
                for t in tensors:
                    if t.name in stats:
                        t.view(buffer)[...] = t.view(averages)
                del averages  # a live view would keep the region from closing
                self._go_inline(error.details, "a daemon started with "
                                "--allow_client_shm again gets shared memory back "
                                "when the trainer restarts")
        if inline:
            batched = 0
            for codec, group in self._groups(tensors):
                batches = self._batches(codec, group)
                batched += sum(map(len, batches.values()))
                if all(t.name in stats for t in group):
                    continue
                results = self.client.reduce_many(
                    [(t.name, t.view(buffer)) for t in group], step=step, job=self.job,
                    codec=codec and codec.name, params=codec and codec.params,
                    batches=batches, gossip=self.gossip,
                    consensus_distance=self.consensus_distance)
                for t in group:
                    average, stats[t.name] = results[t.name]
                    t.view(buffer)[...] = average  # the view writes through to the bucket
        if last and self._staging is not None:
            self._staging.drop_after(index)
        self._record(stats, batched, last)

    def _staged_region(self, index: int, nbytes: int) -> tuple[str, ShmRegion] | None:
        """Bucket `index`'s shared-memory region, or None to send it inline:
        when the transport is inline, or when it was chosen by itself
        (shm=None) and /dev/shm has no room for the region (a container's
        64 MiB default holds a bucket or two): the hook then goes inline
        for good, with a warning, instead of failing every step."""
        if self._staging is None or nbytes == 0:
            return None  # an empty bucket (zero-element parameters) has nothing to map
        try:
            return self._staging.region(index, nbytes)
        except OSError as error:
            if self._shm_wanted or error.errno != errno.ENOSPC:
                raise
            self._go_inline(error.strerror, "give /dev/shm more room, e.g. docker "
                            "run --shm-size")
        return None

    def _go_inline(self, why: str, remedy: str) -> None:
        """Sends buckets inline from now on, with a warning saying `why` and
        what to do about it, and lets the shared-memory regions go."""
        staging, self._staging = self._staging, None
        self.transport, self.transport_reason = "inline", why
        warnings.warn(f"gradcomp.torch: job '{self.job}' sends its buckets inline "
                      f"from now on: {why} ({remedy}, or pass shm=False to choose "
                      f"inline)", RuntimeWarning, stacklevel=3)
        staging.close()

    def _record(self, stats: Mapping[str, Any], batched: int, last: bool) -> None:
        with self._lock:
            self.stats.reduces += len(stats)
            self.stats.raw_bytes += sum(s.raw_bytes for s in stats.values())
            self.stats.wire_bytes += sum(s.wire_bytes for s in stats.values())
            self.stats.steps += int(last)
            self.stats.batched += batched
            self.last_codecs.update({name: s.codec for name, s in stats.items()})

    def _mix(self, index: int, buffer: torch.Tensor, params: list[torch.Tensor],
             tensors: list[_Tensor], step: int, last: bool) -> None:
        """Gossip mode: the bucket's parameters, copied into a tensor laid
        out as its gradient buffer, go through the daemon's gossip, and the
        mixed values are written back into the parameters."""
        packed = torch.empty_like(buffer)
        views = []
        for t, param in zip(tensors, params):
            start = t.offset // packed.element_size()
            view = packed[start:start + param.numel()].view(param.shape)
            view.copy_(param)
            views.append(view)
        self._reduce_buffer(index, packed, tensors, step, last)
        for view, param in zip(views, params):
            param.copy_(view)

    def _run_bucket(self, index: int, buffer: torch.Tensor, params: list[torch.Tensor],
                   tensors: list[_Tensor], step: int, last: bool,
                   ready: torch.cuda.Event | None) -> None:
        """The hook's work for one bucket, on its background thread."""
        with torch.no_grad(), self._device_stream(buffer, ready):
            if self.gossip is not None:
                self._mix(index, buffer, params, tensors, step, last)
            elif self.grad_scaler:
                self._reduce_scaled(index, buffer, tensors, step, last)
            else:
                self._reduce_buffer(index, buffer, tensors, step, last)

    def _reduce_scaled(self, index: int, buffer: torch.Tensor, tensors: list[_Tensor],
                       step: int, last: bool) -> None:
        """_reduce_buffer for grad_scaler=True: the ranks agree, through a
        dense 1-element reduce of their overflow flags beside the bucket's,
        whether any rank's bucket holds Inf/NaN; if one does, it sends zeros
        (its codec state never sees the overflow) and every rank's bucket
        comes back NaN, for every rank's scaler to skip the step."""
        overflow = not bool(torch.isfinite(buffer).all())
        if overflow:
            buffer.zero_()
        flag = np.array([1.0 if overflow else 0.0], np.float32)
        agreed = self._flags.submit(
            self.client.reduce_many, [(f"gradcomp.overflow.bucket{index}", flag)],
            step=step, job=self.job, codec="none")
        try:
            self._reduce_buffer(index, buffer, tensors, step, last)
        except BaseException:
            concurrent.futures.wait([agreed])  # the bucket's error is the one to tell
            raise
        average, _ = agreed.result()[f"gradcomp.overflow.bucket{index}"]
        if average[0] > 0:
            buffer.fill_(float("nan"))
            with self._lock:
                self.stats.overflows += 1


def hook(state: HookState, bucket: torch.distributed.GradBucket
         ) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket averaged over every rank by
    gradcompd, or in gossip mode the bucket's parameters mixed with the
    neighbours' and its local gradient returned unchanged."""
    buffer = bucket.buffer()
    # A CUDA result must name its device: the Future then makes DDP's stream
    # wait for the hook's stream.
    future: torch.futures.Future[torch.Tensor] = (
        torch.futures.Future(devices=[buffer.device]) if buffer.is_cuda
        else torch.futures.Future())
    # The step moves on after the last bucket even if that bucket is
    # refused: the earlier buckets have sent this step's number.
    step, last, index = state.step, bucket.is_last(), bucket.index()
    if last:
        state.step += 1
    try:
        tensors = state._tensors(bucket)
    except Exception as error:  # noqa: BLE001 (DDP needs a future, whatever failed)
        future.set_exception(error)
        return future
    # Every gradient of the bucket is computed, so backward no longer reads
    # these parameters; DDP waits for this future before optimizer.step().
    params = ([p.detach() for p in bucket.parameters()]
              if state.gossip is not None else [])
    ready = None
    if buffer.is_cuda:
        # The bucket is complete once DDP's stream gets here; the hook's
        # thread copies it on a stream of its own.
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(buffer.device))

    def run() -> None:
        # DDP raises a failed bucket's error in backward without waiting for
        # the step's other buckets, and the trainer goes on to the next step,
        # whose gradients DDP copies into these same bucket buffers: a later
        # bucket of a failed step may neither read its buffer (it would send
        # the next step's gradients as this step's) nor write it (the old
        # average would overwrite them).
        if state._failed is not None and state._failed[0] == step:
            future.set_exception(RuntimeError(
                f"gradcomp hook: bucket {index} of step {step} was not reduced: "
                f"bucket {state._failed[1]} of the step failed first (DDP raises "
                f"its error), and its buffer may already hold the next step's "
                f"gradients"))
            return
        try:
            state._run_bucket(index, buffer, params, tensors, step, last, ready)
        except BaseException as error:  # noqa: B036
            state._failed = (step, index)
            # Handed to DDP, which raises it in backward. torch's Future
            # takes only an Exception: anything else (a library's SystemExit)
            # goes wrapped, where the executor would have kept it and left
            # DDP waiting for the future for ever. Without its traceback,
            # which DDP does not show: the traceback holds this frame, which
            # holds the future, which holds the error, a cycle through a C++
            # object that the garbage collector cannot see, and that kept the
            # HookState (and its shared-memory regions) alive for good.
            future.set_exception(
                error.with_traceback(None) if isinstance(error, Exception)
                else RuntimeError(f"gradcomp hook: bucket {index}: {error!r}"))
            return
        future.set_result(buffer)

    try:
        state._executor.submit(run)
    except RuntimeError:  # the executor is shut down: close() was called
        future.set_exception(RuntimeError(
            f"gradcomp hook: bucket {index}: the HookState of job '{state.job}' "
            f"is closed; make a new one to train on"))
    return future
