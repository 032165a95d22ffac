#include "service/job_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/grpc_status.h"
#include "privacy/tls.h"
#include "service/daemon.h"

namespace cleave {
namespace {

void ToProto(const JobRecord& j, v1::JobInfo* out) {
  out->set_id(j.id);
  out->set_name(j.name);
  out->set_submitter(j.submitter);
  out->set_digest(j.digest);
  out->set_state(JobStateName(j.state));
  out->set_submitted_unix_ms(j.submitted_ms);
  out->set_started_unix_ms(j.started_ms);
  out->set_ended_unix_ms(j.ended_ms);
  out->set_reason(j.reason);
  out->set_cancel_requested(j.cancel_requested);
  out->set_committed_round(j.committed_round);
  out->set_total_rounds(j.total_rounds);
  out->set_evaluated(j.evaluated);
  out->set_test_accuracy(j.accuracy);
  out->set_test_loss(j.loss);
  out->set_expected_end_unix_ms(j.expected_end_ms);
  out->set_priority(j.priority);
  for (const auto& [client, reason] : j.declines) {
    v1::JobDecline* d = out->add_declines();
    d->set_client(client);
    d->set_reason(reason);
  }
}

constexpr size_t kChunk = 1 << 20;

}  // namespace

grpc::Status JobService::Identify(grpc::ServerContext* ctx, std::string* who) const {
  const auto& md = ctx->client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    const std::string value(it->second.data(), it->second.size());
    const std::string token = value.rfind("Bearer ", 0) == 0 ? value.substr(7) : "";
    *who = daemon_->IdentityOfToken(token);
    if (who->empty()) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "a bearer token the policy does not name");
    return grpc::Status::OK;
  }
  *who = PeerCommonName(*ctx);
  if (!who->empty()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "no identity: present a client certificate or a bearer token (--token-file)");
}

template <typename Op, typename Fill>
grpc::Status JobService::Answer(grpc::ServerContext* ctx, Op op, Fill fill) const {
  std::string who;
  if (grpc::Status s = Identify(ctx, &who); !s.ok()) return s;
  auto result = op(who);
  if (!result.ok()) return ToGrpc(result.status());
  fill(*result);
  return grpc::Status::OK;
}

grpc::Status JobService::Submit(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req, v1::JobInfo* reply) {
  return Answer(
      ctx, [&](const std::string& who) { return daemon_->Submit(who, req->config_yaml()); },
      [&](const JobRecord& j) { ToProto(j, reply); });
}

grpc::Status JobService::List(grpc::ServerContext* ctx, const v1::ListJobsRequest*, v1::ListJobsReply* reply) {
  return Answer(
      ctx, [&](const std::string& who) { return daemon_->List(who); },
      [&](const std::vector<JobRecord>& jobs) {
        for (const JobRecord& j : jobs) ToProto(j, reply->add_jobs());
      });
}

grpc::Status JobService::Get(grpc::ServerContext* ctx, const v1::GetJobRequest* req, v1::JobInfo* reply) {
  return Answer(
      ctx, [&](const std::string& who) { return daemon_->Get(who, req->id()); },
      [&](const JobRecord& j) { ToProto(j, reply); });
}

grpc::Status JobService::Cancel(grpc::ServerContext* ctx, const v1::CancelJobRequest* req, v1::JobInfo* reply) {
  return Answer(
      ctx, [&](const std::string& who) { return daemon_->Cancel(who, req->id()); },
      [&](const JobRecord& j) { ToProto(j, reply); });
}

grpc::Status JobService::Audit(grpc::ServerContext* ctx, const v1::AuditRequest*, v1::AuditReply* reply) {
  return Answer(
      ctx, [&](const std::string& who) { return daemon_->AuditLog(who); },
      [&](const std::vector<AuditEntry>& log) {
        for (const AuditEntry& e : log) {
          v1::AuditEntry* out = reply->add_entries();
          out->set_at_unix_ms(e.at_ms);
          out->set_who(e.who);
          out->set_action(e.action);
          out->set_job(e.job);
          out->set_digest(e.digest);
          out->set_outcome(e.outcome);
        }
      });
}

grpc::Status JobService::Logs(grpc::ServerContext* ctx, const v1::JobLogsRequest* req,
                              grpc::ServerWriter<v1::JobLogLine>* writer) {
  std::string who;
  if (grpc::Status s = Identify(ctx, &who); !s.ok()) return s;
  StatusOr<std::string> dir = daemon_->RunDirOf(who, req->id());
  if (!dir.ok()) return ToGrpc(dir.status());
  const std::string path = *dir + "/metrics.jsonl";
  std::streamoff offset = 0;
  for (;;) {
    const bool ended = daemon_->Ended(req->id());  // before reading: nothing written after is missed
    std::ifstream in(path);
    in.seekg(offset);
    std::string line;
    while (in && std::getline(in, line)) {
      if (in.eof()) break;  // a line still being written
      offset = in.tellg();
      v1::JobLogLine out;
      out.set_line(line);
      if (!writer->Write(out)) return grpc::Status::CANCELLED;
    }
    if (!req->follow() || ended) return grpc::Status::OK;
    if (ctx->IsCancelled()) return grpc::Status::CANCELLED;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

grpc::Status JobService::Download(grpc::ServerContext* ctx, const v1::DownloadJobRequest* req,
                                  grpc::ServerWriter<v1::JobFileChunk>* writer) {
  namespace fs = std::filesystem;
  std::string who;
  if (grpc::Status s = Identify(ctx, &who); !s.ok()) return s;
  StatusOr<std::string> dir = daemon_->RunDirOf(who, req->id());
  if (!dir.ok()) return ToGrpc(dir.status());
  std::error_code ec;
  for (fs::recursive_directory_iterator it(*dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path rel = fs::relative(it->path(), *dir);
    if (rel.begin()->string() == "tls") {  // the server's key: never handed out
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    std::ifstream in(it->path(), std::ios::binary);
    std::string buf(kChunk, '\0');
    bool sent = false;
    while (in || !sent) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      v1::JobFileChunk chunk;
      chunk.set_path(rel.string());
      chunk.set_data(buf.data(), static_cast<size_t>(in.gcount()));
      chunk.set_last(!in);
      if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
      sent = true;
      if (chunk.last()) break;
    }
  }
  if (ec) return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the run directory: " + ec.message());
  return grpc::Status::OK;
}

}  // namespace cleave
