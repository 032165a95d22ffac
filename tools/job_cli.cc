#include "tools/job_cli.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cleave/v1/jobs.grpc.pb.h"
#include "core/files.h"
#include "privacy/tls.h"
#include "tools/report.h"

namespace cleave {
namespace {

// A connection to the daemon's job API: its stub, and the token each call carries.
struct Connection {
  std::unique_ptr<v1::Jobs::Stub> stub;
  std::string bearer;  // "Bearer TOKEN", or empty

  std::unique_ptr<grpc::ClientContext> Context(int deadline_s = 30) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!bearer.empty()) ctx->AddMetadata("authorization", bearer);
    if (deadline_s > 0) ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_s));
    return ctx;
  }
};

// The connection the options describe; nullopt, after printing why, when they cannot make
// one.
std::optional<Connection> Connect(const JobCliOptions& o) {
  if (o.ca.empty() && !o.insecure) {
    std::cerr << "cleave job: no CA to verify the daemon with (--ca); plaintext needs --insecure\n";
    return std::nullopt;
  }
  Connection c;
  if (!o.token_file.empty()) {
    StatusOr<std::string> token = ReadBearerToken(o.token_file);
    if (!token.ok()) {
      std::cerr << "cleave job: " << token.status().message() << "\n";
      return std::nullopt;
    }
    c.bearer = "Bearer " + *token;
  }
  // The token goes as plain metadata (on a plaintext channel too, for --insecure
  // daemons on loopback), not as call credentials.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  c.stub = v1::Jobs::NewStub(grpc::CreateCustomChannel(o.server, ClientCredentials(o.ca, o.cert, o.key), args));
  return c;
}

int Failed(const grpc::Status& s) {
  std::cerr << "cleave job: " << s.error_message() << " (" << s.error_code() << ")\n";
  return 1;
}

// A Unix time in ms as UTC, to the millisecond.
std::string When(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  const std::time_t t = unix_ms / 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::ostringstream out;
  out << std::put_time(&tm, "%Y-%m-%d %H:%M:%S") << "." << std::setw(3) << std::setfill('0') << unix_ms % 1000
      << "Z";
  return out.str();
}

std::string Progress(const v1::JobInfo& j) {
  std::string p = absl::StrCat(j.committed_round(), "/", j.total_rounds());
  if (j.expected_end_unix_ms() > 0) absl::StrAppend(&p, "  ends ", When(j.expected_end_unix_ms()));
  if (j.evaluated()) {
    absl::StrAppend(&p, "  acc ", absl::StrFormat("%.4f", j.test_accuracy()), "  loss ",
                    absl::StrFormat("%.4f", j.test_loss()));
  }
  return p;
}

}  // namespace

int JobSubmit(const JobCliOptions& o, const std::string& config_path) {
  StatusOr<std::string> text = ReadFile(config_path);
  if (!text.ok()) {
    std::cerr << "cleave job submit: " << text.status().message() << "\n";
    return 2;
  }
  auto c = Connect(o);
  if (!c) return 2;
  v1::SubmitJobRequest req;
  req.set_config_yaml(*text);
  v1::JobInfo reply;
  if (grpc::Status s = c->stub->Submit(c->Context().get(), req, &reply); !s.ok()) return Failed(s);
  std::cout << reply.id() << "\n";
  return 0;
}

int JobList(const JobCliOptions& o) {
  auto c = Connect(o);
  if (!c) return 2;
  v1::ListJobsReply reply;
  if (grpc::Status s = c->stub->List(c->Context().get(), v1::ListJobsRequest(), &reply); !s.ok()) return Failed(s);
  std::cout << std::left << std::setw(10) << "ID" << std::setw(20) << "NAME" << std::setw(11) << "STATE"
            << std::setw(12) << "SUBMITTER" << "PROGRESS\n";
  for (const v1::JobInfo& j : reply.jobs()) {
    std::cout << std::left << std::setw(10) << j.id() << std::setw(20) << j.name() << std::setw(11) << j.state()
              << std::setw(12) << j.submitter() << Progress(j) << "\n";
  }
  return 0;
}

