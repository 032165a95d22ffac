// Errors are values: every module API returns absl::Status or absl::StatusOr<T>.
// Codes follow gRPC's: INVALID_ARGUMENT for malformed input, FAILED_PRECONDITION when
// the caller must not retry until something is fixed, UNAVAILABLE when it may retry.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cleave {

using absl::Status;
using absl::StatusOr;

}  // namespace cleave

#define CLEAVE_CONCAT_INNER_(a, b) a##b
#define CLEAVE_CONCAT_(a, b) CLEAVE_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status _cleave_status = (expr);      \
    if (!_cleave_status.ok()) return _cleave_status; \
  } while (0)

// `lhs = value of expr` if expr (an absl::StatusOr) is OK, else returns its status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(CLEAVE_CONCAT_(_cleave_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
