#include "client/client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/emulation.h"
#include "client/gossip.h"
#include "client/shared.h"
#include "compression/codec.h"
#include "core/clock.h"
#include "core/files.h"
#include "core/mutex.h"
#include "core/parameter_set.h"
#include "core/printable.h"
#include "client/secagg_client.h"
#include "client/split_client.h"
#include "client/transfer.h"
#include "models/model.h"
#include "privacy/tls.h"

namespace cleave {

namespace v1 = ::cleave::v1;

namespace {

// Federated evaluation's batch: small enough for a model's activations to stay in cache
// (docs/benchmarks.md, "Local training throughput").
constexpr int kEvalBatch = 256;

// The personal tensors saved in `path` ("KEY\n" then a parameter set) if they were saved
// for `key` (this run and model) and fit `global`; else none, with a warning when the
// file exists but does not fit.
ParameterSet LoadPersonal(const std::string& path, const std::string& key,
                          const std::vector<std::string>& names, const ParameterSet& global) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return ParameterSet();  // none saved yet
  const size_t newline = bytes->find('\n');
  if (newline == std::string::npos || bytes->compare(0, newline, key) != 0) {
    spdlog::info("{} holds personal layers of another run or model; starting afresh", path);
    return ParameterSet();
  }
  auto saved = ParameterSet::Decode(std::string_view(*bytes).substr(newline + 1));
  ParameterSet probe = global;
  Status fits = saved.ok() ? Overwrite(*saved, &probe) : saved.status();
  if (fits.ok() && saved->size() != names.size()) {
    fits = absl::InvalidArgumentError("other tensors than the model's personal ones");
  }
  if (!fits.ok()) {
    spdlog::warn("ignoring {}: {}", path, fits.ToString());
    return ParameterSet();
  }
  spdlog::info("personal layers restored from {}", path);
  return *std::move(saved);
}

v1::DeviceProfile LocalDevice() {
  v1::DeviceProfile d;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  d.set_hostname(host);
  d.set_cpu_cores(static_cast<int>(std::thread::hardware_concurrency()));
  d.set_memory_bytes(static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE));
  d.set_platform("linux");
  return d;
}

// Tells the server `task` was not taken, with the reason, and returns `why`.
Status Decline(const std::function<void(const v1::TaskAck&)>& ack, const v1::Task& task,
               const Status& why) {
  v1::TaskAck a;
  a.set_task_id(task.task_id());
  a.set_accepted(false);
  a.set_error(std::string(why.message()));
  ack(a);
  return why;
}

// Batch order: the round's seed mixed with this client's name (stable across runs,
// unlike the id the server assigns in join order), so a seeded run repeats itself.
uint64_t BatchSeed(const v1::Task& task, const v1::Welcome& w, const std::string& name) {
  return task.train().seed() ^ std::hash<std::string>{}(name.empty() ? w.client_id() : name);
}

// Distributed DP: clips `delta` to L2 norm dp.clip, then adds this client's share of
// the noise, from a generator seeded by the OS (the server must not predict it).
void AddDpNoise(const v1::DpTask& dp, ParameterSet* delta) {
  double sq = 0;
  for (const auto& t : delta->tensors()) {
    for (float v : t.values) sq += static_cast<double>(v) * v;
  }
  const double norm = std::sqrt(sq);
  const double scale = norm > dp.clip() ? dp.clip() / norm : 1.0;
  std::mt19937_64 rng((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}());
  std::normal_distribution<double> noise(0, dp.noise_stddev());
  for (auto& t : delta->mutable_tensors()) {
    for (float& v : t.values) v = static_cast<float>(v * scale + noise(rng));
  }
}

// trained - base, tensor by tensor (the same layout).
ParameterSet Delta(ParameterSet trained, const ParameterSet& base) {
  for (size_t i = 0; i < trained.size(); ++i) {
    auto& d = trained.mutable_tensors()[i].values;
    const auto& g = base.tensors()[i].values;
    for (size_t j = 0; j < d.size(); ++j) d[j] -= g[j];
  }
  return trained;
}

bool Fatal(absl::StatusCode c) {
  return c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kFailedPrecondition ||
         c == absl::StatusCode::kUnauthenticated || c == absl::StatusCode::kPermissionDenied ||
         c == absl::StatusCode::kUnimplemented;
}

}  // namespace

struct Client::Impl {
  explicit Impl(ClientOptions o)
      : opts(std::move(o)),
        clock(opts.clock ? opts.clock : Clock::Real()),
        jitter_rng(std::random_device{}()),
        emulator(opts.emulation.uplink_mbps, opts.emulation.downlink_mbps,
                 opts.emulation.slowdown) {}

  ClientOptions opts;
  // Reconnect backoff, giving up and heartbeats wait on it (ClientOptions::clock); the
  // times a client measures and reports (training, transfers) stay on the steady clock.
  const std::shared_ptr<Clock> clock;
  std::mt19937_64 jitter_rng;
  std::atomic<bool> stop{false};
  std::atomic<int> tasks_done{0};
  // An edge aggregator whose clients now hold more examples than it declared at Join:
  // the total to declare when it joins again (0: none).
  std::atomic<int64_t> grown_examples{0};
  DeviceEmulator emulator;
  // What State() reports besides the counters above (bytes: the emulator's buckets).
  mutable std::mutex state_mu;
  ClientState state;  // guarded by state_mu
  template <typename F>
  void UpdateState(F f) {
    std::lock_guard<std::mutex> l(state_mu);
    f(state);
  }
  void RecordTraining(const TrainStats& t) {
    UpdateState([&](ClientState& st) {
      st.train_seconds = t.seconds;
      st.train_loss = t.loss;
    });
  }

  Mutex mu;  // guards ctx and the sleep below
  CondVar cv;
  grpc::ClientContext* ctx = nullptr;

  // Model state kept across tasks.
  std::unique_ptr<Model> model;
  std::string model_key;  // name + TorchScript digest the model was built from
  // The model's personal tensors (ModelDescription.personal) as this client last trained
  // them; empty until its first task. They never leave the client.
  ParameterSet personal;
  std::string loss_digest;  // the TorchScript loss `model` holds (TrainConfig.loss_digest)
  // The frozen tensors of a LoRA model (Task.base_digest), fetched once.
  std::string base_digest;
  ParameterSet base;

  // Outcome of one connection.
  enum class End { kRunEnded, kRetry, kFatal, kCrashed, kStopped };

