#include "codecs/cpu/polar_code.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_format.h"

namespace gradcomp::codecs {
namespace {

// The exact LLR of a XOR b from the LLRs of a and b, 2 atanh(tanh(a/2)
// tanh(b/2)), written so that it neither overflows nor loses the small
// correction terms that min-sum drops (they matter at low rates, where
// the LLRs are small).
float CheckNode(float a, float b) {
  const float magnitude = std::min(std::fabs(a), std::fabs(b));
  const float sign = (a < 0) != (b < 0) ? -1.0f : 1.0f;
  return sign * magnitude + std::log1p(std::exp(-std::fabs(a + b))) -
         std::log1p(std::exp(-std::fabs(a - b)));
}

// The LLR of b's bit once the bit of a XOR b's partner is known to be u.
float BitNode(float a, float b, uint8_t u) { return u ? b - a : b + a; }

// Randomised rounding of a leaf with its posterior sharpened: 1 with
// probability 1 / (1 + exp(kSharpness * llr)), the posterior odds raised to
// the 4th power. Plain posterior sampling (sharpness 1) costs 0.002-0.012 of
// distortion against hard decisions; sharpness 4 keeps the draws random
// (which Encode's best-of-draws needs) at hard-decision distortion.
constexpr float kSharpness = 4.0f;

uint8_t Draw(float llr, float uniform) {
  return uniform * (1.0f + std::exp(kSharpness * llr)) < 1.0f ? 1 : 0;
}

}  // namespace

double BinaryEntropy(double p) {
  if (p <= 0 || p >= 1) return 0;
  return -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
}

double InverseBinaryEntropy(double h) {
  double lo = 0, hi = 0.5;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (BinaryEntropy(mid) < h ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

void PolarTransform(absl::Span<uint8_t> bits) {
  const size_t n = bits.size();
  for (size_t half = 1; half < n; half *= 2) {
    for (size_t block = 0; block < n; block += 2 * half) {
      uint8_t* x = bits.data() + block;
      for (size_t i = 0; i < half; ++i) x[i] ^= x[i + half];
    }
  }
}

absl::StatusOr<PolarCode> PolarCode::Create(int log2_n, double rate) {
  if (log2_n < 0 || log2_n > kMaxLog2N) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "polar code: expected log2 N in [0, %d], got %d", kMaxLog2N, log2_n));
  }
  if (!(rate >= 0 && rate <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("polar code: expected a rate in [0, 1], got %g", rate));
  }
  const int n = 1 << log2_n;
  const int k = static_cast<int>(std::lround(rate * n));
  const double d = InverseBinaryEntropy(1 - rate);
  std::vector<uint8_t> is_info(n, 0);
  if (k == n) {
    std::fill(is_info.begin(), is_info.end(), 1);
  } else if (k > 0) {
    // ln Z of every synthetic channel: Z- = 2Z - Z^2 at a 0 bit, Z+ = Z^2
    // at a 1 bit, most significant bit first. Logs, because Z+ underflows
    // doubles within a few levels at low distortion.
    std::vector<double> log_z = {std::log(2.0) +
                                 0.5 * (std::log(d) + std::log1p(-d))};
    for (int level = 0; level < log2_n; ++level) {
      std::vector<double> next(2 * log_z.size());
      for (size_t j = 0; j < log_z.size(); ++j) {
        const double lz = log_z[j];
        next[2 * j] = lz + std::log(2.0 - std::exp(lz));
        next[2 * j + 1] = 2 * lz;
      }
      log_z = std::move(next);
    }
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return log_z[a] < log_z[b]; });
    for (int j = 0; j < k; ++j) is_info[order[j]] = 1;
  }
  return PolarCode(std::move(is_info), k, d);
}

PolarCode::PolarCode(std::vector<uint8_t> is_info, int k,
                     double design_distortion)
    : is_info_(std::move(is_info)),
      info_before_(is_info_.size() + 1, 0),
      k_(k),
      design_distortion_(design_distortion) {
  for (size_t i = 0; i < is_info_.size(); ++i) {
    info_before_[i + 1] = info_before_[i] + is_info_[i];
  }
}

struct PolarCode::Scratch {
  // LLRs of a sub-block of size h at offset h (h = 1, 2, ..., N/2): one
  // buffer per tree depth is enough, since SC visits one node per depth.
  std::vector<float> llr;
  std::vector<uint8_t> x;  // codeword bits, sub-block by sub-block
  std::vector<uint8_t> u;
};

void PolarCode::EncodeNode(const float* llr, int first, int size,
                           absl::Span<const float> uniforms,
                           Scratch& scratch) const {
  uint8_t* x = scratch.x.data() + first;
  uint8_t* u = scratch.u.data() + first;
  const int info = InfoCount(first, size);
  if (info == 0) {
    std::fill(x, x + size, 0);
    std::fill(u, u + size, 0);
    return;
  }
  if (info == size) {
    // With every bit free, drawing u bit by bit from SC's exact conditionals
    // draws x from its posterior, which is the product of the leaves'.
    for (int i = 0; i < size; ++i) x[i] = Draw(llr[i], uniforms[first + i]);
    std::memcpy(u, x, static_cast<size_t>(size));
    PolarTransform(absl::MakeSpan(u, size));
    return;
  }
  const int half = size / 2;
  float* child = scratch.llr.data() + half;
  for (int i = 0; i < half; ++i) child[i] = CheckNode(llr[i], llr[i + half]);
  EncodeNode(child, first, half, uniforms, scratch);
  for (int i = 0; i < half; ++i) {
    child[i] = BitNode(llr[i], llr[i + half], x[i]);
  }
  EncodeNode(child, first + half, half, uniforms, scratch);
  for (int i = 0; i < half; ++i) x[i] ^= x[i + half];
}

int PolarCode::Encode(absl::Span<const uint8_t> source,
                      absl::Span<const float> uniforms,
                      absl::Span<uint8_t> info,
                      absl::Span<uint8_t> approx) const {
  const int size = n();
  Scratch scratch;
  scratch.llr.resize(size);
  scratch.x.resize(size);
  scratch.u.resize(size);
  std::vector<float> root(size);
  const double d = design_distortion_;
  const float magnitude =
      d > 0 ? static_cast<float>(std::log((1 - d) / d)) : 0.0f;
  for (int i = 0; i < size; ++i) root[i] = source[i] ? -magnitude : magnitude;
  const size_t draws = uniforms.size() / size;
  int best = size + 1;
  for (size_t draw = 0; draw < draws; ++draw) {
    EncodeNode(root.data(), 0, size, uniforms.subspan(draw * size, size),
               scratch);
    int errors = 0;
    for (int i = 0; i < size; ++i) errors += scratch.x[i] != source[i];
    if (errors >= best) continue;
    best = errors;
    int j = 0;
    for (int i = 0; i < size; ++i) {
      if (is_info_[i]) info[j++] = scratch.u[i];
    }
    std::copy(scratch.x.begin(), scratch.x.end(), approx.begin());
  }
  return best;
}

void PolarCode::Decode(absl::Span<const uint8_t> info,
                       absl::Span<uint8_t> out) const {
  int j = 0;
  for (int i = 0; i < n(); ++i) out[i] = is_info_[i] ? info[j++] : 0;
  PolarTransform(out);
}

}  // namespace gradcomp::codecs
