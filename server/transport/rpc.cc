#include "server/transport/rpc.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "cleave/v1/cleave.grpc.pb.h"
#include "compression/codec.h"
#include "core/files.h"
#include "core/printable.h"
#include "proto/split_chunks.h"
#include "server/coordinator.h"
#include "server/transport/accept_gate.h"
#include "server/transport/rpc_internal.h"
#include "server/transport/split_stream.h"

namespace cleave {

using namespace rpc_internal;  // NOLINT: the reactors' shared helpers

namespace {

// ---------------------------------------------------------------------------------
// Control stream: one per client; the coordinator holds it as the session's link.
class ControlReactor : public QueuedBidiReactor<v1::ClientMessage, v1::ServerMessage>,
                       public ClientLink {
 public:
  static ControlReactor* Create(Coordinator* core, std::string peer) {
    auto r = std::shared_ptr<ControlReactor>(new ControlReactor(core, std::move(peer)));
    r->self_ = r;
    core->CountUp(kCallBytesUp);
    core->CountDown(kCallBytesDown);
    r->StartRead(&r->in_);
    return r.get();
  }

  bool Send(v1::ServerMessage msg, bool finish_after) override {
    return QueuedBidiReactor::Send(std::move(msg), finish_after);
  }
  void Close(const Status& why) override { QueuedBidiReactor::Close(ToGrpc(why)); }
  using QueuedBidiReactor::Close;

  void OnReadDone(bool ok) override {
    if (!ok) {
      // A client closes its control stream by cancelling it (then this status goes
      // nowhere); a read also fails on bytes that do not decode as a ClientMessage.
      Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "control stream: a message did not decode, or the client half-closed "
                         "the stream (it must stay open while the client takes part)"));
      return;
    }
    core_->CountUp(WireSize(in_));
    if (client_id_.empty()) {
      if (in_.kind_case() != v1::ClientMessage::kJoin) {
        Close(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                           "the first message on the control stream must be Join"));
        return;
      }
      core_->CountUp(kConnectionBytesUp);
      v1::Welcome welcome;
      Status s = core_->Join(self_, in_.join(), peer_, &welcome);
      if (!s.ok()) {
        Close(ToGrpc(s));
        return;
      }
      client_id_ = welcome.client_id();
      v1::ServerMessage msg;
      *msg.mutable_welcome() = welcome;
      Send(std::move(msg), false);
      core_->Ready(client_id_);
    } else {
      switch (in_.kind_case()) {
        case v1::ClientMessage::kHeartbeat:
          core_->Heartbeat(client_id_);
          break;
        case v1::ClientMessage::kAck:
          core_->Heartbeat(client_id_);
          core_->Ack(client_id_, in_.ack());
          break;
        case v1::ClientMessage::kProfile:
          if (Status s = core_->SetProfile(client_id_, in_.profile()); !s.ok()) {
            Close(ToGrpc(s));
            return;
          }
          break;
        default:
          Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             "unexpected message on the control stream after Join"));
          return;
      }
    }
    StartRead(&in_);
  }

  void OnDone() override {
    core_->ControlDone(client_id_, this);
    self_.reset();  // may delete this
  }

 private:
  ControlReactor(Coordinator* core, std::string peer) : core_(core), peer_(std::move(peer)) {}
  void Queued(const v1::ServerMessage& msg) override { core_->CountDown(WireSize(msg)); }

  Coordinator* core_;
  std::shared_ptr<ControlReactor> self_;
  v1::ClientMessage in_;
  const std::string peer_;  // the client certificate's CN (mutual TLS)
  std::string client_id_;  // set after Join; read only by reactions
};

