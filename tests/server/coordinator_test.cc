// The coordinator without sockets: hand-driven clients over the in-memory transport
// (fake_transport.h), on a fake clock.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "tests/server/fake_transport.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

using testing::FakeClient;

struct CoordinatorRun {
  std::shared_ptr<FakeClock> clock = std::make_shared<FakeClock>();
  std::unique_ptr<Coordinator> c;
  std::thread thread;
  Status init;  // of Coordinator::Init
  Status status;  // of Coordinator::Run

  explicit CoordinatorRun(const std::string& yaml) {
    ServerOptions o;
    o.config = TestConfig(yaml);
    o.insecure = true;
    o.in_process_only = true;
    o.evaluate = false;  // no test data: the coordinator holds none
    o.clock = clock;
    c = std::make_unique<Coordinator>(std::move(o));
    init = c->Init();
    c->SetMaxSessions(100);
  }
  void Start() {
    thread = std::thread([this] { status = c->Run(); });
  }
  ~CoordinatorRun() {
    c->Stop();
    if (thread.joinable()) thread.join();
  }
};

const std::string kJob =
    "run: {rounds: 1}\n"
    "model: {name: mlp, input: [4], classes: 2}\n"
    "data: {test: \"\"}\n"
    "clients: {min: 2, round_deadline_s: 30}\n";

ParameterSet Filled(const ParameterSet& layout, float v) {
  ParameterSet d = layout.ZerosLike();
  for (auto& t : d.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), v);
  return d;
}

// A coordinator (on a fake clock, no socket) with two joined fake clients holding
// `examples_a` and `examples_b` examples, running, each with its round-1 task.
class CoordinatorTest : public ::testing::Test {
 protected:
  void StartTwo(int64_t examples_a, int64_t examples_b, const std::string& extra_yaml = "") {
    run_ = std::make_unique<CoordinatorRun>(kJob + extra_yaml);
    ASSERT_TRUE(run_->init.ok()) << run_->init;
    initial_ = run_->c->GlobalModel();
    a_ = std::make_unique<FakeClient>(run_->c.get(), "a", examples_a);
    b_ = std::make_unique<FakeClient>(run_->c.get(), "b", examples_b);
    ASSERT_TRUE(a_->Join().ok());
    ASSERT_TRUE(b_->Join().ok());
    run_->Start();
    ta_ = a_->NextTask();
    tb_ = b_->NextTask();
    ASSERT_TRUE(ta_ && tb_);
  }
  // Waits for the run to end; false (with the test failed) unless it ended OK.
  bool Finish() {
    run_->thread.join();
    EXPECT_TRUE(run_->status.ok()) << run_->status;
    return run_->status.ok();
  }

  std::unique_ptr<CoordinatorRun> run_;
  ParameterSet initial_;
  std::unique_ptr<FakeClient> a_, b_;
  std::optional<v1::Task> ta_, tb_;
};

// Two clients' updates, weighted by their example counts, make exactly the FedAvg model.
TEST_F(CoordinatorTest, TwoFakeClientsMakeTheExactWeightedMean) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(1, 3));
  auto model = a_->Model(*ta_);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->Encode(), initial_.Encode()) << "the task's model is the initial one";
  ASSERT_TRUE(a_->Upload(*ta_, Filled(initial_, 1.0f).Encode()).ok());
  ASSERT_TRUE(b_->Upload(*tb_, Filled(initial_, -0.5f).Encode()).ok());
  ASSERT_TRUE(Finish());
  const ParameterSet after = run_->c->GlobalModel();
  const float mean = static_cast<float>((1 * 1.0 + 3 * -0.5) / 4);  // -0.125
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after.tensors()[i].values.size(); ++j) {
      EXPECT_FLOAT_EQ(after.tensors()[i].values[j], initial_.tensors()[i].values[j] + mean);
    }
  }
  ASSERT_EQ(run_->c->History().size(), 1u);
  EXPECT_EQ(run_->c->History()[0].participants, 2);
}

