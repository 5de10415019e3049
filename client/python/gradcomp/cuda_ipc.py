"""CUDA IPC handles of torch CUDA tensors, for RegisterCudaSharedMemory.

A CUDA tensor's storage is part of an allocation of torch's caching
allocator; the IPC handle names that whole allocation, so the region a
daemon registers runs from the allocation's start to the storage's end and
the tensor is a slice at an offset inside it:

    handle = cuda_ipc_handle(grad)                 # grad.is_cuda
    client.register_cuda_shm("job.rank0.grads", handle.raw, handle.device,
                             handle.region_bytes)
    # or, in one step, a ShmTensor for Client.reduce_shm:
    slice_ = client.register_cuda_tensor("job.rank0.grads", grad)

The exporting process must keep the tensor alive while it is registered.
"""
from __future__ import annotations

import dataclasses

import numpy as np

# sizeof(cudaIpcMemHandle_t).
HANDLE_BYTES = 64
# Newer torch (c10's CUDACachingAllocator::shareIpcHandle) prefixes the
# handle with a version byte and a type byte: 'c' for a cudaMalloc block,
# followed by its cudaIpcMemHandle_t, or 'e' for an expandable segment.
_CUDA_MALLOC_BLOCK = ord("c")
_EXPANDABLE_SEGMENT = ord("e")


@dataclasses.dataclass(frozen=True)
class CudaIpcHandle:
    device: int  # CUDA device ordinal of the allocation
    raw: bytes  # the cudaIpcMemHandle_t, HANDLE_BYTES bytes
    region_bytes: int  # allocation start to the tensor storage's end
    offset: int  # byte offset of the tensor's first element in the region


def cuda_ipc_handle(tensor) -> CudaIpcHandle:
    """The IPC handle of a contiguous torch CUDA tensor's allocation.

    Raises ValueError for a CPU or non-contiguous tensor."""
    if not tensor.is_cuda:
        raise ValueError(f"expected a CUDA tensor, got one on {tensor.device}; "
                         "CPU tensors go through gradcomp.shm regions")
    if not tensor.is_contiguous():
        raise ValueError("expected a contiguous CUDA tensor (call .contiguous())")
    # torch >= 2.0: Tensor.untyped_storage(); 1.13: storage().untyped().
    storage = (tensor.untyped_storage() if hasattr(tensor, "untyped_storage")
               else tensor.storage().untyped())
    device, raw, storage_bytes, storage_offset = storage._share_cuda_()[:4]
    first = storage_offset + tensor.storage_offset() * tensor.element_size()
    return CudaIpcHandle(device=int(device), raw=memory_handle(bytes(raw)),
                         region_bytes=int(storage_offset + storage_bytes),
                         offset=int(first))


def memory_handle(shared: bytes) -> bytes:
    """The cudaIpcMemHandle_t in a handle from torch's _share_cuda_(): all
    of it (older torch) or after the version and type bytes (newer torch).

    Raises ValueError for an expandable segment's handle, or any other."""
    if len(shared) == HANDLE_BYTES:
        return shared
    if len(shared) == HANDLE_BYTES + 2 and shared[1] == _CUDA_MALLOC_BLOCK:
        return shared[2:]
    if len(shared) >= 2 and shared[1] == _EXPANDABLE_SEGMENT:
        raise ValueError("the tensor lies in an expandable segment "
                         "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), "
                         "which has no cudaIpcMemHandle_t; expected memory "
                         "from cudaMalloc (unset expandable_segments)")
    raise ValueError(f"torch gave a {len(shared)}-byte CUDA IPC handle, expected "
                     f"{HANDLE_BYTES} bytes, or {HANDLE_BYTES + 2} with a "
                     f"version byte and type 'c' (cudaMalloc)")


def numpy_dtype(tensor) -> np.dtype:
    """The numpy dtype of a torch tensor's elements (for ShmTensor)."""
    return np.dtype(str(tensor.dtype).replace("torch.", ""))