  Status Run();
  // One connection: Join, then the control stream's tasks until it ends.
  End Session(bool* joined, Status* why);
  // The control stream of a session: writes from any thread (heartbeats, acks, tasks),
  // reads by the session's thread, and a message read on a task's behalf that belongs to
  // what comes after it.
  struct ControlStream {
    std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream;
    std::mutex write_mu;
    std::optional<v1::ServerMessage> pending;
    // True once a read failed: the server ended the stream, and Finish returns its
    // status (cancelling first would replace the server's reason by CANCELLED).
    bool server_ended = false;
    bool Write(const v1::ClientMessage& m) {
      std::lock_guard<std::mutex> l(write_mu);
      return stream->Write(m);
    }
    bool Read(v1::ServerMessage* m) {
      if (!pending) return !(server_ended = !stream->Read(m));
      *m = *std::move(pending);
      pending.reset();
      return true;
    }
  };
  // The Join this client sends: its name, device, codecs, declared examples, Peer address.
  v1::ClientMessage JoinMessage() const;
  // After the Welcome, with split learning's cut: auto: this device's profile for the
  // cut policy, sent on the stream. An error ends the session.
  Status SendProfile(v1::Coordinator::Stub* stub, const v1::Welcome& welcome, ControlStream& cs);
  // The session's task loop: each task to HandleTask, until the run ends, the stream
  // closes, a task crashes (test hook), or an edge must join again (*rejoin) because it
  // now holds more than the `declared` examples.
  End ServeTasks(v1::Coordinator::Stub* stub, const v1::Welcome& welcome, ControlStream& cs,
                 grpc::ClientContext& ctx, int64_t declared, bool* rejoin);
  // `next` reads the task's later control messages (secure aggregation).
  // Replaces the honest `delta` (trained from `global` with `o`) by the attack's update.
  Status Attack(const ParameterSet& global, const LocalTrainOptions& o, ParameterSet* delta);
  // What Join declares, and an edge claims at most: declared_examples (or the total an
  // edge's clients grew to since), else train.size.
  int64_t DeclaredExamples() const {
    if (opts.declared_examples <= 0) return opts.train.size;
    return std::max(opts.declared_examples, grown_examples.load());
  }
  // The task's model: its blob fetched and decoded (with the task's broadcast codec).
  StatusOr<ParameterSet> FetchModel(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                    const v1::Task& task);
  // Runs `task` with the handler of its kind (TaskHandlers below).
  Status HandleTask(v1::Coordinator::Stub* stub, const v1::Welcome& w, const v1::Task& task,
                    const std::function<void(const v1::TaskAck&)>& ack,
                    const NextMessage& next, bool* crashed);
  // What a task handler is given: the session's stub and welcome, the task, how to
  // acknowledge it, the control stream's next message (secure aggregation's stages) and
  // where to say that a test hook simulated a crash.
  struct TaskCall {
    v1::Coordinator::Stub* stub;
    const v1::Welcome& w;
    const v1::Task& task;
    const std::function<void(const v1::TaskAck&)>& ack;
    const NextMessage& next;
    bool* crashed;
    // Declines the task with `why` and returns it.
    Status Reject(const Status& why) const { return Decline(ack, task, why); }
    // Tells the server the task is taken.
    void Accept() const {
      v1::TaskAck a;
      a.set_task_id(task.task_id());
      a.set_accepted(true);
      ack(a);
    }
  };
  // One handler per task kind; HandleTask runs the first whose kind matches.
  struct TaskHandler {
    const char* kind;
    bool (*matches)(const ClientOptions& o, const v1::Task& t);
    Status (Impl::*run)(const TaskCall& c);
  };
  static const std::vector<TaskHandler>& TaskHandlers();
  // A task of an edge aggregator (ClientOptions::aggregate): every task it gets.
  Status HandleEdgeTask(const TaskCall& c);
  // A split-learning task: the client part trained against the server.
  Status HandleSplitTask(const TaskCall& c);
  // The final evaluation (Task.evaluate_only): the global model on the held-out data.
  Status HandleEvaluationTask(const TaskCall& c);
  // A whole-model federated task: train, then upload the update (masked under SecAgg+).
  Status HandleTrainingTask(const TaskCall& c);
  // The global model a task starts from, checked against the local data; the model's
  // frozen base fetched once. An error here declines the task.
  struct TaskModel {
    ModelSpec spec;
    std::string loss;
    ParameterSet global;
  };
  StatusOr<TaskModel> FetchTaskModel(const TaskCall& c);
  // Whole-model tasks: `model` built from `m.spec` and set to the global model (frozen
  // base joined, this client's personal layers written over it, a TorchScript loss
  // fetched once); `m.global` becomes that whole model. Returns the personal layers'
  // names; an error declines the task.
  StatusOr<std::vector<std::string>> SetTaskModel(const TaskCall& c, TaskModel& m);
  // Where this client keeps its personal layers ("" = in memory only), and the key that
  // ties them to a task's run and model.
  std::string PersonalFile() const {
    return opts.state_dir.empty() ? "" : opts.state_dir + "/personal.pb";
  }
  static std::string PersonalKey(const v1::Task& task) {
    return Sha256Hex(task.run_id() + "|" + task.model().SerializeAsString());
  }
  // Uploads `delta` (trained minus global) as the result of `task`.
  StatusOr<v1::UploadReply> UploadUpdate(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                         const v1::Task& task, const ParameterSet& delta,
                                         int64_t examples, double loss, double seconds,
                                         const v1::SplitStats* split,
                                         const v1::ClientEvaluation* evaluation = nullptr,
                                         const v1::GossipStats* gossip = nullptr);
  // The model a task or welcome describes (fetching a TorchScript archive once).
  StatusOr<ModelSpec> Spec(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                           const v1::ModelDescription& d);
  std::string script_digest;   // the archive held in script_bytes
  std::string script_bytes;
  // Gossip rounds: the Peer service (when opts.peer_listen is set), the address Join
  // announces, and the model this client holds across rounds (of run gossip_run).
  std::unique_ptr<PeerServer> peer;
  std::string peer_address;
  mutable std::mutex gossip_mu;  // guards gossip_model for GossipModel()
  ParameterSet gossip_model;
  std::string gossip_run;
  // (Re)builds the whole model when the task's description changed.
  Status BuildModel(const v1::Task& task, const ModelSpec& spec);
  // Federated evaluation: `model` as it is, on the held-out data, under `loss`.
  StatusOr<v1::ClientEvaluation> EvaluateHoldout(const std::string& loss);
  // A gossip task: train the model held, exchange it with the neighbours, average.
  Status HandleGossipTask(const TaskCall& c);
  // Sends `trained` to every neighbour of the gossip task while theirs arrive, until the
  // task's deadline; the models heard, and what the exchange measured in *report
  // (neighbours, heard, bytes each way, the uplink the sends used).
  std::map<std::string, ParameterSet> ExchangeModels(const TaskCall& c,
                                                     const ParameterSet& trained,
                                                     v1::GossipStats* report);
  // The update codec and its state (error-feedback residuals, one per tensor), kept
  // across rounds while the codec and the tensors it encodes stay the same.
  std::unique_ptr<Codec> update_codec;
  std::string update_codec_key;
  // Waits `seconds` on the clock, or until stopped.
  void Sleep(double seconds) {
    MutexLock l(&mu);
    const Clock::time_point until = clock->Now() + Seconds(seconds);
    while (!stop && clock->Now() < until) clock->WaitUntil(cv, mu, until);
  }
};

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  if (impl_->opts.attack == "label-flip") {
    for (auto& y : impl_->opts.train.labels) y = impl_->opts.train.num_classes - 1 - y;
  }
}
Client::~Client() = default;
Status Client::Run() { return impl_->Run(); }
int Client::tasks_completed() const { return impl_->tasks_done; }