// ---------------------------------------------------------------------------------
// Blob download: one chunk written at a time, each a v1::Chunk encoded by hand so that
// its data is a slice of the blob itself (held by a reference to the blob, released
// when gRPC is done with the slice): a download in flight costs gRPC's own per-stream
// state (about 20 KB measured, bench_server_memory --fetchers), whatever
// server.chunk_bytes is, and every client's download shares the one copy.
class FetchReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(Coordinator* core, const v1::FetchRequest& req, const std::string& peer)
      : core_(core), start_(std::chrono::steady_clock::now()) {
    core_->CountUp(kCallBytesUp + WireSize(req));
    core_->CountDown(kCallBytesDown);
    auto blob = core_->FindBlob(req, peer, &fp32_size_);
    if (!blob.ok()) {
      Finish(ToGrpc(blob.status()));
      return;
    }
    blob_ = *std::move(blob);
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "download interrupted"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    const int64_t total = static_cast<int64_t>(blob_->size());
    if (offset_ >= total) {
      core_->SavedDown(fp32_size_ - total);
      core_->latency().fetch.Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
      Finish(grpc::Status::OK);
      return;
    }
    const int64_t n = std::min<int64_t>(core_->chunk_bytes(), total - offset_);
    // Chunk's offset and total_size, then its data field's tag and length, then the data.
    v1::Chunk head;
    head.set_offset(offset_);
    head.set_total_size(total);
    std::string prefix = head.SerializeAsString();
    google::protobuf::io::StringOutputStream out(&prefix);
    {
      google::protobuf::io::CodedOutputStream coded(&out);
      coded.WriteTag(v1::Chunk::kDataFieldNumber << 3 | 2);  // wire type 2: length-delimited
      coded.WriteVarint64(static_cast<uint64_t>(n));
    }
    auto* owner = new std::shared_ptr<const std::string>(blob_);
    grpc::Slice slices[2] = {
        grpc::Slice(prefix),
        grpc::Slice(const_cast<char*>(blob_->data() + offset_), static_cast<size_t>(n),
                    [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); },
                    owner)};
    chunk_ = grpc::ByteBuffer(slices, 2);
    offset_ += n;
    core_->CountDown(WireSize(static_cast<int64_t>(prefix.size()) + n));
    StartWrite(&chunk_);
  }

  Coordinator* core_;
  const std::chrono::steady_clock::time_point start_;  // for the latency histogram
  std::shared_ptr<const std::string> blob_;
  int64_t fp32_size_ = 0;  // what the blob would be as fp32
  int64_t offset_ = 0;
  grpc::ByteBuffer chunk_;
};

}  // namespace

