"""One libFuzzer target per codec decoder (see docs/fuzzing.md)."""

load("@rules_cc//cc:defs.bzl", "cc_binary")

def codec_fuzzers(name, codecs):
    """Declares <codec>_decode_fuzzer for each codec and a filegroup of all.

    The targets only link with `--config=fuzz` (clang's -fsanitize=fuzzer),
    so they are tagged manual: `bazel build //...` under gcc skips them.

    Args:
      name: the filegroup naming every fuzz target, for one build command.
      codecs: registry names of the codecs (codecs/builtin.h).
    """
    fuzzers = []
    for codec in codecs:
        fuzzer = codec + "_decode_fuzzer"
        cc_binary(
            name = fuzzer,
            testonly = True,
            srcs = ["decode_fuzzer.cc"],
            local_defines = ["GRADCOMP_FUZZ_CODEC=" + codec],
            tags = [
                "fuzz",
                "manual",
            ],
            deps = [
                ":decode_checker",
                "//third_party:absl",
            ],
        )
        fuzzers.append(":" + fuzzer)
    native.filegroup(
        name = name,
        testonly = True,
        srcs = fuzzers,
        tags = ["manual"],
    )
