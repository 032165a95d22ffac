#include "client/gossip.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cleave/v1/cleave.grpc.pb.h"
#include "client/emulation.h"
#include "client/transfer.h"
#include "core/mutex.h"
#include "core/printable.h"
#include "privacy/certs.h"
#include "privacy/tls.h"

namespace cleave {

// How far ahead of the round this device last expected a caller's round may be: a
// neighbour's task of a round can come before this device's own, and this device may have
// sat out the rounds between (not sampled). Anything further is refused at once rather
// than waited for.
constexpr int64_t kRoundsAhead = 100;
// How many callers may wait for their round at once, and how many of them in one sender's
// name; more are refused (RESOURCE_EXHAUSTED), so that callers cannot hold the device's
// threads, nor one certificate every waiting place.
constexpr int kMaxWaiting = 16;
constexpr int kMaxWaitingPerSender = 2;

// What the Peer service holds: the round it takes models of, from whom, and what came.
struct PeerServer::Mailbox {
  mutable Mutex mu;
  CondVar cv;
  bool closing ABSL_GUARDED_BY(mu) = false;  // the server is going: nobody waits any more
  int waiting ABSL_GUARDED_BY(mu) = 0;       // callers waiting for their round
  std::map<std::string, int> waiting_as ABSL_GUARDED_BY(mu);  // of them, by the sender they call as
  std::string run_id ABSL_GUARDED_BY(mu);
  int64_t round ABSL_GUARDED_BY(mu) = 0;  // 0: no round expected yet
  std::map<std::string, std::string> tokens ABSL_GUARDED_BY(mu);  // expected senders' secrets
  ParameterSet layout ABSL_GUARDED_BY(mu);
  int64_t size ABSL_GUARDED_BY(mu) = 0;  // the encoded size a model of `layout` has
  std::map<std::string, ParameterSet> received ABSL_GUARDED_BY(mu);
  int64_t bytes ABSL_GUARDED_BY(mu) = 0;
  // The pipeline hop expected (ExpectPipeline), while `open`.
  struct Hop {
    bool open = false, taken = false;
    std::string run_id, sender, token;
    int64_t round = 0;
    PeerServer::PipelineServe serve;
  } hop ABSL_GUARDED_BY(mu);

  // Waits until `ready`, the caller's deadline `until`, its cancellation or the server's
  // closing, as one of at most kMaxWaiting callers. OK once ready, or if it never had to
  // wait; an error status otherwise.
  template <typename Ready>
  grpc::Status WaitFor(grpc::ServerContext* ctx, const std::string& sender,
                       std::chrono::system_clock::time_point until, Ready ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (ready()) return grpc::Status::OK;
    const auto as = waiting_as.find(sender);
    const int mine = as == waiting_as.end() ? 0 : as->second;
    if (waiting >= kMaxWaiting || mine >= kMaxWaitingPerSender) {
      return {grpc::StatusCode::RESOURCE_EXHAUSTED,
              absl::StrCat("too many callers wait for their round on this device (", waiting, " of ", kMaxWaiting,
                           ", ", mine, " of ", kMaxWaitingPerSender, " as '", Printable(sender), "')")};
    }
    ++waiting;
    ++waiting_as[sender];
    // In slices: a cancelled caller wakes nobody, so each slice looks again.
    while (!ready() && !closing && !ctx->IsCancelled() && std::chrono::system_clock::now() < until) {
      const auto left = std::min<std::chrono::system_clock::duration>(
          until - std::chrono::system_clock::now(), std::chrono::milliseconds(100));
      cv.WaitUntil(&mu, std::chrono::steady_clock::now() + left);
    }
    --waiting;
    if (--waiting_as[sender] == 0) waiting_as.erase(sender);
    if (closing) return {grpc::StatusCode::UNAVAILABLE, "this device's Peer service is shutting down"};
    if (ctx->IsCancelled()) return {grpc::StatusCode::CANCELLED, "the caller cancelled"};
    return grpc::Status::OK;  // ready, or the deadline: the checks that follow say which
  }