// ---------------------------------------------------------------------------------
// The service: checks the bearer token of each call and hands it to its reactor.
// Fetch is a raw method: downloads are written as byte buffers whose data slices point
// into the shared blob (FetchReactor), so no download copies the model.
class RpcService final
    : public v1::Coordinator::WithRawCallbackMethod_Fetch<v1::Coordinator::CallbackService> {
 public:
  RpcService(Coordinator* core, std::string bearer) : core_(core), bearer_(std::move(bearer)) {}

  grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage>* Control(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Fetch(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* req) override;
  grpc::ServerReadReactor<v1::UploadChunk>* Upload(grpc::CallbackServerContext* ctx,
                                                   v1::UploadReply* reply) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const v1::StatusRequest* req,
                                      v1::StatusReply* reply) override;
  grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>* Split(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerReadReactor<v1::ProbeChunk>* Probe(grpc::CallbackServerContext* ctx,
                                                 v1::ProbeReply* reply) override;
  grpc::ServerUnaryReactor* SecAgg(grpc::CallbackServerContext* ctx, const v1::SecAggRequest* req,
                                   v1::SecAggReply* reply) override;

 private:
  // auth.token_file: OK when off or when the call carries "authorization: Bearer TOKEN"
  // (compared in constant time); UNAUTHENTICATED otherwise.
  grpc::Status CheckBearer(const grpc::CallbackServerContext* ctx) const;

  Coordinator* const core_;
  const std::string bearer_;  // "Bearer TOKEN" from auth.token_file; empty = no token check
};

grpc::Status RpcService::CheckBearer(const grpc::CallbackServerContext* ctx) const {
  if (bearer_.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no bearer token (auth.token_file)");
  }
  if (!TokenMatches(bearer_, std::string(it->second.data(), it->second.size()))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
  }
  return grpc::Status::OK;
}

grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage>* RpcService::Control(
    grpc::CallbackServerContext* ctx) {
  using R = grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return ControlReactor::Create(core_, PeerIdentity(ctx));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RpcService::Fetch(grpc::CallbackServerContext* ctx,
                                                                 const grpc::ByteBuffer* req) {
  using R = grpc::ServerWriteReactor<grpc::ByteBuffer>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  v1::FetchRequest request;
  grpc::ByteBuffer bytes(*req);  // Deserialize takes a mutable buffer: a reference copy
  if (!grpc::SerializationTraits<v1::FetchRequest>::Deserialize(&bytes, &request).ok()) {
    return new Refusal<R>(ToGrpc(absl::InvalidArgumentError("malformed FetchRequest")));
  }
  return new FetchReactor(core_, request, PeerIdentity(ctx));
}

grpc::ServerReadReactor<v1::UploadChunk>* RpcService::Upload(grpc::CallbackServerContext* ctx,
                                                               v1::UploadReply* reply) {
  using R = grpc::ServerReadReactor<v1::UploadChunk>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return NewUploadReactor(core_, ctx, reply);
}

grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>* RpcService::Split(
    grpc::CallbackServerContext* ctx) {
  using R = grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return NewSplitReactor(core_, PeerIdentity(ctx));
}

grpc::ServerReadReactor<v1::ProbeChunk>* RpcService::Probe(grpc::CallbackServerContext* ctx,
                                                             v1::ProbeReply* reply) {
  using R = grpc::ServerReadReactor<v1::ProbeChunk>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return NewProbeReactor(core_, reply, PeerIdentity(ctx));
}

grpc::ServerUnaryReactor* RpcService::SecAgg(grpc::CallbackServerContext* ctx,
                                               const v1::SecAggRequest* req,
                                               v1::SecAggReply* reply) {
  auto* r = ctx->DefaultReactor();
  if (auto s = CheckBearer(ctx); !s.ok()) {
    r->Finish(s);
    return r;
  }
  core_->CountUp(kCallBytesUp + WireSize(*req));
  core_->CountDown(kCallBytesDown + WireSize(*reply));
  r->Finish(ToGrpc(core_->SecAggSubmit(*req, PeerIdentity(ctx))));
  return r;
}

grpc::ServerUnaryReactor* RpcService::GetStatus(grpc::CallbackServerContext* ctx,
                                                  const v1::StatusRequest* req,
                                                  v1::StatusReply* reply) {
  auto* r = ctx->DefaultReactor();
  if (auto s = CheckBearer(ctx); !s.ok()) {
    r->Finish(s);
    return r;
  }
  core_->FillStatus(reply);
  core_->CountUp(kCallBytesUp + WireSize(*req));
  core_->CountDown(kCallBytesDown + WireSize(*reply));
  r->Finish(grpc::Status::OK);
  return r;
}


// ---------------------------------------------------------------------------------
// The transport: port, limits, TLS.

RpcTransport::RpcTransport(Coordinator* core)
    : core_(core), opts_(core->options()), cfg_(opts_.config) {}

StatusOr<std::unique_ptr<RpcTransport>> RpcTransport::Create(Coordinator* core) {
  std::unique_ptr<RpcTransport> t(new RpcTransport(core));
  const FederationConfig& cfg = t->cfg_;
  if (cfg.tls.cert.empty() && !t->opts_.insecure && !t->opts_.in_process_only) {
    return absl::FailedPreconditionError(
        "TLS is required: set tls.cert and tls.key (`cleave certs init DIR` makes them) or "
        "run with --insecure for plaintext");
  }
  if (cfg.tls.mutual && (cfg.tls.cert.empty() || cfg.tls.ca.empty())) {
    return absl::InvalidArgumentError("tls.mutual needs tls.cert, tls.key and tls.ca");
  }
  std::string bearer;
  if (!cfg.auth.token_file.empty() && !t->opts_.in_process_only) {
    ASSIGN_OR_RETURN(std::string token, ReadBearerToken(cfg.auth.token_file));
    if (token.size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "auth.token_file: ", cfg.auth.token_file, " holds ", token.size(),
          " characters; a bearer token needs at least 16"));
    }
    bearer = "Bearer " + token;
  }
  t->service_ = std::make_unique<RpcService>(core, std::move(bearer));
  return t;
}

RpcTransport::~RpcTransport() { Shutdown(); }

