// The conformance suite's rows: one per codec configuration. A codec family
// adds its rows here (or instantiates the suite in its own test).
#include "codecs/testing/conformance.h"

#include "gtest/gtest.h"

namespace gradcomp::codecs::testing {
namespace {

// Bounds: fp16 keeps 11 significant bits (relative error <= 2^-11 per
// value), bf16 keeps 8 (<= 2^-8); `none` is exact.
INSTANTIATE_TEST_SUITE_P(
    Dense, CodecConformanceTest,
    ::testing::Values(
        ConformanceCase{"none", {}, 0.0},
        ConformanceCase{"none", {{"prescale", "true"}}, 1e-6, "prescale"},
        ConformanceCase{"fp16", {}, 4.9e-4},
        ConformanceCase{"fp16", {{"prescale", "true"}}, 4.9e-4, "prescale"},
        ConformanceCase{"bf16", {}, 3.9e-3},
        ConformanceCase{"bf16", {{"prescale", "true"}}, 3.9e-3, "prescale"}),
    ConformanceCaseName);

// Top-k sends coordinates of g exactly, so the error is the energy left
// out: at most sqrt(1 - c/n) for c sent values, and c >= 0.8k when sampled
// (k = 41 of 4097 at ratio 0.01: sqrt(1 - 32.8/4097) < 0.997). Ratio 1
// sends every value.
INSTANTIATE_TEST_SUITE_P(
    TopK, CodecConformanceTest,
    ::testing::Values(ConformanceCase{"topk", {{"ratio", "0.01"}}, 0.997},
                      ConformanceCase{"topk",
                                      {{"ratio", "0.01"}, {"sample", "1"}},
                                      0.995,
                                      "exact"},
                      ConformanceCase{"topk", {{"ratio", "1"}}, 0.0, "dense"}),
    ConformanceCaseName);

// QSGD: E||Q(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2, so the relative
// error is about sqrt of that bound: d = 512, s = 7 (4 bits): sqrt(3.23);
// s = 127 (8 bits): sqrt(0.178). One draw over 4097 values sits near its
// expectation (1.26 and 0.07 on Gaussian data), well inside.
INSTANTIATE_TEST_SUITE_P(
    Qsgd, CodecConformanceTest,
    ::testing::Values(ConformanceCase{"qsgd", {}, 1.8},
                      ConformanceCase{"qsgd", {{"bits", "8"}}, 0.43, "8bit"},
                      ConformanceCase{"qsgd",
                                      {{"bits", "2"}, {"bucket", "64"}},
                                      2.9,
                                      "2bit"}),
    ConformanceCaseName);

}  // namespace
}  // namespace gradcomp::codecs::testing
