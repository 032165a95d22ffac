#include "client/transfer.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/parameter_set.h"

namespace cleave {
namespace {

void SetDeadline(grpc::ClientContext* ctx, double seconds) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
}

}  // namespace

Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return Status(static_cast<absl::StatusCode>(s.error_code()),
                absl::StrCat(what, ": ", s.error_message()));
}

StatusOr<std::string> FetchBlob(v1::Coordinator::StubInterface* stub, const std::string& client_id,
                                const std::string& token, const std::string& digest,
                                double deadline_s, DeviceEmulator* emulator) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline_s);
  v1::FetchRequest req;
  req.set_client_id(client_id);
  req.set_session_token(token);
  req.set_digest(digest);
  auto reader = stub->Fetch(&ctx, req);
  std::string blob;
  v1::Chunk chunk;
  int64_t total = -1;
  while (reader->Read(&chunk)) {
    if (emulator) emulator->down.Consume(static_cast<int64_t>(chunk.ByteSizeLong()));
    if (chunk.offset() != static_cast<int64_t>(blob.size()) ||
        (total >= 0 && chunk.total_size() != total)) {
      ctx.TryCancel();
      reader->Finish();
      return absl::DataLossError("download chunks out of order");
    }
    if (total < 0) {
      total = chunk.total_size();
      blob.reserve(total);
    }
    blob.append(chunk.data());
    if (static_cast<int64_t>(blob.size()) > total) {
      ctx.TryCancel();
      reader->Finish();
      return absl::DataLossError("download larger than announced");
    }
  }
  RETURN_IF_ERROR(FromGrpc(reader->Finish(), "fetch " + digest));
  if (Sha256Hex(blob) != digest) {
    return absl::DataLossError(absl::StrCat("downloaded blob does not match digest ", digest));
  }
  return blob;
}

v1::UploadHeader TaskUploadHeader(const v1::Welcome& w, const v1::Task& task,
                                  int64_t num_examples, const std::string& codec) {
  v1::UploadHeader h;
  h.set_run_id(task.run_id());
  h.set_client_id(w.client_id());
  h.set_session_token(w.session_token());
  h.set_round(task.round());
  h.set_task_id(task.task_id());
  h.set_num_examples(num_examples);
  h.set_codec(codec);
  return h;
}

StatusOr<v1::UploadReply> UploadPayload(v1::Coordinator::StubInterface* stub,
                                        v1::UploadHeader header, const std::string& payload,
                                        int chunk_bytes, double deadline_s,
                                        DeviceEmulator* emulator) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline_s);
  v1::UploadReply reply;
  auto writer = stub->Upload(&ctx, &reply);
  header.set_total_size(static_cast<int64_t>(payload.size()));
  v1::UploadChunk msg;
  *msg.mutable_header() = header;
  auto write = [&] {
    if (emulator) emulator->up.Consume(static_cast<int64_t>(msg.ByteSizeLong()));
    return writer->Write(msg);
  };
  bool ok = write();
  for (size_t off = 0; ok && off < payload.size(); off += chunk_bytes) {
    msg.set_data(payload.data() + off, std::min<size_t>(chunk_bytes, payload.size() - off));
    ok = write();
  }
  if (ok) writer->WritesDone();
  // A failed Write means the server already answered; Finish returns its status.
  RETURN_IF_ERROR(FromGrpc(writer->Finish(), "upload"));
  return reply;
}

StatusOr<double> ProbeUplink(v1::Coordinator::StubInterface* stub, const std::string& client_id,
                             const std::string& token, int64_t bytes, DeviceEmulator* emulator) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 120);
  v1::ProbeReply reply;
  const auto start = std::chrono::steady_clock::now();
  auto writer = stub->Probe(&ctx, &reply);
  v1::ProbeChunk msg;
  msg.set_client_id(client_id);
  msg.set_session_token(token);
  const std::string pad(16 << 10, 'p');
  bool ok = true;
  for (int64_t sent = 0; ok && sent < bytes; sent += static_cast<int64_t>(pad.size())) {
    msg.set_data(pad.data(), std::min<int64_t>(pad.size(), bytes - sent));
    if (emulator) emulator->up.Consume(static_cast<int64_t>(msg.ByteSizeLong()));
    ok = writer->Write(msg);
    msg.clear_client_id();
    msg.clear_session_token();
  }
  if (ok) writer->WritesDone();
  RETURN_IF_ERROR(FromGrpc(writer->Finish(), "probe"));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace cleave
