"""deploy/docker/Dockerfile's package lists against tools/setup and the binary.

There is no docker here, so the image cannot be built; what can drift is
checked instead: every package the image installs to build is in tools/setup,
every tools/setup package is either in the image or named below as not needed
in it (a package added to tools/setup fails this test until someone decides),
and the runtime stage installs exactly the packages that own gradcompd's
shared libraries (ldd of bazel-bin/service/gradcompd, dpkg -S).
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import unittest

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
SETUP = REPO / "tools" / "setup"

# tools/setup packages the image does not install, and why.
NOT_IN_IMAGE = {
    "git": "development",
    "curl": "development",
    "ca-certificates": "development",
    "clang-format": "lint",
    "clang": "fuzzing",
    "libclang-rt-14-dev": "fuzzing",
    "llvm-14": "fuzzing",
    "libgtest-dev": "tests",
    "libgmock-dev": "tests",
    "libbenchmark-dev": "benchmarks",
    "iproute2": "network-namespace tests",
    "python3-torch": "the trainer's image brings PyTorch; the client does not need it",
    "python3-matplotlib": "benchmark plots",
    "python3-scipy": "the convergence table's statistics",
    "dataset-fashion-mnist": "the convergence example",
    "prometheus": "observability tests",
    "openssl": "TLS tests make their certificates with it; the daemon reads PEM files",
}


def setup_packages() -> list[str]:
    block = re.search(r"^packages=\((.*?)^\)", SETUP.read_text(), re.S | re.M)
    assert block, "tools/setup has no packages=( ... ) list"
    return block.group(1).split()


def dockerfile_list(arg: str) -> list[str]:
    match = re.search(rf'^ARG {arg}="([^"]*)"', DOCKERFILE.read_text(), re.M)
    assert match, f"Dockerfile has no ARG {arg}"
    return match.group(1).split()


def gradcompd() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GRADCOMPD") or REPO / "bazel-bin" / "service" / "gradcompd")


# The CPU image builds with GRADCOMP_NO_CUDA=1; a binary built here where the
# CUDA toolkit is installed may load its libraries, which are not Debian's
# and belong to the CUDA variant (docs/operations.md, "Images").
CUDA_ROOT = os.path.realpath(os.environ.get("CUDA_PATH", "/usr/local/cuda")) + "/"


def library_packages(binary: pathlib.Path) -> set[str]:
    """The Debian packages that own the shared libraries `binary` loads."""
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    libraries = re.findall(r"=> (/\S+)", ldd)
    # A library is owned under its own path or under the path its link points at.
    candidates = sorted(set(libraries) | {os.path.realpath(p) for p in libraries})
    owners = subprocess.run(["dpkg", "-S", *candidates], capture_output=True, text=True).stdout
    owner_of = {}
    for line in owners.splitlines():
        package, _, path = line.partition(": ")
        owner_of[path] = package.split(":")[0]
    packages = set()
    for path in libraries:
        if os.path.realpath(path).startswith(CUDA_ROOT):
            continue
        owner = owner_of.get(path) or owner_of.get(os.path.realpath(path))
        if owner is None:
            raise AssertionError(f"{path} (loaded by {binary}) belongs to no Debian package")
        packages.add(owner)
    return packages


class DockerfileTest(unittest.TestCase):

    def test_build_and_client_packages_come_from_tools_setup(self):
        setup = setup_packages()
        build = dockerfile_list("BUILD_PACKAGES")
        client = dockerfile_list("CLIENT_PACKAGES")
        self.assertEqual(len(setup), len(set(setup)), "tools/setup lists a package twice")
        self.assertEqual(sorted(set(build + client) - set(setup)), [],
                         "the Dockerfile installs packages tools/setup does not")
        undecided = set(setup) - set(build) - set(client) - set(NOT_IN_IMAGE)
        self.assertEqual(sorted(undecided), [],
                         "tools/setup packages neither in the image nor in NOT_IN_IMAGE")
        self.assertEqual(sorted(set(NOT_IN_IMAGE) & set(build + client)), [])
        self.assertEqual(sorted(set(NOT_IN_IMAGE) - set(setup)), [],
                         "NOT_IN_IMAGE names packages tools/setup no longer lists")

    @unittest.skipUnless(shutil.which("ldd") and shutil.which("dpkg"), "needs ldd and dpkg")
    def test_runtime_packages_are_the_binarys_libraries(self):
        binary = gradcompd()
        if not os.access(binary, os.X_OK):
            self.skipTest(f"no {binary}: bazel build //service:gradcompd")
        self.assertEqual(sorted(dockerfile_list("RUNTIME_PACKAGES")),
                         sorted(library_packages(binary)))

    def test_image_runs_gradcompd_as_the_charts_non_root_user(self):
        text = DOCKERFILE.read_text()
        self.assertRegex(text, r"(?m)^FROM debian:bookworm AS build$")
        self.assertRegex(text, r"(?m)^FROM debian:bookworm-slim$")
        self.assertRegex(text, r'(?m)^ENTRYPOINT \["/usr/local/bin/gradcompd"\]$')
        user = re.findall(r"(?m)^USER (\d+):(\d+)$", text)
        self.assertEqual(user, [("65532", "65532")])
        values = (REPO / "helm" / "gradcomp" / "values.yaml").read_text()
        self.assertIn("runAsUser: 65532", values)

    def test_image_sets_the_malloc_tunables_the_soak_runs_with(self):
        # tests/reliability/soak.py asserts flat memory with these.
        soak = (REPO / "tests" / "reliability" / "soak.py").read_text()
        deployed = re.findall(r'(?m)^DEPLOYED_TUNABLES = "([^"]+)"$', soak)
        self.assertEqual(len(deployed), 1, "soak.py sets DEPLOYED_TUNABLES once")
        self.assertEqual(re.findall(r"(?m)^ENV GLIBC_TUNABLES=(\S+)$",
                                    DOCKERFILE.read_text()), deployed)


if __name__ == "__main__":
    unittest.main()
