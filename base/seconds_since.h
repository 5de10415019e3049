// Seconds elapsed on the monotonic clock, for the stage timings that the
// engine and the collectives report (ReduceStats, collective durations).
//
//   const std::chrono::steady_clock::time_point start = Clock::now();
//   ...
//   stats.encode_seconds += SecondsSince(start);
#ifndef GRADCOMP_BASE_SECONDS_SINCE_H_
#define GRADCOMP_BASE_SECONDS_SINCE_H_

#include <chrono>

namespace gradcomp {

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace gradcomp

#endif  // GRADCOMP_BASE_SECONDS_SINCE_H_
