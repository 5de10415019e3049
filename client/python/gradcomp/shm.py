"""POSIX shared-memory regions for gradcompd: tensors the daemon reads and
writes in place, with no tensor bytes over gRPC.

    import gradcomp
    from gradcomp.shm import ShmRegion

    with ShmRegion(2 * grad.nbytes, tag="job1") as region, \\
            gradcomp.Client(target) as client:
        client.register_shm("job1.rank0", region)   # daemon: --allow_client_shm
        inp = region.array(grad.shape)               # numpy views on the region
        out = region.array(grad.shape, offset=grad.nbytes)
        inp[...] = grad
        stats = client.reduce_shm("fc.weight", step,
                                  region.tensor("job1.rank0", inp),
                                  region.tensor("job1.rank0", out))
        # `out` now holds the average over the job's workers.

A region holds a shared flock(2) on its object for as long as it lives; the
daemon reclaims the registration once no process holds it (the client exited
or was killed). The daemon and the client must share /dev/shm (in Kubernetes:
one memory emptyDir mounted at /dev/shm in both containers).
"""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import math
import mmap
import os
import re
import secrets
from typing import Sequence

import numpy as np

_SHM_DIR = "/dev/shm"
_TAG = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclasses.dataclass(frozen=True)
class ShmTensor:
    """A tensor inside a registered region: the slice {region, offset,
    byte_size} a ReduceRequest names, plus its shape and dtype."""
    region: str
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def byte_size(self) -> int:
        # math.prod, not np.prod: a client asks this of every tensor on
        # every step, and np.prod of a tuple costs microseconds each.
        return math.prod(self.shape) * self.dtype.itemsize


def _reserve_pages(fd: int, byte_size: int, key: str) -> None:
    """Takes the object's pages now. ftruncate alone reserves nothing on
    tmpfs: pages are taken on first write, and a write that finds /dev/shm
    full kills the process with SIGBUS. A full /dev/shm is an OSError
    (ENOSPC) here instead, saying how much room it has."""
    try:
        os.posix_fallocate(fd, 0, byte_size)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise OSError(error.errno, f"posix_fallocate of {byte_size} bytes "
                          f"of shared memory {key}: {error.strerror}") from None
        room = ""
        try:
            fs = os.statvfs(_SHM_DIR)
            room = (f" ({_SHM_DIR} has {fs.f_bavail * fs.f_frsize} bytes free "
                    f"of {fs.f_blocks * fs.f_frsize})")
        except OSError:
            pass
        raise OSError(errno.ENOSPC, f"shared memory {key}: no room for "
                      f"{byte_size} bytes in {_SHM_DIR}{room}; give it more "
                      f"(e.g. docker run --shm-size) or use a smaller "
                      f"region") from None


# gradcompd's default --shm_prefix: the daemon maps only objects whose
# name starts with its prefix.
DEFAULT_SHM_PREFIX = "/gradcomp."
# A key is "/" and at most NAME_MAX (255) bytes, of which the tag (at most
# 128), a pid (at most 10 digits), 16 random hex digits and two dots take 156.
_MAX_PREFIX_BYTES = 1 + 255 - 156


def check_shm_prefix(prefix: str) -> None:
    """Raises ValueError unless `prefix` can start a ShmRegion's key, as
    gradcompd checks its --shm_prefix."""
    size = len(prefix.encode())
    if size < 2 or size > _MAX_PREFIX_BYTES or prefix[0] != "/" or "/" in prefix[1:]:
        raise ValueError(f"shared-memory prefix {prefix!r}: expected '/' and the "
                         f"start of a name without another '/', at most "
                         f"{_MAX_PREFIX_BYTES} bytes (gradcompd --shm_prefix; "
                         f"default {DEFAULT_SHM_PREFIX!r})")


