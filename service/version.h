// The daemon's release version, reported by GetInfo, the startup log line
// and the gradcomp_build_info metric.
#ifndef GRADCOMP_SERVICE_VERSION_H_
#define GRADCOMP_SERVICE_VERSION_H_

namespace gradcomp::service {

inline constexpr char kVersion[] = "0.1.0";

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_VERSION_H_
