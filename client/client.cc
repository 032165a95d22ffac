// Client: the session loop (join, heartbeats, the control stream, reconnects).
#include "client/client_impl.h"

#include "core/memory.h"
#include "privacy/split_guard.h"

namespace cleave {

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
    MutexLock l(&impl_->state_mu);
    s = impl_->state;
  }
  s.tasks_done = impl_->tasks_done;
  s.bytes_sent = impl_->emulator.up.passed();
  s.bytes_received = impl_->emulator.down.passed();
  s.examples = impl_->opts.train.size;
  return s;
}
ParameterSet Client::GossipModel() const {
  MutexLock l(&impl_->gossip_mu);
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
  if (const int64_t held = opts.count_resident ? ResidentBytes() : 0;
      opts.memory_limit_bytes > 0 && held > opts.memory_limit_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("this client already holds ", held >> 20,
                                                     " MiB (its libraries and data), over its --memory-limit-mb ",
                                                     opts.memory_limit_bytes >> 20));
  }
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
    spdlog::info("serving Peer on {} (gossip rounds, pipelines)", peer_address);
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
  join->set_num_examples(opts.count_from_fit ? 0 : DeclaredExamples());
  join->set_count_from_fit(opts.count_from_fit);
  join->set_protocol_version(1);
  join->set_peer_address(peer_address);
  join->set_edge(static_cast<bool>(opts.aggregate));
  return m;
}

Status Client::Impl::SendProfile(v1::Coordinator::Stub* stub, const v1::Welcome& welcome,
                                 ControlStream& cs) {
  if (welcome.profile_batch_size() <= 0) return absl::OkStatus();  // no cut: auto
  if (opts.external.fit || opts.external.split) {
    return absl::FailedPreconditionError(
        "this client trains in its own code, so it cannot profile the model's stages for an automatic cut: give "
        "the job a split.cut");
  }
  auto spec = models.Spec(stub, welcome, welcome.model());
  // What training may use (Profile.memory_limit_bytes): the limit less what this process
  // holds already (its libraries and data).
  const int64_t headroom =
      opts.memory_limit_bytes > 0
          ? std::max<int64_t>(1, opts.memory_limit_bytes - (opts.count_resident ? ResidentBytes() : 0))
          : 0;
  auto profile = spec.ok() ? ProfileDevice(stub, welcome, *spec, opts.train, headroom, &emulator)
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
        models.Drop();
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
      if (IsSplitGuardVerdict(s)) {  // logged once, at the verdict; the server's later tasks are declined with it
        spdlog::debug("task {} declined: {}", msg.task().task_id(), s.ToString());
      } else {
        spdlog::warn("task {} failed: {}", msg.task().task_id(), s.ToString());
      }
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

}  // namespace cleave
