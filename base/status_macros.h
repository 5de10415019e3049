// Early-return helpers for absl::Status, which Abseil 20220623 lacks.
//
//   GC_RETURN_IF_ERROR(DoThing());
//   GC_ASSIGN_OR_RETURN(std::string s, ReadThing());
#ifndef GRADCOMP_BASE_STATUS_MACROS_H_
#define GRADCOMP_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define GC_RETURN_IF_ERROR(expr)              \
  do {                                        \
    const ::absl::Status gc_status_ = (expr); \
    if (!gc_status_.ok()) return gc_status_;  \
  } while (0)

#define GC_STATUS_CONCAT_INNER_(a, b) a##b
#define GC_STATUS_CONCAT_(a, b) GC_STATUS_CONCAT_INNER_(a, b)

#define GC_ASSIGN_OR_RETURN(lhs, expr)                                      \
  GC_ASSIGN_OR_RETURN_IMPL_(GC_STATUS_CONCAT_(gc_statusor_, __LINE__), lhs, \
                            expr)

#define GC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                              \
  if (!statusor.ok()) return statusor.status();        \
  lhs = std::move(statusor).value()

#endif  // GRADCOMP_BASE_STATUS_MACROS_H_
