"""Repository rule that finds a CUDA toolkit, or records that there is none.

The generated repository always exists, so BUILD files can load
`@local_cuda//:defs.bzl` and branch on `HAS_CUDA`. With a toolkit, it also
exposes the headers and runtime libraries as `@local_cuda//:cuda`, and, when
the toolkit carries NCCL (`include/nccl.h` and `lib64/libnccl.so`), NCCL as
`@local_cuda//:nccl` with `HAS_NCCL` true, and, when it carries cuBLAS
(`include/cublas_v2.h` and `lib64/libcublas.so`), cuBLAS as
`@local_cuda//:cublas` with `HAS_CUBLAS` true.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    has_cuda = ctx.path(root + "/bin/nvcc").exists and ctx.os.environ.get("GRADCOMP_NO_CUDA", "") == ""
    has_nccl = has_cuda and ctx.path(root + "/include/nccl.h").exists and ctx.path(root + "/lib64/libnccl.so").exists
    has_cublas = has_cuda and ctx.path(root + "/include/cublas_v2.h").exists and ctx.path(root + "/lib64/libcublas.so").exists
    if has_cuda:
        ctx.symlink(root + "/include", "include")
        ctx.symlink(root + "/lib64", "lib64")
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda",
    hdrs = glob(["include/**"]),
    includes = ["include"],
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcudart"],
)
""".format(root = root) + ("""
cc_library(
    name = "nccl",
    deps = [":cuda"],
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lnccl"],
)
""".format(root = root) if has_nccl else "") + ("""
cc_library(
    name = "cublas",
    deps = [":cuda"],
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcublas"],
)
""".format(root = root) if has_cublas else ""))
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda")
""")
    ctx.file("defs.bzl", """
HAS_CUDA = {has}
HAS_NCCL = {has_nccl}
HAS_CUBLAS = {has_cublas}
NVCC = "{nvcc}"
""".format(has = has_cuda, has_nccl = has_nccl, has_cublas = has_cublas, nvcc = root + "/bin/nvcc" if has_cuda else ""))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "GRADCOMP_NO_CUDA"],
    local = True,
)