void RpcTransport::Shutdown() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (tls_thread_.joinable()) tls_thread_.join();
  // Cancels calls still open after a grace period and waits for every reactor's OnDone,
  // while the coordinator's worker pool can still finish uploads.
  if (grpc_server_) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc_server_.reset();
  }
  if (opts_.run_dir.empty() && !tls_dir_.empty()) {  // a temporary staging directory
    std::error_code ec;
    std::filesystem::remove_all(tls_dir_, ec);
    tls_dir_.clear();
  }
}

std::shared_ptr<grpc::Channel> RpcTransport::InProcessChannel() {
  return grpc_server_->InProcessChannel(grpc::ChannelArguments());
}

StatusOr<std::shared_ptr<grpc::ServerCredentials>> RpcTransport::ServerCredentials() {
  const TlsConfig& t = cfg_.tls;
  if (t.cert.empty()) {
    spdlog::warn("--insecure: TLS is off; clients, their updates and any bearer token travel "
                 "in plaintext");
    return grpc::InsecureServerCredentials();
  }
  // Refuse to serve with material no client could handshake with; then serve a checked
  // copy, which ReloadTlsLoop replaces only by material that passes the same checks.
  ASSIGN_OR_RETURN(tls_material_, ReadServerTls(t.cert, t.key, t.ca));
  if (!t.revoked.empty()) {
    ASSIGN_OR_RETURN(std::set<std::string> revoked, ReadRevocationList(t.revoked));
    core_->Revoke(std::move(revoked));
  }
  if (opts_.run_dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cleave-tls-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError("cannot create a TLS staging directory");
    }
    tls_dir_ = tmpl;
  } else {
    tls_dir_ = (std::filesystem::path(opts_.run_dir) / "tls").string();
  }
  RETURN_IF_ERROR(StageTls(tls_material_));
  const std::string cur = tls_dir_ + "/current/";
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      cur + "key.pem", cur + "cert.pem", t.ca.empty() ? "" : cur + "ca.pem",
      std::max(1, t.reload_s / 2));
  grpc::experimental::TlsServerCredentialsOptions o(provider);
  o.watch_identity_key_cert_pairs();
  if (!t.ca.empty()) o.watch_root_certs();
  o.set_cert_request_type(t.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  spdlog::info("TLS on: {}{}", t.cert, t.mutual ? ", client certificates required (mutual TLS)" : "");
  return grpc::experimental::TlsServerCredentials(o);
}

Status RpcTransport::StageTls(const TlsMaterial& m) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(tls_dir_) / absl::StrCat("v", ++tls_version_);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  }
  fs::permissions(tls_dir_, fs::perms::owner_all, ec);
  RETURN_IF_ERROR(WriteFileAtomic((dir / "cert.pem").string(), m.cert_chain));
  RETURN_IF_ERROR(WriteFileAtomic((dir / "key.pem").string(), m.key));
  fs::permissions(dir / "key.pem", fs::perms::owner_read | fs::perms::owner_write, ec);
  if (!m.ca.empty()) RETURN_IF_ERROR(WriteFileAtomic((dir / "ca.pem").string(), m.ca));
  const fs::path link = fs::path(tls_dir_) / "current", tmp = fs::path(tls_dir_) / "current.tmp";
  fs::remove(tmp, ec);
  fs::create_directory_symlink(dir.filename(), tmp, ec);
  if (!ec) fs::rename(tmp, link, ec);  // atomic: the watcher sees the old or the new pair
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot switch ", link.string(), ": ", ec.message()));
  }
  fs::remove_all(fs::path(tls_dir_) / absl::StrCat("v", tls_version_ - 2), ec);
  return absl::OkStatus();
}

