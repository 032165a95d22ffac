// A Status as a gRPC status (same code, same message). Header-only: core links no gRPC;
// the transports that include this do.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "core/status.h"

namespace cleave {

inline grpc::Status ToGrpc(const Status& s) {
  return s.ok() ? grpc::Status::OK : grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace cleave