ClientState Client::State() const {
  ClientState s;
  {
    std::lock_guard<std::mutex> l(impl_->state_mu);
    s = impl_->state;
  }
  s.tasks_done = impl_->tasks_done;
  s.bytes_sent = impl_->emulator.up.passed();
  s.bytes_received = impl_->emulator.down.passed();
  s.examples = impl_->opts.train.size;
  return s;
}
ParameterSet Client::GossipModel() const {
  std::lock_guard<std::mutex> l(impl_->gossip_mu);
  return impl_->gossip_model;
}

void Client::Stop() {
  MutexLock l(&impl_->mu);
  impl_->stop = true;
  if (impl_->ctx) impl_->ctx->TryCancel();
  impl_->cv.SignalAll();
  if (impl_->opts.task_slots) impl_->opts.task_slots->WakeAll();
}

Status Client::Impl::Run() {
  UseTorchThreads();  // clients of a simulation run on threads of their own
  if (!opts.attack.empty()) RETURN_IF_ERROR(AttackNames().Check(opts.attack));
  if (opts.tls_ca.empty() && !opts.insecure && !opts.channel) {
    return absl::FailedPreconditionError(
        "no CA to verify the server with (--ca); plaintext needs --insecure");
  }
  if (!opts.token.empty() && opts.tls_ca.empty()) {
    return absl::FailedPreconditionError("a bearer token is only sent over TLS (--ca)");
  }
  if (!opts.peer_listen.empty() && !peer) {
    const bool tls = !opts.tls_ca.empty();
    if (tls && opts.tls_cert.empty()) {
      return absl::FailedPreconditionError(
          "--peer-listen over TLS needs this client's certificate (--cert, --key): its "
          "neighbours verify it");
    }
    ASSIGN_OR_RETURN(peer, PeerServer::Start(opts.peer_listen, opts.tls_ca, opts.tls_cert,
                                             opts.tls_key));
    if (!opts.peer_advertise.empty()) {
      peer_address = opts.peer_advertise;
    } else {
      peer_address = opts.peer_listen.substr(0, opts.peer_listen.rfind(':')) + ":" +
                     std::to_string(peer->port());
    }
    spdlog::info("serving Peer on {} (gossip rounds)", peer_address);
  }
  double backoff = opts.initial_backoff_s;
  auto last_contact = clock->Now();
  while (!stop) {
    bool joined = false;
    Status why;
    End end = Session(&joined, &why);
    switch (end) {
      case End::kRunEnded:
        return absl::OkStatus();
      case End::kStopped:
        return absl::CancelledError("stopped");
      case End::kCrashed:
        return absl::AbortedError("simulated crash");
      case End::kFatal:
        spdlog::error("giving up: {}", why.ToString());  // a refusal retrying cannot change
        return why;
      case End::kRetry:
        break;
    }
    if (joined) {
      backoff = opts.initial_backoff_s;
      last_contact = clock->Now();
    }
    const double waited = std::chrono::duration<double>(clock->Now() - last_contact).count();
    if (waited > opts.give_up_after_s) {
      return absl::UnavailableError(absl::StrCat("server ", opts.server, " unreachable for ",
                                                 static_cast<int>(waited), "s: ", why.message()));
    }
    // Exponential backoff with jitter: sleep uniformly in [backoff/2, backoff*3/2).
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    const double delay = backoff * jitter(jitter_rng);
    spdlog::warn("{}; reconnecting in {:.1f}s", std::string(why.message()), delay);
    Sleep(delay);
    backoff = std::min(backoff * 2, opts.max_backoff_s);
  }
  return absl::CancelledError("stopped");
}

namespace {

// A session's heartbeats: on the process's shared Heartbeats thread when there is one
// (cleave simulate: thousands of clients must not each wake to poll), else on a thread
// of the session's own that waits on the client's clock between beats.
class SessionHeartbeat {
 public:
  SessionHeartbeat(std::shared_ptr<Heartbeats> shared, std::shared_ptr<Clock> clock,
                   std::chrono::milliseconds period, std::function<bool()> beat)
      : shared_(std::move(shared)), clock_(std::move(clock)) {
    if (shared_) {
      id_ = shared_->Add(period, std::move(beat));
      return;
    }
    thread_ = std::thread([this, period, beat = std::move(beat)] {
      MutexLock l(&mu_);
      while (!stop_) {
        mu_.Unlock();
        const bool sent = beat();
        mu_.Lock();
        if (!sent) break;
        const Clock::time_point next = clock_->Now() + period;
        while (!stop_ && clock_->Now() < next) clock_->WaitUntil(cv_, mu_, next);
      }
    });
  }
  // No beat starts after this; one in progress may still be writing (the caller cancels
  // the stream before Join if it must not wait for it).
  void RequestStop() {
    {
      MutexLock l(&mu_);
      stop_ = true;
    }
    cv_.SignalAll();
  }
  // Returns once no beat runs and none will.
  void Join() {
    RequestStop();
    if (thread_.joinable()) thread_.join();
    if (shared_ && id_ != 0) shared_->Remove(id_);
    id_ = 0;
  }
  ~SessionHeartbeat() { Join(); }

