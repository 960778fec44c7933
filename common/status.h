// Status helpers used at every fallible call (absl::Status / absl::StatusOr).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define MOESHARD_CONCAT_INNER(a, b) a##b
#define MOESHARD_CONCAT(a, b) MOESHARD_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status _st = (expr);                   \
    if (!_st.ok()) return _st;                     \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates a StatusOr, returns its status on error,
// otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(MOESHARD_CONCAT(_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