void RpcTransport::ReloadTlsLoop() {
  const TlsConfig& t = cfg_.tls;
  while (true) {
    {
      MutexLock l(&mu_);
      const Clock& clock = core_->clock();
      const Clock::time_point next = clock.Now() + Seconds(t.reload_s);
      while (!stopping_ && clock.Now() < next) clock.WaitUntil(cv_, mu_, next);
      if (stopping_) return;
    }
    auto m = ReadServerTls(t.cert, t.key, t.ca);
    if (!m.ok()) {
      spdlog::error("TLS reload: keeping the current certificate and key: {}",
                    std::string(m.status().message()));
    } else if (m->cert_chain != tls_material_.cert_chain || m->key != tls_material_.key ||
               m->ca != tls_material_.ca) {
      if (Status s = StageTls(*m); !s.ok()) {
        spdlog::error("TLS reload: {}", s.ToString());
      } else {
        tls_material_ = *std::move(m);
        spdlog::info("TLS reload: new certificate material from {}", t.cert);
      }
    }
    if (!t.revoked.empty()) {
      auto revoked = ReadRevocationList(t.revoked);
      if (!revoked.ok()) {
        spdlog::error("TLS reload: keeping the current revocation list: {}",
                      std::string(revoked.status().message()));
      } else {
        core_->Revoke(*std::move(revoked));
      }
    }
  }
}

Status RpcTransport::Start() {
  if (opts_.in_process_only) {
    core_->SetMaxSessions(1 << 20);
    grpc::ServerBuilder b;
    b.RegisterService(service_.get());
    grpc_server_ = b.BuildAndStart();
    if (!grpc_server_) return absl::InternalError("cannot start the in-process server");
    spdlog::info("run {} serving in this process only (no port)", core_->RunId());
    return absl::OkStatus();
  }
  const std::string addr = opts_.listen.empty() ? cfg_.server.listen : opts_.listen;
  {
    // Every session holds a connection (a descriptor); keep room for files, threads and
    // connections still handshaking.
    rlimit r{};
    const int64_t fds = getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY
                            ? static_cast<int64_t>(r.rlim_cur)
                            : 1 << 20;
    const int derived = static_cast<int>(std::clamp<int64_t>((fds - 64) / 2, 1, 1 << 20));
    // Connections beyond the cap are closed at accept (accept_gate.h): the rest of the
    // descriptors stay for run files, gRPC's own and the spare.
    const int connections = cfg_.server.max_connections > 0
                                ? cfg_.server.max_connections
                                : static_cast<int>(std::clamp<int64_t>(fds - 128, 16, 1 << 20));
    SetConnectionLimit(connections);
    spdlog::info("up to {} sessions and {} connections ({} descriptors)",
                 core_->SetMaxSessions(derived),
                 connections, fds);
  }
  ASSIGN_OR_RETURN(auto credentials, ServerCredentials());
  grpc::ServerBuilder b;
  b.AddListeningPort(addr, credentials, &port_);
  // Two servers on one port would split the federation between them (gRPC sets
  // SO_REUSEPORT by default): binding a port in use must fail.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A connection that does not finish its TLS and HTTP/2 handshakes in time is closed,
  // so idle connections cannot pile up before authentication.
  b.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                       static_cast<int>(cfg_.server.handshake_timeout_s * 1000));
  // ... and one that carries no call for a minute (a client keeps its control stream
  // open, so only abandoned connections go).
  b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 60000);
  b.RegisterService(service_.get());
  // Accept client keepalive pings (clients ping every 20 s while idle).
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Fixed HTTP/2 receive windows of 128 KiB per stream instead of BDP auto-tuning,
  // which grows them to many MiB: a queued upload (see UploadSlots::Claim) then holds at
  // most 128 KiB in gRPC's buffers. Costs upload speed only on long-RTT links
  // (128 KiB per round trip); downloads are governed by the client's window.
  b.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  b.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 128 << 10);
  grpc_server_ = b.BuildAndStart();
  if (!grpc_server_ || port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", addr, ": address in use, or not an address of this machine"));
  }
  if (!cfg_.tls.cert.empty()) tls_thread_ = std::thread([this] { ReloadTlsLoop(); });
  spdlog::info("run {} listening on port {}", core_->RunId(), port_);
  if (!opts_.run_dir.empty()) {
    const std::string host = addr.substr(0, addr.rfind(':'));
    const std::string dial = (host == "0.0.0.0" || host == "[::]") ? "127.0.0.1" : host;
    RETURN_IF_ERROR(WriteFileAtomic((std::filesystem::path(opts_.run_dir) / "server.addr").string(), absl::StrCat(dial, ":", port_, "\n")));
  }
  return absl::OkStatus();
}

}  // namespace cleave