// Uploads that must not count are refused with their status and change nothing: an
// unknown client, a wrong token, a wrong size, a value that is not finite.
TEST_F(CoordinatorTest, BadUploadsAreRefusedAndChangeNothing) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(2, 2));
  const std::string good = Filled(initial_, 0.25f).Encode();
  auto header = [&](auto change) {
    v1::UploadHeader h = a_->Header(*ta_);
    h.set_total_size(static_cast<int64_t>(good.size()));
    change(h);
    return h;
  };
  const auto unknown = header([](v1::UploadHeader& h) { h.set_client_id("c999"); });
  EXPECT_EQ(a_->UploadWithHeader(unknown, good).code(), absl::StatusCode::kUnauthenticated);
  const auto token = header([](v1::UploadHeader& h) { h.set_session_token("not-the-token"); });
  EXPECT_EQ(a_->UploadWithHeader(token, good).code(), absl::StatusCode::kUnauthenticated);
  const auto size = header([](v1::UploadHeader& h) { h.set_total_size(h.total_size() + 4); });
  EXPECT_EQ(a_->UploadWithHeader(size, good + "abcd").code(), absl::StatusCode::kInvalidArgument);
  ParameterSet nan = Filled(initial_, 0.25f);
  nan.mutable_tensors()[0].values[0] = std::nanf("");
  EXPECT_EQ(a_->Upload(*ta_, nan.Encode()).code(), absl::StatusCode::kInvalidArgument);

  // The task still takes its good upload, and only the good ones count.
  ASSERT_TRUE(a_->Upload(*ta_, good).ok());
  ASSERT_TRUE(b_->Upload(*tb_, good).ok());
  ASSERT_TRUE(Finish());
  EXPECT_FLOAT_EQ(run_->c->GlobalModel().tensors()[0].values[0],
                  initial_.tensors()[0].values[0] + 0.25f);
}

// The round's deadline passes on the injected clock: the client that never uploads is
// counted as failed and the round commits with the quorum it has.
TEST_F(CoordinatorTest, TheDeadlinePassesOnTheInjectedClock) {
  ASSERT_NO_FATAL_FAILURE(StartTwo(2, 2, "server: {heartbeat_s: 1000, client_timeout_s: 5000}\n"));
  ASSERT_TRUE(a_->Upload(*ta_, Filled(initial_, 0.5f).Encode()).ok());
  EXPECT_EQ(run_->c->committed_round(), 0) << "b's result is still awaited";
  run_->clock->AdvanceSeconds(31);
  ASSERT_TRUE(Finish());
  ASSERT_EQ(run_->c->History().size(), 1u);
  EXPECT_EQ(run_->c->History()[0].participants, 1);
  EXPECT_EQ(run_->c->History()[0].failures, 1);
  EXPECT_FLOAT_EQ(run_->c->GlobalModel().tensors()[0].values[0],
                  initial_.tensors()[0].values[0] + 0.5f);
}

// A client whose control stream closed before the transport reported its end (its Send
// fails, no ControlDone yet) leaves the federation at once: the retried round does not
// pick it again (before, five instant retries of it ended the run) but waits for
// clients, and a client joining then completes the run.
TEST(CoordinatorSessionsTest, AClosedControlStreamEndsItsSessionAtOnce) {
  CoordinatorRun run(
      "run: {rounds: 1}\n"
      "model: {name: mlp, input: [4], classes: 2}\n"
      "data: {test: \"\"}\n"
      "clients: {min: 1, round_deadline_s: 30, join_timeout_s: 600}\n"
      "server: {heartbeat_s: 1000, client_timeout_s: 5000}\n");
  ASSERT_TRUE(run.init.ok()) << run.init;
  const ParameterSet initial = run.c->GlobalModel();
  FakeClient gone(run.c.get(), "gone", 2);
  ASSERT_TRUE(gone.Join().ok());
  gone.link().on_done = nullptr;  // the transport has not reported the end yet
  gone.link().Close(absl::UnavailableError("network"));
  run.Start();
  for (int i = 0; i < 1000 && !run.c->Observe(false).clients.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(run.c->Observe(false).clients.empty()) << "its session ended when its task could not be sent";
  FakeClient late(run.c.get(), "late", 2);
  ASSERT_TRUE(late.Join().ok()) << "the run is still waiting for clients";
  const auto task = late.NextTask();
  ASSERT_TRUE(task);
  ASSERT_TRUE(late.Upload(*task, Filled(initial, 0.25f).Encode()).ok());
  run.thread.join();
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_EQ(run.c->History().size(), 1u);
  EXPECT_EQ(run.c->History()[0].participants, 1);
  EXPECT_FLOAT_EQ(run.c->GlobalModel().tensors()[0].values[0],
                  initial.tensors()[0].values[0] + 0.25f);
}

}  // namespace
}  // namespace cleave