  // The caller's claims that can be checked before its round comes: its certificate is
  // the sender's, and its run and round are this device's (or a few rounds ahead).
  static grpc::Status Claims(const std::string& sender, const std::string& peer_cn, const std::string& run,
                             int64_t round, const std::string& expected_run, int64_t expected_round) {
    if (!peer_cn.empty() && peer_cn != sender) {
      return {grpc::StatusCode::PERMISSION_DENIED,
              absl::StrCat("a call made as '", Printable(sender), "' under the certificate of '",
                           Printable(peer_cn), "'")};
    }
    if (expected_round > 0 && (run != expected_run || round < expected_round ||
                               round > expected_round + kRoundsAhead)) {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              absl::StrCat("a call for round ", round, " of run ", Printable(run), "; this device is in round ",
                           expected_round, " of run ", Printable(expected_run), " and waits for at most ",
                           kRoundsAhead, " rounds ahead")};
    }
    return grpc::Status::OK;
  }

  // Checks a pipeline hop's opening against the one expected (waiting up to `until` for
  // it); OK with what serves it, now taken.
  grpc::Status AdmitHop(const v1::PipelineOpen& h, const std::string& peer_cn, grpc::ServerContext* ctx,
                        std::chrono::system_clock::time_point until, PeerServer::PipelineServe* serve) {
    MutexLock l(&mu);
    if (grpc::Status s = Claims(h.sender(), peer_cn, h.run_id(), h.round(), hop.run_id, hop.round); !s.ok()) return s;
    // A sender ahead of this device (its task of the round came first) waits for it.
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return hop.round >= h.round(); };
    if (grpc::Status s = WaitFor(ctx, h.sender(), until, ready); !s.ok()) return s;
    if (!hop.open) {
      return {grpc::StatusCode::FAILED_PRECONDITION, "this device expects no pipeline hop now"};
    }
    if (h.run_id() != hop.run_id || h.round() != hop.round) {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              absl::StrCat("a hop of run ", Printable(h.run_id()), " round ", h.round(), "; this device is in round ",
                           hop.round, " of run ", Printable(hop.run_id))};
    }
    if (h.sender() != hop.sender || h.token() != hop.token) {
      return {grpc::StatusCode::PERMISSION_DENIED,
              absl::StrCat("'", Printable(h.sender()),
                           "' is not this device's upstream neighbour in this round (or its secret is wrong)")};
    }
    if (hop.taken) {
      return {grpc::StatusCode::ALREADY_EXISTS,
              absl::StrCat("'", Printable(h.sender()), "' already opened its hop of round ", hop.round)};
    }
    hop.taken = true;
    *serve = hop.serve;
    return grpc::Status::OK;
  }

  // Checks a header against the round expected (waiting up to `until` while the sender
  // is a round ahead); OK with the bytes to read.
  grpc::Status Admit(const v1::GossipChunk::Header& h, const std::string& peer_cn, grpc::ServerContext* ctx,
                     std::chrono::system_clock::time_point until) {
    MutexLock l(&mu);
    if (grpc::Status s = Claims(h.sender(), peer_cn, h.run_id(), h.round(), run_id, round); !s.ok()) return s;
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return round >= h.round() && round > 0; };
    if (grpc::Status s = WaitFor(ctx, h.sender(), until, ready); !s.ok()) return s;
    if (h.run_id() != run_id || round == 0) {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              absl::StrCat("a model for run ", Printable(h.run_id()), ", this is run ",
                           Printable(run_id))};
    }
    if (h.round() != round) {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              absl::StrCat("a model for round ", h.round(), ", this client is in round ", round)};
    }
    auto t = tokens.find(h.sender());
    if (t == tokens.end() || t->second != h.token()) {
      return {grpc::StatusCode::PERMISSION_DENIED,
              absl::StrCat("'", Printable(h.sender()),
                           "' is not this client's neighbour in this round (or its secret is wrong)")};
    }
    if (received.count(h.sender())) {
      return {grpc::StatusCode::ALREADY_EXISTS,
              absl::StrCat("'", Printable(h.sender()), "' already sent its model of round ", round)};
    }
    if (h.total_size() != size) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat("a model of ", h.total_size(), " bytes; this model has ", size)};
    }
    return grpc::Status::OK;
  }

  grpc::Status Deliver(const v1::GossipChunk::Header& h, const std::string& data) {
    auto model = ParameterSet::Decode(data);
    MutexLock l(&mu);
    if (h.round() != round || received.count(h.sender())) {
      return {grpc::StatusCode::FAILED_PRECONDITION, "the round ended while the model arrived"};
    }
    if (!model.ok() || !model->SameLayout(layout)) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat("not a model of this layout: ",
                           model.ok() ? "other tensors" : std::string(model.status().message()))};
    }
    if (Status finite = CheckViews(layout, ViewsOf(*model)); !finite.ok()) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat("the model is not usable: ", finite.message())};
    }
    received[h.sender()] = *std::move(model);
    bytes += static_cast<int64_t>(data.size());
    cv.SignalAll();
    return grpc::Status::OK;
  }
};