class ShmRegion:
    """A new POSIX shared-memory object, mapped read-write.

    Its key is "<prefix><tag>.<pid>.<random>", so jobs and pods sharing
    /dev/shm never collide; `prefix` is the daemon's --shm_prefix
    ("/gradcomp." by default), as it maps only objects so named. Its pages
    are reserved at once: a /dev/shm without room for them (Docker's
    default is 64 MiB) raises OSError (ENOSPC) here, not SIGBUS on the
    first write. release() (or leaving
    the `with` block) unmaps it and unlinks the object; drop the numpy
    views from array() first.
    Only the creating process unlinks it: a forked child that releases or
    drops its copy unmaps and closes only its own, and the flock stays
    while the parent holds its descriptor.
    `mode` (0o600: this uid only) is set as given, whatever the umask: a
    daemon of another uid (gradcompd --shm_owner_uids) opens the object
    read-write, so give it a group or other read-write bit (0o660 with a
    group both share, or 0o666 in a pod's own /dev/shm).
    """

    def __init__(self, byte_size: int, tag: str = "region", mode: int = 0o600,
                 prefix: str = DEFAULT_SHM_PREFIX):
        if byte_size <= 0:
            raise ValueError(f"shared-memory region of {byte_size} bytes, "
                             f"expected a positive size")
        if not _TAG.fullmatch(tag):
            raise ValueError(f"shared-memory tag {tag!r}: expected 1 to 128 "
                             f"letters, digits, '-', '_' or '.'")
        if mode & ~0o777 or mode & 0o600 != 0o600:
            raise ValueError(f"shared-memory mode {mode:#o}: expected permission "
                             f"bits (at most 0o777) that let the owner read and "
                             f"write (0o600 at least)")
        check_shm_prefix(prefix)
        self._creator = os.getpid()
        self.key = f"{prefix}{tag}.{self._creator}.{secrets.token_hex(8)}"
        self.byte_size = byte_size
        # shm_open(3) on Linux is open(2) under /dev/shm.
        self._fd = os.open(_SHM_DIR + self.key,
                           os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(self._fd, mode)
            os.ftruncate(self._fd, byte_size)
            _reserve_pages(self._fd, byte_size, self.key)
            fcntl.flock(self._fd, fcntl.LOCK_SH)
            self._map: mmap.mmap | None = mmap.mmap(self._fd, byte_size)
        except BaseException:
            os.close(self._fd)
            os.unlink(_SHM_DIR + self.key)
            raise
        self._base = np.frombuffer(self._map, dtype=np.uint8)
        # Client.register_shm's (offset, byte_size) per name: the daemon
        # reads a slice's offset from the start of its registered range.
        self.registered: dict[str, tuple[int, int]] = {}

    def __enter__(self) -> "ShmRegion":
        return self

    def __exit__(self, exc_type: object, error: object, tb: object) -> None:
        if error is None:
            self.release()
            return
        # An error is on its way out, and the block's views live on in its
        # traceback: release() would raise BufferError in the error's place
        # (before, it did, and hid the error).
        self._forget()

    def __del__(self) -> None:
        if getattr(self, "_map", None) is None:
            return  # released, or __init__ failed
        self._forget()

    def _forget(self) -> None:
        """release(), or, where views from array() outlive the region (or
        the interpreter is exiting), the name now: the views keep the
        mapping, and with it the flock, until they go."""
        try:
            self.release()
        except BufferError:
            self._map = None
            self._unlink_and_close()

    def _mapping(self) -> mmap.mmap:
        if self._map is None:
            raise ValueError(f"shared-memory region {self.key} was released")
        return self._map

    def array(self, shape: Sequence[int] | int, dtype: object = np.float32,
              offset: int = 0) -> np.ndarray:
        """A writable C-ordered numpy view of `shape` and `dtype` at byte
        `offset` of the region (no copy)."""
        self._mapping()
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"shape {list(shape)} has a negative dimension")
        count = int(np.prod(shape, dtype=np.int64))
        if offset < 0 or offset + count * dtype.itemsize > self.byte_size:
            raise ValueError(f"{count} x {dtype} at offset {offset} does not fit "
                             f"in the {self.byte_size}-byte region {self.key}")
        return self._base[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)

    def tensor(self, region: str, view: np.ndarray) -> ShmTensor:
        """The slice of registered region `region` that `view` (from array())
        covers, for Client.reduce_shm: its offset counts from the start of
        what register_shm registered as `region` (the whole region if it
        did not register that name)."""
        self._mapping()
        base = self._base.__array_interface__["data"][0]
        start = view.__array_interface__["data"][0] - base
        if (not view.flags.c_contiguous or start < 0
                or start + view.nbytes > self.byte_size):
            raise ValueError(f"the array is not a C-contiguous view inside "
                             f"region {self.key}; make it with array()")
        first, size = self.registered.get(region, (0, self.byte_size))
        if start < first or start + view.nbytes > first + size:
            raise ValueError(f"the array covers bytes [{start}, "
                             f"{start + view.nbytes}) of {self.key}, outside "
                             f"[{first}, {first + size}) registered as "
                             f"'{region}'")
        return ShmTensor(region=region, offset=start - first,
                         shape=tuple(view.shape), dtype=view.dtype)

    def release(self) -> None:
        """Unmaps and unlinks the region; BufferError, releasing nothing, if
        numpy views of it are still alive. Releasing twice is a no-op."""
        if self._map is None:
            return
        del self._base
        try:
            self._map.close()
        except BufferError:
            self._base = np.frombuffer(self._map, dtype=np.uint8)
            raise BufferError(f"shared-memory region {self.key} still has numpy "
                              f"views; delete them before release()") from None
        self._map = None
        self._unlink_and_close()

    def _unlink_and_close(self) -> None:
        try:
            if os.getpid() == self._creator:
                os.unlink(_SHM_DIR + self.key)
        finally:
            os.close(self._fd)  # drops the flock: the daemon may reclaim it
