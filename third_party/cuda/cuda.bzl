"""CUDA rules for Bazel 4 without rules_cuda.

`cuda_library` compiles `.cu` files with nvcc (a genrule) into a static
library wrapped by a cc_library. It and the `cuda_cc_*` wrappers define their
targets only when cuda_configure found a toolkit (`@local_cuda//:defs.bzl`
HAS_CUDA); without one, or with GRADCOMP_NO_CUDA=1 in the environment, the
targets do not exist and `bazel build //...` builds the CPU-only tree.
`nccl_cc_*` do the same for NCCL (`@local_cuda//:nccl`), which a toolkit may
lack, and `cublas_cc_*` for cuBLAS (`@local_cuda//:cublas`).
"""

load("@local_cuda//:defs.bzl", "HAS_CUBLAS", "HAS_CUDA", "HAS_NCCL", "NVCC")
load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_library", "cc_test")

# sm_80 (A100) and sm_90 (H100/H200) machine code, plus compute_90 PTX that
# newer GPUs JIT-compile. -fmad=false: kernels that must give the CPU codecs'
# bytes may not fuse a multiply and an add (g++ on x86-64 without -mfma does
# not either). Every warning is an error.
NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
    "-fmad=false",
    "-Xcompiler -fPIC",
    "-Werror all-warnings",
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
    "-I.",
])

def cuda_library(name, srcs, hdrs = [], cuda_hdrs = [], deps = [], **kwargs):
    """nvcc-compiled `srcs` (.cu) as a cc_library exporting `hdrs`.

    Args:
      name: the cc_library's name.
      srcs: .cu files.
      hdrs: C++ headers of the host entry points (seen by g++ and nvcc).
      cuda_hdrs: headers only the .cu files include (.cuh).
      deps: cc_library dependencies of the host side.
      **kwargs: visibility, tags, ... for the cc_library.
    """
    if not HAS_CUDA:
        return
    archive = "lib%s_device.a" % name
    compile_cmds = [
        "%s %s -c $(location %s) -o $$tmp/%d.o" % (NVCC, NVCC_FLAGS, src, i)
        for i, src in enumerate(srcs)
    ]
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs + cuda_hdrs,
        outs = [archive],
        cmd = " && ".join(
            ["tmp=$$(mktemp -d)"] + compile_cmds +
            ["ar rcs $@ $$tmp/*.o", "rm -rf $$tmp"],
        ),
        message = "nvcc %s" % name,
        tags = kwargs.get("tags", []),
    )
    cc_library(
        name = name,
        srcs = [archive],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda"],
        linkstatic = 1,
        **kwargs
    )

def cuda_cc_library(**kwargs):
    """A cc_library that exists only when the CUDA toolkit does."""
    if HAS_CUDA:
        cc_library(**kwargs)

def cuda_cc_test(**kwargs):
    """A cc_test that exists only when the CUDA toolkit does."""
    if HAS_CUDA:
        cc_test(**kwargs)

def cuda_cc_binary(**kwargs):
    """A cc_binary that exists only when the CUDA toolkit does."""
    if HAS_CUDA:
        cc_binary(**kwargs)

def nccl_cc_library(**kwargs):
    """A cc_library that exists only when the toolkit carries NCCL."""
    if HAS_NCCL:
        cc_library(**kwargs)

def nccl_cc_test(**kwargs):
    """A cc_test that exists only when the toolkit carries NCCL."""
    if HAS_NCCL:
        cc_test(**kwargs)

def cublas_cc_library(**kwargs):
    """A cc_library that exists only when the toolkit carries cuBLAS."""
    if HAS_CUBLAS:
        cc_library(**kwargs)

def cublas_cc_test(**kwargs):
    """A cc_test that exists only when the toolkit carries cuBLAS."""
    if HAS_CUBLAS:
        cc_test(**kwargs)

def cublas_cc_binary(**kwargs):
    """A cc_binary that exists only when the toolkit carries cuBLAS."""
    if HAS_CUBLAS:
        cc_binary(**kwargs)
