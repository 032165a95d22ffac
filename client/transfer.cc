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
                                double deadline_s) {
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

StatusOr<v1::UploadReply> UploadPayload(v1::Coordinator::StubInterface* stub,
                                        v1::UploadHeader header, const std::string& payload,
                                        int chunk_bytes, double deadline_s) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline_s);
  v1::UploadReply reply;
  auto writer = stub->Upload(&ctx, &reply);
  header.set_total_size(static_cast<int64_t>(payload.size()));
  v1::UploadChunk msg;
  *msg.mutable_header() = header;
  bool ok = writer->Write(msg);
  for (size_t off = 0; ok && off < payload.size(); off += chunk_bytes) {
    msg.set_data(payload.data() + off, std::min<size_t>(chunk_bytes, payload.size() - off));
    ok = writer->Write(msg);
  }
  if (ok) writer->WritesDone();
  // A failed Write means the server already answered; Finish returns its status.
  RETURN_IF_ERROR(FromGrpc(writer->Finish(), "upload"));
  return reply;
}

}  // namespace cleave