 private:
  const std::shared_ptr<Heartbeats> shared_;
  const std::shared_ptr<Clock> clock_;
  int64_t id_ = 0;  // with shared_: this session's beat there
  Mutex mu_;
  CondVar cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace

Client::Impl::End Client::Impl::Session(bool* joined, Status* why) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  auto channel = opts.channel ? opts.channel
                              : grpc::CreateCustomChannel(
                                    opts.server,
                                    ClientCredentials(opts.tls_ca, opts.tls_cert, opts.tls_key,
                                                      60, opts.token),
                                    args);
  auto stub = v1::Coordinator::NewStub(channel);

  grpc::ClientContext ctx;
  {
    MutexLock l(&mu);
    if (stop) return End::kStopped;
    this->ctx = &ctx;
  }
  ControlStream cs;
  cs.stream = stub->Control(&ctx);

  const v1::ClientMessage join = JoinMessage();
  End end = End::kRetry;
  bool rejoin = false;  // an edge leaves to join again with a larger declaration
  Status profile_error;  // this device could not be profiled for the cut policy
  std::optional<SessionHeartbeat> heartbeat;
  v1::ServerMessage msg;
  cs.server_ended = !(cs.Write(join) && cs.stream->Read(&msg));
  if (!cs.server_ended && msg.has_welcome()) {
    const v1::Welcome welcome = msg.welcome();
    *joined = true;
    spdlog::info("joined run {} as {}", welcome.run_id(), welcome.client_id());
    UpdateState([&](ClientState& st) {
      st.connected = true;
      st.run_id = welcome.run_id();
      st.client_id = welcome.client_id();
    });
    heartbeat.emplace(
        opts.heartbeats, clock,
        std::chrono::milliseconds(std::max(100, welcome.heartbeat_interval_ms())), [&cs] {
          v1::ClientMessage hb;
          hb.mutable_heartbeat()->set_unix_ms(
              std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count());
          return cs.Write(hb);
        });
    profile_error = SendProfile(stub.get(), welcome, cs);
    if (profile_error.ok()) {
      end = ServeTasks(stub.get(), welcome, cs, ctx, join.join().num_examples(), &rejoin);
    }
  }
  UpdateState([](ClientState& st) { st.connected = false; });
  if (heartbeat) heartbeat->RequestStop();
  if (end != End::kRunEnded && end != End::kCrashed && !cs.server_ended) ctx.TryCancel();
  if (heartbeat) heartbeat->Join();
  grpc::Status gs = cs.stream->Finish();
  {
    MutexLock l(&mu);
    this->ctx = nullptr;
  }
  if (end == End::kRunEnded || end == End::kCrashed) return end;
  if (stop) return End::kStopped;
  if (!profile_error.ok()) {
    *why = profile_error;
    return Fatal(why->code()) ? End::kFatal : End::kRetry;
  }
  if (rejoin) {
    *why = absl::UnavailableError(
        absl::StrCat("joining again to declare ", DeclaredExamples(), " examples"));
    return End::kRetry;
  }
  *why = gs.ok() ? absl::UnavailableError("the server closed the control stream")
                 : FromGrpc(gs, "control stream");
  if (!gs.ok() && Fatal(why->code())) return End::kFatal;
  return End::kRetry;
}

v1::ClientMessage Client::Impl::JoinMessage() const {
  v1::ClientMessage m;
  v1::Join* join = m.mutable_join();
  join->set_name(opts.name);
  *join->mutable_device() = LocalDevice();
  join->add_codecs("fp32");
  join->add_codecs("secagg");
  for (const auto& family : SupportedCodecFamilies()) join->add_codecs(family);
  join->set_num_examples(DeclaredExamples());
  join->set_protocol_version(1);
  join->set_peer_address(peer_address);
  return m;
}

Status Client::Impl::SendProfile(v1::Coordinator::Stub* stub, const v1::Welcome& welcome,
                                 ControlStream& cs) {
  if (welcome.profile_batch_size() <= 0) return absl::OkStatus();  // no cut: auto
  auto spec = Spec(stub, welcome, welcome.model());
  auto profile = spec.ok() ? ProfileDevice(stub, welcome, *spec, opts.train,
                                           opts.memory_limit_bytes, &emulator)
                           : StatusOr<v1::Profile>(spec.status());
  if (!profile.ok()) {
    // Without a profile the server never gives this client a task: end the session (for
    // good when the model cannot run on this device's data, else to retry).
    return Status(profile.status().code(),
                  absl::StrCat("cannot profile this device: ", profile.status().message()));
  }
  v1::ClientMessage m;
  *m.mutable_profile() = *profile;
  cs.Write(m);
  return absl::OkStatus();
}

Client::Impl::End Client::Impl::ServeTasks(v1::Coordinator::Stub* stub,
                                           const v1::Welcome& welcome, ControlStream& cs,
                                           grpc::ClientContext& ctx, int64_t declared,
                                           bool* rejoin) {
  auto ack = [&cs](const v1::TaskAck& a) {
    v1::ClientMessage m;
    *m.mutable_ack() = a;
    cs.Write(m);
  };
  v1::ServerMessage msg;
  while (cs.Read(&msg)) {
    if (msg.has_run_ended()) {
      spdlog::info("run {} ended: {}", msg.run_ended().run_id(), msg.run_ended().reason());
      return End::kRunEnded;
    }
    if (!msg.has_task()) continue;
    UpdateState([&](ClientState& st) { st.round = msg.task().round(); });
    bool crashed = false;
    const std::string task_id = msg.task().task_id();
    // Secure aggregation's stage messages of this task; a new task or RunEnded read here
    // is kept for this loop and ends the task.
    NextMessage next = [&](v1::ServerMessage* m) -> Status {
      if (!cs.stream->Read(m)) return absl::UnavailableError("the control stream closed");
      const std::string& about = m->has_secagg_neighbours() ? m->secagg_neighbours().task_id()
                                 : m->has_secagg_relay()    ? m->secagg_relay().task_id()
                                 : m->has_secagg_unmask()   ? m->secagg_unmask().task_id()
                                                            : std::string();
      if (about == task_id) return absl::OkStatus();
      if (m->has_task() || m->has_run_ended()) {
        cs.pending = *m;
        return absl::AbortedError("the server closed the round");
      }
      return absl::FailedPreconditionError("unexpected control message during the task");
    };
    Status s;
    auto run_task = [&] {
      s = HandleTask(stub, welcome, msg.task(), ack, next, &crashed);
      if (opts.task_slots) {
        // A virtual client of a simulation keeps no model between its tasks: only those
        // working hold training state (its personal layers and codec state stay).
        model.reset();
        loss_digest.clear();
      }
    };
    if (!opts.task_slots) {
      run_task();
    } else if (!opts.task_slots->Run(run_task, stop)) {
      return End::kRetry;  // stopped while waiting for a worker
    }
    if (crashed) {
      ctx.TryCancel();
      return End::kCrashed;
    }
    if (DeclaredExamples() > declared) {  // an edge's clients grew
      *rejoin = true;
      return End::kRetry;
    }
    if (!s.ok()) {
      UpdateState([](ClientState& st) { ++st.tasks_failed; });
      spdlog::warn("task {} failed: {}", msg.task().task_id(), s.ToString());
      // Tell the server at once, so that the round need not wait for its deadline (a
      // task already uploaded or failed there ignores this).
      v1::TaskAck failed;
      failed.set_task_id(msg.task().task_id());
      failed.set_accepted(false);
      failed.set_error(std::string(s.message()));
      ack(failed);
    }
  }
  return End::kRetry;
}

StatusOr<v1::UploadReply> Client::Impl::UploadUpdate(
    v1::Coordinator::Stub* stub, const v1::Welcome& w, const v1::Task& task,
    const ParameterSet& delta, int64_t examples, double loss, double seconds,
    const v1::SplitStats* split, const v1::ClientEvaluation* evaluation,
    const v1::GossipStats* gossip) {
  const std::string& spec = task.update_codec();
  const bool fp32 = spec.empty() || CodecFamily(spec) == "none";
  v1::UploadHeader h = TaskUploadHeader(w, task, examples, fp32 ? "fp32" : spec);
  h.set_train_loss(loss);
  h.set_train_seconds(seconds);
  if (split) *h.mutable_split() = *split;
  if (evaluation) *h.mutable_evaluation() = *evaluation;
  if (gossip) *h.mutable_gossip() = *gossip;
  if (fp32) {
    return UploadPayload(stub, h, delta.Encode(), 1 << 20, 600, &emulator);
  }
  std::string key = spec;
  for (const auto& t : delta.tensors()) absl::StrAppend(&key, "|", t.name);
  if (!update_codec || key != update_codec_key) {
    ASSIGN_OR_RETURN(update_codec, MakeCodec(spec, std::hash<std::string>{}(opts.name)));
    update_codec_key = std::move(key);
  }
  return UploadPayload(stub, h, EncodeTensors(*update_codec, delta), 1 << 20, 600, &emulator);
}

Status Client::Impl::Attack(const ParameterSet& global, const LocalTrainOptions& o,
                            ParameterSet* delta) {
  const std::string& a = opts.attack;
  if (a == "sign-flip") {
    for (auto& t : delta->mutable_tensors()) {
      for (float& v : t.values) v = -v;
    }
    return absl::OkStatus();
  }
  if (a == "gaussian") {
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> noise(0, 1);
    for (auto& t : delta->mutable_tensors()) {
      for (float& v : t.values) v = noise(rng);
    }
    return absl::OkStatus();
  }
  if (a == "ipm") {  // our own honest update is our estimate of the benign mean
    for (auto& t : delta->mutable_tensors()) {
      for (float& v : t.values) v = -3.0f * v;
    }
    return absl::OkStatus();
  }
  // alie: mu is our honest update; sigma per coordinate is estimated from the updates of
  // 4 shards of our data (each times 4, as if trained on all of it).
  constexpr int kShards = 4;
  std::vector<std::vector<int64_t>> shards(kShards);
  for (int64_t i = 0; i < opts.train.size; ++i) shards[i % kShards].push_back(i);
  std::vector<ParameterSet> ds;
  for (const auto& idx : shards) {
    RETURN_IF_ERROR(model->SetParameters(global));
    RETURN_IF_ERROR(model->Train(opts.train.Subset(idx), o).status());
    ParameterSet d = Delta(model->Parameters(), global);
    for (auto& t : d.mutable_tensors()) {
      for (float& v : t.values) v *= kShards;
    }
    ds.push_back(std::move(d));
  }
  for (size_t i = 0; i < delta->size(); ++i) {
    auto& out = delta->mutable_tensors()[i].values;
    for (size_t j = 0; j < out.size(); ++j) {
      double mean = 0, sq = 0;
      for (const auto& d : ds) mean += d.tensors()[i].values[j];
      mean /= kShards;
      for (const auto& d : ds) {
        const double x = d.tensors()[i].values[j] - mean;
        sq += x * x;
      }
      out[j] = static_cast<float>(out[j] - 1.5 * std::sqrt(sq / (kShards - 1)));
    }
  }
  return absl::OkStatus();
}

StatusOr<ModelSpec> Client::Impl::Spec(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                      const v1::ModelDescription& d) {
  ModelSpec spec;
  spec.name = d.name();
  if (d.input_shape_size() > 0) spec.input_shape.assign(d.input_shape().begin(), d.input_shape().end());
  if (d.num_classes() > 0) spec.num_classes = d.num_classes();
  if (d.has_gpt()) {
    spec.gpt = {d.gpt().vocab(), d.gpt().context(), d.gpt().layers(), d.gpt().heads(),
                d.gpt().dim(), d.gpt().tie()};
  }
  if (d.lora().rank() > 0) {
    spec.lora = {d.lora().rank(), d.lora().alpha(),
                 std::vector<std::string>(d.lora().targets().begin(), d.lora().targets().end()),
                 d.lora().dropout()};
  }
  if (spec.name == "torchscript") {
    if (script_digest != d.torchscript_digest()) {
      ASSIGN_OR_RETURN(script_bytes, FetchBlob(stub, w.client_id(), w.session_token(),
                                               d.torchscript_digest(), 600, &emulator));
      script_digest = d.torchscript_digest();
    }
    spec.torchscript = script_bytes;
  }
  return spec;
}

StatusOr<ParameterSet> Client::Impl::FetchModel(v1::Coordinator::Stub* stub,
                                                const v1::Welcome& w, const v1::Task& task) {
  ASSIGN_OR_RETURN(std::string blob, FetchBlob(stub, w.client_id(), w.session_token(),
                                               task.model_digest(), 600, &emulator));
  return task.model_codec().empty()
             ? ParameterSet::Decode(blob)
             : DecodeCompressedSet(blob, task.model_codec(), int64_t{1} << 31);
}

Status Client::Impl::HandleEdgeTask(const TaskCall& c) {
  v1::Coordinator::Stub* stub = c.stub;
  const v1::Welcome& w = c.w;
  const v1::Task& task = c.task;
  const NextMessage& next = c.next;
  if (task.has_split() || task.has_dp() || task.evaluate_only() ||
      !task.base_digest().empty() || task.model().personal_size() > 0) {
    return c.Reject(absl::FailedPreconditionError(
        "an edge aggregator takes whole-model federated tasks only (no split learning, "
        "distributed DP, evaluation, personal or frozen tensors)"));
  }
  auto global = FetchModel(stub, w, task);
  if (!global.ok()) return c.Reject(global.status());
  c.Accept();
  // Secure aggregation upstream: this edge is one masked input among its level's, with
  // its keys agreed before its own round runs, as a client's are before it trains.
  std::optional<SecAggClient> secagg;
  if (task.has_secagg()) {
    ASSIGN_OR_RETURN(secagg, SecAggClient::Prepare(stub, w, task, next));
  }
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(ClientOptions::Aggregate r, opts.aggregate(task, *global));
  const int64_t cap = DeclaredExamples();
  if (r.examples > cap) {
    // More clients joined below since this edge joined upstream: its Join count bounds
    // what it may claim this round; then it joins again declaring the new total.
    spdlog::warn("round {}: {} examples aggregated, {} declared upstream: claiming {}, then "
                 "joining again to declare {}",
                 task.round(), r.examples, cap, cap, r.examples);
    grown_examples = r.examples;
    r.examples = cap;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  v1::UploadReply reply;
  if (secagg) {
    ASSIGN_OR_RETURN(reply, secagg->Submit(stub, w, task, r.delta, r.examples, r.loss, seconds,
                                           &emulator, next));
  } else {
    ASSIGN_OR_RETURN(reply,
                     UploadUpdate(stub, w, task, r.delta, r.examples, r.loss, seconds, nullptr));
  }
  ++tasks_done;
  spdlog::info("round {}: edge round of {} examples in {:.1f}s (loss {:.4f}), partial mean "
               "uploaded{}{}",
               task.round(), r.examples, seconds, r.loss, secagg ? " masked" : "",
               reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

Status Client::Impl::BuildModel(const v1::Task& task, const ModelSpec& spec) {
  const std::string key = task.model().DebugString();
  if (model && key == model_key) return absl::OkStatus();
  ASSIGN_OR_RETURN(model, Model::Create(spec));
  // Personal layers of another description do not fit (a model dropped after its last
  // task, with task slots, is rebuilt to the same one).
  if (key != model_key) personal = ParameterSet();
  model_key = key;
  loss_digest.clear();
  return absl::OkStatus();
}

StatusOr<v1::ClientEvaluation> Client::Impl::EvaluateHoldout(const std::string& loss) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(EvalStats e, model->Evaluate(opts.holdout, kEvalBatch, loss));
  v1::ClientEvaluation evaluation;
  evaluation.set_examples(e.examples);
  evaluation.set_accuracy(e.accuracy);
  evaluation.set_loss(e.loss);
  for (const auto& [k, v] : e.metrics) (*evaluation.mutable_metrics())[k] = v;
  evaluation.set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return evaluation;
}

namespace {

// Gossip's average: x = w_self x_self + sum_j w_j x_j over the neighbours heard from (a
// missing neighbour's weight is kept by self), and in *disagreement the sum over them of
// ||x_self - x_j||^2.
ParameterSet MixWithNeighbours(const v1::GossipTask& g, const ParameterSet& trained,
                               const std::map<std::string, ParameterSet>& theirs,
                               double* disagreement) {
  double self_weight = g.self_weight();
  for (const auto& n : g.neighbours()) {
    if (!theirs.count(n.name())) self_weight += n.weight();
  }
  ParameterSet mixed = trained;
  for (size_t i = 0; i < mixed.size(); ++i) {
    auto& x = mixed.mutable_tensors()[i].values;
    for (float& v : x) v = static_cast<float>(self_weight * v);
    for (const auto& n : g.neighbours()) {
      auto it = theirs.find(n.name());
      if (it == theirs.end()) continue;
      const auto& y = it->second.tensors()[i].values;
      const auto& mine = trained.tensors()[i].values;
      for (size_t j = 0; j < x.size(); ++j) {
        x[j] += static_cast<float>(n.weight() * y[j]);
        const double d = static_cast<double>(mine[j]) - y[j];
        *disagreement += d * d;
      }
    }
  }
  return mixed;
}

}  // namespace

std::map<std::string, ParameterSet> Client::Impl::ExchangeModels(const TaskCall& c,
                                                                 const ParameterSet& trained,
                                                                 v1::GossipStats* report) {
  const v1::Task& task = c.task;
  const v1::GossipTask& g = task.gossip();
  const std::string bytes = trained.Encode();
  const double timeout_s = std::max(
      1.0, (task.deadline_unix_ms() -
            std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::system_clock::now().time_since_epoch()).count()) / 1000.0);
  const std::string& self = c.w.name();  // what the neighbours were told to expect
  std::vector<std::thread> senders;
  std::vector<Status> sent(g.neighbours_size());
  std::vector<SendSpan> spans(g.neighbours_size());
  for (int i = 0; i < g.neighbours_size(); ++i) {
    senders.emplace_back([&, i] {
      const auto& n = g.neighbours(i);
      sent[i] = SendModel(n.address(), n.name(), task.run_id(), task.round(), self, n.token(),
                          bytes, opts.tls_ca, opts.tls_cert, opts.tls_key, timeout_s, &emulator,
                          &spans[i]);
    });
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::map<std::string, ParameterSet> theirs = peer->Collect(task.round(), deadline);
  const int64_t received = peer->bytes_received();
  for (auto& t : senders) t.join();
  report->set_neighbours(g.neighbours_size());
  std::vector<SendSpan> went;
  for (int i = 0; i < g.neighbours_size(); ++i) {
    if (sent[i].ok()) {
      report->set_bytes_sent(report->bytes_sent() + static_cast<int64_t>(bytes.size()));
      went.push_back(spans[i]);
    } else {
      spdlog::warn("round {}: model not sent to {}: {}", task.round(), g.neighbours(i).name(),
                   sent[i].ToString());
    }
  }
  report->set_uplink_mbps(UplinkMbps(report->bytes_sent(), went));
  report->set_heard(static_cast<int32_t>(theirs.size()));
  report->set_bytes_received(received);
  return theirs;
}

Status Client::Impl::HandleGossipTask(const TaskCall& c) {
  v1::Coordinator::Stub* stub = c.stub;
  const v1::Welcome& w = c.w;
  const v1::Task& task = c.task;
  if (!peer) {
    return c.Reject(absl::FailedPreconditionError(
        "a gossip task, but this client serves no Peer address (--peer-listen)"));
  }
  auto spec = Spec(stub, w, task.model());
  if (!spec.ok()) return c.Reject(spec.status());
  const std::string loss = task.train().loss().empty() ? "cross_entropy" : task.train().loss();
  if (Status s = CheckDataFitsModel(opts.train, *spec, loss, "local data"); !s.ok()) return c.Reject(s);
  if (Status s = BuildModel(task, *spec); !s.ok()) return c.Reject(s);
  // The model this client holds; the run's initial model until it holds one (the only
  // model it ever fetches from the server).
  ParameterSet held;
  {
    std::lock_guard<std::mutex> l(gossip_mu);
    if (gossip_run == task.run_id()) held = gossip_model;
  }
  if (held.size() == 0) {
    auto initial = FetchModel(stub, w, task);
    if (!initial.ok()) return c.Reject(initial.status());
    held = *std::move(initial);
  }
  if (Status s = model->SetParameters(held); !s.ok()) return c.Reject(s);
  const v1::GossipTask& g = task.gossip();
  std::map<std::string, std::string> tokens;
  for (const auto& n : g.neighbours()) tokens[n.name()] = n.token();
  peer->Expect(task.run_id(), task.round(), tokens, held);
  c.Accept();
  // Federated evaluation: the model this client holds, on its held-out data.
  std::optional<v1::ClientEvaluation> evaluation;
  if (opts.holdout.size > 0) {
    ASSIGN_OR_RETURN(evaluation, EvaluateHoldout(loss));
  }
  LocalTrainOptions o = TrainOptions(task.train());
  o.cancel = &stop;
  o.seed = BatchSeed(task, w, opts.name);
  ASSIGN_OR_RETURN(TrainStats stats, model->Train(opts.train, o));
  emulator.Compute(stats.seconds);
  stats.seconds *= emulator.slowdown;
  RecordTraining(stats);
  const ParameterSet trained = model->Parameters();

  v1::GossipStats report;
  const std::map<std::string, ParameterSet> theirs = ExchangeModels(c, trained, &report);
  UpdateState([&](ClientState& st) { st.gossip_uplink_mbps = report.uplink_mbps(); });
  double disagreement = 0;
  ParameterSet mixed = MixWithNeighbours(g, trained, theirs, &disagreement);
  report.set_disagreement(theirs.empty() ? 0 : disagreement / theirs.size());
  {
    std::lock_guard<std::mutex> l(gossip_mu);
    gossip_model = std::move(mixed);
    gossip_run = task.run_id();
  }
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   UploadUpdate(stub, w, task, ParameterSet(), stats.examples, stats.loss,
                                stats.seconds, nullptr, evaluation ? &*evaluation : nullptr,
                                &report));
  ++tasks_done;
  spdlog::info("round {}: trained {} examples (loss {:.4f}), averaged with {} of {} neighbours "
               "(disagreement {:.3g}){}",
               task.round(), stats.examples, stats.loss, theirs.size(), g.neighbours_size(),
               report.disagreement(), reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

const std::vector<Client::Impl::TaskHandler>& Client::Impl::TaskHandlers() {
  static const std::vector<TaskHandler> handlers = {
      {"edge", [](const ClientOptions& o, const v1::Task&) { return static_cast<bool>(o.aggregate); },
       &Impl::HandleEdgeTask},
      {"gossip", [](const ClientOptions&, const v1::Task& t) { return t.has_gossip(); },
       &Impl::HandleGossipTask},
      {"split", [](const ClientOptions&, const v1::Task& t) { return t.has_split(); },
       &Impl::HandleSplitTask},
      {"evaluation", [](const ClientOptions&, const v1::Task& t) { return t.evaluate_only(); },
       &Impl::HandleEvaluationTask},
      {"training", [](const ClientOptions&, const v1::Task&) { return true; },
       &Impl::HandleTrainingTask},
  };
  return handlers;
}

Status Client::Impl::HandleTask(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                const v1::Task& task,
                                const std::function<void(const v1::TaskAck&)>& ack,
                                const NextMessage& next, bool* crashed) {
  const TaskCall call{stub, w, task, ack, next, crashed};
  for (const TaskHandler& h : TaskHandlers()) {
    if (h.matches(opts, task)) return (this->*h.run)(call);
  }
  return call.Reject(absl::InternalError("no handler for the task"));
}

StatusOr<Client::Impl::TaskModel> Client::Impl::FetchTaskModel(const TaskCall& c) {
  TaskModel m;
  ASSIGN_OR_RETURN(m.spec, Spec(c.stub, c.w, c.task.model()));
  m.loss = c.task.train().loss().empty() ? "cross_entropy" : c.task.train().loss();
  RETURN_IF_ERROR(CheckDataFitsModel(opts.train, m.spec, m.loss, "local data"));
  ASSIGN_OR_RETURN(m.global, FetchModel(c.stub, c.w, c.task));
  // A model with a frozen base (LoRA): the blob with it, fetched once.
  if (!c.task.base_digest().empty() && base_digest != c.task.base_digest()) {
    ASSIGN_OR_RETURN(std::string bytes, FetchBlob(c.stub, c.w.client_id(), c.w.session_token(),
                                                  c.task.base_digest(), 600, &emulator));
    ASSIGN_OR_RETURN(base, ParameterSet::Decode(bytes));
    base_digest = c.task.base_digest();
  }
  return m;
}

Status Client::Impl::HandleSplitTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  auto m = FetchTaskModel(c);
  if (!m.ok()) return c.Reject(m.status());
  c.Accept();
  SplitTaskOptions so;
  so.model = m->spec;
  so.seed = BatchSeed(task, c.w, opts.name);
  so.emulator = &emulator;
  so.cancel = &stop;
  if (!task.base_digest().empty()) so.base = &base;
  if (opts.crash_after_split_step) {
    const int64_t round = task.round();
    so.crash_after_step = [this, round](int64_t step) {
      return opts.crash_after_split_step(round, step);
    };
  }
  auto r = RunSplitTask(c.stub, c.w, task, m->global, opts.train, so);
  if (!r.ok() && r.status().code() == absl::StatusCode::kAborted && opts.crash_after_split_step) {
    *c.crashed = true;
    return r.status();
  }
  if (!r.ok()) return r.status();
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   UploadUpdate(c.stub, c.w, task, Delta(r->trained, m->global), r->examples,
                                r->loss, r->stats.wall_s() * r->stats.steps(), &r->stats));
  ++tasks_done;
  spdlog::info("round {}: split task at cut {} done: {} steps, {:.1f} ms/step (client {:.1f}, "
               "transfer {:.1f}, server {:.1f}), loss {:.4f}{}",
               task.round(), task.split().cut(), r->stats.steps(), 1e3 * r->stats.wall_s(),
               1e3 * r->stats.client_compute_s(), 1e3 * r->stats.transfer_s(),
               1e3 * r->stats.server_compute_s(), r->loss, reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

StatusOr<std::vector<std::string>> Client::Impl::SetTaskModel(const TaskCall& c, TaskModel& m) {
  const v1::Task& task = c.task;
  ParameterSet& global = m.global;
  RETURN_IF_ERROR(BuildModel(task, m.spec));
  // A model with a frozen base: the blob holds the rest; put them together in the
  // model's order.
  if (!task.base_digest().empty()) {
    ParameterSet whole = model->Parameters();
    if (base.size() + global.size() != whole.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model's base (", base.size(), " tensors) and its blob (", global.size(),
          ") do not make up the model (", whole.size(), ")"));
    }
    RETURN_IF_ERROR(Overwrite(base, &whole));
    RETURN_IF_ERROR(Overwrite(global, &whole));
    global = std::move(whole);
  }
  if (m.loss == "torchscript" && loss_digest != task.train().loss_digest()) {
    ASSIGN_OR_RETURN(std::string archive,
                     FetchBlob(c.stub, c.w.client_id(), c.w.session_token(),
                               task.train().loss_digest(), 600, &emulator));
    RETURN_IF_ERROR(model->SetTorchScriptLoss(archive));
    loss_digest = task.train().loss_digest();
  }
  // Personal layers: this client's own values replace the global model's (the server's
  // initial values, until the client has trained them).
  std::vector<std::string> personal_names(task.model().personal().begin(),
                                          task.model().personal().end());
  for (const std::string& n : personal_names) {
    if (global.Find(n) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("personal tensor '", Printable(n), "' is not in the model"));
    }
  }
  if (personal.size() == 0 && !personal_names.empty() && !PersonalFile().empty()) {
    personal = LoadPersonal(PersonalFile(), PersonalKey(task), personal_names, global);
  }
  if (personal.size() > 0) RETURN_IF_ERROR(Overwrite(personal, &global));
  RETURN_IF_ERROR(model->SetParameters(global));
  return personal_names;
}

Status Client::Impl::HandleEvaluationTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  auto m = FetchTaskModel(c);
  if (!m.ok()) return c.Reject(m.status());
  if (auto set = SetTaskModel(c, *m); !set.ok()) return c.Reject(set.status());
  if (opts.holdout.size == 0) {
    return c.Reject(absl::FailedPreconditionError("no held-out data to evaluate on (--holdout)"));
  }
  c.Accept();
  // No training: an empty update that carries the evaluation.
  ASSIGN_OR_RETURN(const v1::ClientEvaluation evaluation, EvaluateHoldout(m->loss));
  ASSIGN_OR_RETURN(v1::UploadReply reply, UploadUpdate(c.stub, c.w, task, ParameterSet(),
                                                       opts.train.size, 0, 0, nullptr, &evaluation));
  ++tasks_done;
  spdlog::info("round {}'s model: {:.4f} accurate on {} held-out examples (final evaluation{})",
               task.round(), evaluation.accuracy(), evaluation.examples(),
               reply.duplicate() ? ", duplicate" : "");
  return absl::OkStatus();
}

