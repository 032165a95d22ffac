// Chunked transfers against the Coordinator service, shared by the client runtime,
// tests and benchmarks.
#pragma once

#include <string>

#include "cleave/v1/cleave.grpc.pb.h"
#include "client/emulation.h"
#include "core/status.h"

namespace cleave {

// Downloads blob `digest` and checks its size and SHA-256. `deadline_s` bounds the call.
StatusOr<std::string> FetchBlob(v1::Coordinator::StubInterface* stub, const std::string& client_id,
                                const std::string& token, const std::string& digest,
                                double deadline_s = 600, DeviceEmulator* emulator = nullptr);

// The header of an upload for `task` by the client `w` welcomed: ids, round, task,
// `num_examples` and `codec` (total_size is set by UploadPayload).
v1::UploadHeader TaskUploadHeader(const v1::Welcome& w, const v1::Task& task,
                                  int64_t num_examples, const std::string& codec);

// Uploads `payload` after `header` (whose total_size is set here) in chunks of
// `chunk_bytes`. Returns the server's reply or its error status.
StatusOr<v1::UploadReply> UploadPayload(v1::Coordinator::StubInterface* stub,
                                        v1::UploadHeader header, const std::string& payload,
                                        int chunk_bytes = 1 << 20, double deadline_s = 600,
                                        DeviceEmulator* emulator = nullptr);

// Streams `bytes` bytes of padding to the server's Probe and returns the seconds taken.
StatusOr<double> ProbeUplink(v1::Coordinator::StubInterface* stub, const std::string& client_id,
                             const std::string& token, int64_t bytes,
                             DeviceEmulator* emulator = nullptr);

// grpc::Status to Status, with a prefix naming the operation.
Status FromGrpc(const grpc::Status& s, const std::string& what);

}  // namespace cleave