namespace {

// The CN of the caller's certificate under mutual TLS; "" otherwise.
std::string PeerCommonName(grpc::ServerContext* ctx) {
  std::string cn;
  if (auto auth = ctx->auth_context(); auth && auth->IsPeerAuthenticated()) {
    const auto v = auth->FindPropertyValues("x509_common_name");
    if (!v.empty()) cn.assign(v[0].data(), v[0].size());
  }
  return cn;
}

class PeerService final : public v1::Peer::Service {
 public:
  explicit PeerService(PeerServer::Mailbox* box) : box_(box) {}

  grpc::Status Gossip(grpc::ServerContext* ctx, grpc::ServerReader<v1::GossipChunk>* reader,
                      v1::GossipReply*) override {
    v1::GossipChunk chunk;
    if (!reader->Read(&chunk) || !chunk.has_header()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "a gossip stream must start with its header"};
    }
    const v1::GossipChunk::Header h = chunk.header();
    const std::string cn = PeerCommonName(ctx);
    // A sender whose task came before ours waits for it, within its call's deadline.
    const auto until = std::min(ctx->deadline(),
                                std::chrono::system_clock::now() + std::chrono::minutes(10));
    if (grpc::Status s = box_->Admit(h, cn, ctx, until); !s.ok()) return s;
    reader->SendInitialMetadata();  // admitted: the sender's bytes may come
    std::string bytes;
    bytes.reserve(h.total_size());
    while (reader->Read(&chunk)) {
      if (!chunk.has_data() ||
          chunk.data().size() > static_cast<size_t>(h.total_size()) - bytes.size()) {
        return {grpc::StatusCode::INVALID_ARGUMENT, "more model bytes than the header announced"};
      }
      bytes += chunk.data();
    }
    if (static_cast<int64_t>(bytes.size()) != h.total_size()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "fewer model bytes than the header announced"};
    }
    return box_->Deliver(h, bytes);
  }

  grpc::Status Pipeline(grpc::ServerContext* ctx,
                        grpc::ServerReaderWriter<v1::SplitDown, v1::SplitUp>* stream) override {
    v1::SplitUp first;
    if (!stream->Read(&first) || !first.has_hop()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "a pipeline stream must start with its PipelineOpen"};
    }
    const auto until = std::min(ctx->deadline(), std::chrono::system_clock::now() + std::chrono::minutes(10));
    PeerServer::PipelineServe serve;
    if (grpc::Status s = box_->AdmitHop(first.hop(), PeerCommonName(ctx), ctx, until, &serve); !s.ok()) return s;
    return serve(ctx, stream, first.hop());
  }

 private:
  PeerServer::Mailbox* box_;
};

}  // namespace

