#include <cstdio>
#include <cstdlib>
#include <vector>
#include "codecs/cpu/polar_code.h"
#include "codecs/random.h"
using namespace gradcomp::codecs;
int main() {
  for (int log2n : {8, 11}) {
    int n = 1 << log2n;
    for (double r : {0.1, 0.3, 0.5, 0.7, 0.9}) {
      auto code = *PolarCode::Create(log2n, r);
      PhiloxStream src(1, 2, log2n, 0), rnd(1, 3, log2n, 0);
      std::vector<uint8_t> y(n), info(code.k()), x(n), x2(n);
      std::vector<float> u(n), ys(n);
      long errs = 0, bits = 0; int bad = 0;
      int blocks = (1 << 20) / n;
      for (int b = 0; b < blocks; ++b) {
        src.FillUniform(uint64_t(b) * n, absl::MakeSpan(ys));
        for (int i = 0; i < n; ++i) y[i] = ys[i] < 0.5f;
        static int M = std::atoi(std::getenv("M"));
        long best = 1 << 30;
        for (int m = 0; m < M; ++m) {
        rnd.FillUniform((uint64_t(b) * M + m) * n, absl::MakeSpan(u));
        std::vector<uint8_t> i2(code.k()), xx(n);
        code.Encode(y, u, absl::MakeSpan(i2), absl::MakeSpan(xx));
        long e = 0; for (int i = 0; i < n; ++i) e += xx[i] != y[i];
        if (e < best) { best = e; info = i2; x = xx; }
        }
        code.Decode(info, absl::MakeSpan(x2));
        bad += x != x2;
        for (int i = 0; i < n; ++i) errs += x[i] != y[i];
        bits += n;
      }
      std::printf("N=%d R=%.1f D=%.4f bound=%.4f mismatch=%d\n", n, r, double(errs) / bits, InverseBinaryEntropy(1 - r), bad);
    }
  }
}
