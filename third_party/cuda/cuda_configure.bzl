"""Repository rule that finds a CUDA toolkit, or records that there is none.

The generated repository always exists, so BUILD files can load
`@local_cuda//:defs.bzl` and branch on `HAS_CUDA`. With a toolkit, it also
exposes the headers and runtime libraries as `@local_cuda//:cuda`.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    has_cuda = ctx.path(root + "/bin/nvcc").exists and ctx.os.environ.get("GRADCOMP_NO_CUDA", "") == ""
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
""".format(root = root))
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda")
""")
    ctx.file("defs.bzl", """
HAS_CUDA = {has}
NVCC = "{nvcc}"
""".format(has = has_cuda, nvcc = root + "/bin/nvcc" if has_cuda else ""))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "GRADCOMP_NO_CUDA"],
    local = True,
)