Status Client::Impl::HandleTrainingTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  auto m = FetchTaskModel(c);
  if (!m.ok()) return c.Reject(m.status());
  auto personal_names = SetTaskModel(c, *m);
  if (!personal_names.ok()) return c.Reject(personal_names.status());
  const ParameterSet& global = m->global;
  c.Accept();
  // Federated evaluation: the global model on the held-out data, before training.
  std::optional<v1::ClientEvaluation> evaluation;
  if (opts.holdout.size > 0 && !task.has_secagg()) {
    ASSIGN_OR_RETURN(evaluation, EvaluateHoldout(m->loss));
  }
  std::optional<SecAggClient> secagg;
  if (task.has_secagg()) {
    ASSIGN_OR_RETURN(secagg, SecAggClient::Prepare(c.stub, c.w, task, c.next));
  }

  LocalTrainOptions o = TrainOptions(task.train());
  o.cancel = &stop;  // Stop() (e.g. SIGTERM) does not wait for the local epochs to end
  o.seed = BatchSeed(task, c.w, opts.name);
  ASSIGN_OR_RETURN(TrainStats stats, model->Train(opts.train, o));
  // An emulated slower device (--emulate-slowdown) takes that much longer to train; split
  // tasks idle after each step instead (split_client.cc).
  emulator.Compute(stats.seconds);
  stats.seconds *= emulator.slowdown;
  RecordTraining(stats);
  if (opts.crash_after_training && opts.crash_after_training(task.round())) {
    *c.crashed = true;
    return absl::AbortedError("simulated crash");
  }
  ParameterSet trained = model->Parameters();
  if (!personal_names->empty()) {
    personal = Only(trained, *personal_names);
    if (!PersonalFile().empty()) {
      const std::string bytes = PersonalKey(task) + "\n" + personal.Encode();
      if (Status s = WriteFileAtomic(PersonalFile(), bytes); !s.ok()) {
        spdlog::warn("personal layers not saved: {}", s.ToString());
      }
    }
  }
  ParameterSet delta = Delta(std::move(trained), global);
  if (!opts.attack.empty() && opts.attack != "label-flip") {
    RETURN_IF_ERROR(Attack(global, o, &delta));
  }
  if (!personal_names->empty()) delta = Without(delta, *personal_names);  // stays here
  if (const auto frozen = model->FrozenTensors(); !frozen.empty()) {
    delta = Without(delta, frozen);  // never trained: not part of an update
  }
  v1::UploadReply reply;
  if (secagg) {
    if (task.has_dp()) AddDpNoise(task.dp(), &delta);
    ASSIGN_OR_RETURN(reply, secagg->Submit(c.stub, c.w, task, delta, stats.examples, stats.loss,
                                           stats.seconds, &emulator, c.next));
  } else {
    ASSIGN_OR_RETURN(reply, UploadUpdate(c.stub, c.w, task, delta, stats.examples, stats.loss,
                                         stats.seconds, nullptr,
                                         evaluation ? &*evaluation : nullptr));
  }
  ++tasks_done;
  spdlog::info("round {}: {}trained {} examples in {:.1f}s (loss {:.4f}), update uploaded{}",
               task.round(),
               evaluation ? absl::StrFormat("global model %.4f accurate on %d held-out examples; ",
                                            evaluation->accuracy(), evaluation->examples())
                          : "",
               stats.examples, stats.seconds, stats.loss, reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

}  // namespace cleave