int JobStatus(const JobCliOptions& o, const std::string& id) {
  auto c = Connect(o);
  if (!c) return 2;
  v1::GetJobRequest req;
  req.set_id(id);
  v1::JobInfo j;
  if (grpc::Status s = c->stub->Get(c->Context().get(), req, &j); !s.ok()) return Failed(s);
  std::cout << j.id() << " (" << j.name() << ")\n"
            << "  state      " << j.state() << (j.cancel_requested() ? " (being cancelled)" : "") << "\n"
            << "  submitter  " << j.submitter() << "\n"
            << "  digest     " << j.digest() << "\n"
            << "  submitted  " << When(j.submitted_unix_ms()) << "\n"
            << "  started    " << When(j.started_unix_ms()) << "\n"
            << "  ended      " << When(j.ended_unix_ms()) << "\n"
            << "  ends       " << When(j.expected_end_unix_ms()) << " (forecast)\n"
            << "  progress   " << Progress(j) << "\n"
            << "  priority   " << j.priority() << "\n";
  if (!j.reason().empty()) std::cout << "  reason     " << j.reason() << "\n";
  for (const v1::JobDecline& d : j.declines()) {
    if (!d.reason().empty()) std::cout << "  declined by " << d.client() << ": " << d.reason() << "\n";
  }
  return 0;
}

int JobLogs(const JobCliOptions& o, const std::string& id, bool follow) {
  auto c = Connect(o);
  if (!c) return 2;
  v1::JobLogsRequest req;
  req.set_id(id);
  req.set_follow(follow);
  auto ctx = c->Context(follow ? 0 : 30);
  auto reader = c->stub->Logs(ctx.get(), req);
  v1::JobLogLine line;
  while (reader->Read(&line)) std::cout << line.line() << std::endl;
  if (grpc::Status s = reader->Finish(); !s.ok()) return Failed(s);
  return 0;
}

int JobCancel(const JobCliOptions& o, const std::string& id) {
  auto c = Connect(o);
  if (!c) return 2;
  v1::CancelJobRequest req;
  req.set_id(id);
  v1::JobInfo j;
  if (grpc::Status s = c->stub->Cancel(c->Context().get(), req, &j); !s.ok()) return Failed(s);
  std::cout << j.id() << ": " << (j.state() == "running" ? "stopping after its last committed round" : j.state())
            << "\n";
  return 0;
}

int JobAudit(const JobCliOptions& o) {
  auto c = Connect(o);
  if (!c) return 2;
  v1::AuditReply reply;
  if (grpc::Status s = c->stub->Audit(c->Context().get(), v1::AuditRequest(), &reply); !s.ok()) return Failed(s);
  for (const v1::AuditEntry& e : reply.entries()) {
    std::cout << When(e.at_unix_ms()) << "  " << e.who() << "  " << e.action() << "  "
              << (e.job().empty() ? "-" : e.job()) << "  " << (e.digest().empty() ? "-" : e.digest().substr(0, 12))
              << "  " << e.outcome() << "\n";
  }
  return 0;
}

int JobDownload(const JobCliOptions& o, const std::string& id, const std::string& out) {
  namespace fs = std::filesystem;
  auto c = Connect(o);
  if (!c) return 2;
  v1::DownloadJobRequest req;
  req.set_id(id);
  auto ctx = c->Context(600);
  auto reader = c->stub->Download(ctx.get(), req);
  std::map<std::string, std::ofstream> files;
  v1::JobFileChunk chunk;
  const fs::path root = fs::absolute(out);
  while (reader->Read(&chunk)) {
    const fs::path path = (root / chunk.path()).lexically_normal();
    const std::string rel = fs::relative(path, root).string();
    if (chunk.path().empty() || rel.rfind("..", 0) == 0 || fs::path(chunk.path()).is_absolute()) {
      std::cerr << "cleave job download: refusing a file outside " << out << ": " << chunk.path() << "\n";
      return 1;
    }
    auto it = files.find(rel);
    if (it == files.end()) {
      fs::create_directories(path.parent_path());
      it = files.emplace(rel, std::ofstream(path, std::ios::binary | std::ios::trunc)).first;
    }
    it->second.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    if (chunk.last()) it->second.close();
  }
  if (grpc::Status s = reader->Finish(); !s.ok()) return Failed(s);
  std::cout << files.size() << " files in " << out << "\n";
  if (fs::exists(root / "metrics.jsonl")) PrintReport(root.string());
  return 0;
}

}  // namespace cleave