StatusOr<std::unique_ptr<PeerServer>> PeerServer::Start(const std::string& listen,
                                                        const std::string& ca,
                                                        const std::string& cert,
                                                        const std::string& key) {
  std::unique_ptr<PeerServer> p(new PeerServer());
  p->box_ = std::make_unique<Mailbox>();
  p->service_ = std::make_unique<PeerService>(p->box_.get());
  grpc::ServerBuilder b;
  b.AddListeningPort(listen, PeerServerCredentials(ca, cert, key), &p->port_);
  b.RegisterService(p->service_.get());
  b.SetMaxReceiveMessageSize(4 << 20);
  // A device serves a few neighbours: a bounded pool, whatever callers open.
  grpc::ResourceQuota quota("peer");
  quota.SetMaxThreads(64);
  b.SetResourceQuota(quota);
  p->server_ = b.BuildAndStart();
  if (!p->server_ || p->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve Peer on ", listen));
  }
  return p;
}

PeerServer::~PeerServer() {
  if (box_) {  // callers waiting for a round return now: Shutdown waits for them
    MutexLock l(&box_->mu);
    box_->closing = true;
    box_->cv.SignalAll();
  }
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

void PeerServer::Expect(const std::string& run_id, int64_t round,
                        std::map<std::string, std::string> tokens, const ParameterSet& layout) {
  MutexLock l(&box_->mu);
  box_->run_id = run_id;
  box_->round = round;
  box_->tokens = std::move(tokens);
  box_->layout = layout;
  box_->size = static_cast<int64_t>(layout.EncodedSize());
  box_->received.clear();
  box_->bytes = 0;
  box_->cv.SignalAll();
}

std::map<std::string, ParameterSet> PeerServer::Collect(
    int64_t round, std::chrono::steady_clock::time_point deadline) {
  MutexLock l(&box_->mu);
  while (box_->round == round && box_->received.size() < box_->tokens.size()) {
    if (box_->cv.WaitUntil(&box_->mu, deadline)) break;
  }
  std::map<std::string, ParameterSet> out;
  if (box_->round == round) {
    out = std::move(box_->received);
    box_->received.clear();
    box_->tokens.clear();  // late models of the round are refused from now on
    box_->cv.SignalAll();  // Watch: nothing is awaited any more
  }
  return out;
}

void PeerServer::Watch(int64_t round, const std::string& sender, const std::function<bool()>& reachable,
                       std::chrono::milliseconds period, int strikes) {
  auto awaited = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(box_->mu) {
    return box_->round == round && box_->tokens.count(sender) > 0 && box_->received.count(sender) == 0;
  };
  for (int missed = 0;;) {
    {
      MutexLock l(&box_->mu);
      const auto until = std::chrono::steady_clock::now() + period;
      while (awaited() && !box_->cv.WaitUntil(&box_->mu, until)) {
      }
      if (!awaited()) return;
    }
    missed = reachable() ? 0 : missed + 1;
    if (missed >= strikes) {
      GiveUp(round, sender);
      return;
    }
  }
}

void PeerServer::GiveUp(int64_t round, const std::string& sender) {
  MutexLock l(&box_->mu);
  if (box_->round != round || box_->received.count(sender)) return;
  box_->tokens.erase(sender);  // a late model from it is refused like a stranger's
  box_->cv.SignalAll();
}

void PeerServer::ExpectPipeline(const std::string& run_id, int64_t round, const std::string& sender,
                                const std::string& token, PipelineServe serve) {
  MutexLock l(&box_->mu);
  box_->hop = {true, false, run_id, sender, token, round, std::move(serve)};
  box_->cv.SignalAll();
}

bool PeerServer::EndPipeline() {
  MutexLock l(&box_->mu);
  box_->hop.open = false;
  box_->hop.serve = nullptr;  // what it captured may go (a call that took it holds its copy)
  box_->cv.SignalAll();
  return box_->hop.taken;
}

bool PeerServer::PipelineTaken() const {
  MutexLock l(&box_->mu);
  return box_->hop.taken;
}

int PeerServer::waiting_callers() const {
  MutexLock l(&box_->mu);
  return box_->waiting;
}

int64_t PeerServer::bytes_received() const {
  MutexLock l(&box_->mu);
  return box_->bytes;
}

Status SendModel(const std::string& address, const std::string& name, const std::string& run_id,
                 int64_t round, const std::string& sender, const std::string& token,
                 const std::string& model, const std::string& ca, const std::string& cert,
                 const std::string& key, double timeout_s, DeviceEmulator* emulator,
                 SendSpan* span) {
  grpc::ChannelArguments args;
  // The neighbour's certificate names it (certs.h); the address is whatever reaches it.
  if (!ca.empty()) args.SetSslTargetNameOverride(name + kPeerNameSuffix);
  auto channel = grpc::CreateCustomChannel(address, ClientCredentials(ca, cert, key), args);
  auto stub = v1::Peer::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  v1::GossipReply reply;
  auto writer = stub->Gossip(&ctx, &reply);
  v1::GossipChunk chunk;
  auto* h = chunk.mutable_header();
  h->set_run_id(run_id);
  h->set_round(round);
  h->set_sender(sender);
  h->set_token(token);
  h->set_total_size(static_cast<int64_t>(model.size()));
  bool ok = writer->Write(chunk);
  // Its initial metadata says the neighbour admitted the model (a refusal ends the call
  // instead, and Finish says why); the neighbour may wait for its own round's task first.
  if (ok) writer->WaitForInitialMetadata();
  const auto admitted = std::chrono::steady_clock::now();
  constexpr size_t kChunk = 1 << 20;
  for (size_t at = 0; ok && at < model.size(); at += kChunk) {
    chunk.set_data(model.substr(at, kChunk));
    if (emulator) emulator->up.Consume(static_cast<int64_t>(chunk.ByteSizeLong()));
    ok = writer->Write(chunk);
  }
  writer->WritesDone();
  RETURN_IF_ERROR(FromGrpc(writer->Finish(), absl::StrCat("gossip to ", name)));
  if (span) *span = {admitted, std::chrono::steady_clock::now()};
  return absl::OkStatus();
}

bool PeerReachable(const std::string& address, const std::string& name, const std::string& ca,
                   const std::string& cert, const std::string& key, double timeout_s) {
  grpc::ChannelArguments args;
  if (!ca.empty()) args.SetSslTargetNameOverride(name + kPeerNameSuffix);
  // A connection of its own: not a subchannel shared with (and backing off for) a send.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(address, ClientCredentials(ca, cert, key), args);
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  // The first attempt decides: a refused connection (or handshake) is a failure at once,
  // not retried until the deadline as WaitForConnected would.
  for (grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);;) {
    if (state == GRPC_CHANNEL_READY) return true;
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) return false;
    if (!channel->WaitForStateChange(state, deadline)) return false;
    state = channel->GetState(/*try_to_connect=*/false);
  }
}

double UplinkMbps(int64_t bytes, const std::vector<SendSpan>& spans) {
  if (spans.empty()) return 0;
  auto first = spans[0].admitted, last = spans[0].done;
  for (const SendSpan& s : spans) {
    first = std::min(first, s.admitted);
    last = std::max(last, s.done);
  }
  // A span under a microsecond (a clock's tick) counts as one.
  const double seconds = std::max(1e-6, std::chrono::duration<double>(last - first).count());
  return static_cast<double>(bytes) * 8 / seconds / 1e6;
}

}  // namespace cleave
