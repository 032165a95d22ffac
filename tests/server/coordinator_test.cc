// The coordinator without sockets: hand-driven clients over the in-memory transport
// (fake_transport.h), on a fake clock.
#include <gtest/gtest.h>

#include <cmath>
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

constexpr char kJob[] =
    "run: {rounds: 1}\n"
    "model: {name: mlp, input: [4], classes: 2}\n"
    "data: {test: \"\"}\n"
    "clients: {min: 2, round_deadline_s: 30}\n";

ParameterSet Filled(const ParameterSet& layout, float v) {
  ParameterSet d = layout.ZerosLike();
  for (auto& t : d.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), v);
  return d;
}

// Two clients' updates, weighted by their example counts, make exactly the FedAvg model.
TEST(CoordinatorTest, TwoFakeClientsMakeTheExactWeightedMean) {
  CoordinatorRun run(kJob);
  ASSERT_TRUE(run.init.ok()) << run.init;
  const ParameterSet initial = run.c->GlobalModel();
  FakeClient a(run.c.get(), "a", 1), b(run.c.get(), "b", 3);
  ASSERT_TRUE(a.Join().ok());
  ASSERT_TRUE(b.Join().ok());
  run.Start();
  auto ta = a.NextTask(), tb = b.NextTask();
  ASSERT_TRUE(ta && tb);
  auto model = a.Model(*ta);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->Encode(), initial.Encode()) << "the task's model is the initial one";
  ASSERT_TRUE(a.Upload(*ta, Filled(initial, 1.0f).Encode()).ok());
  ASSERT_TRUE(b.Upload(*tb, Filled(initial, -0.5f).Encode()).ok());
  run.thread.join();
  ASSERT_TRUE(run.status.ok()) << run.status;
  const ParameterSet after = run.c->GlobalModel();
  const float mean = static_cast<float>((1 * 1.0 + 3 * -0.5) / 4);  // -0.125
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after.tensors()[i].values.size(); ++j) {
      EXPECT_FLOAT_EQ(after.tensors()[i].values[j], initial.tensors()[i].values[j] + mean);
    }
  }
  ASSERT_EQ(run.c->History().size(), 1u);
  EXPECT_EQ(run.c->History()[0].participants, 2);
}

// Uploads that must not count are refused with their status and change nothing: an
// unknown client, a wrong token, a wrong size, a value that is not finite.
TEST(CoordinatorTest, BadUploadsAreRefusedAndChangeNothing) {
  CoordinatorRun run(kJob);
  ASSERT_TRUE(run.init.ok()) << run.init;
  const ParameterSet initial = run.c->GlobalModel();
  FakeClient a(run.c.get(), "a", 2), b(run.c.get(), "b", 2);
  ASSERT_TRUE(a.Join().ok());
  ASSERT_TRUE(b.Join().ok());
  run.Start();
  auto ta = a.NextTask(), tb = b.NextTask();
  ASSERT_TRUE(ta && tb);
  const std::string good = Filled(initial, 0.25f).Encode();

  v1::UploadHeader unknown = a.Header(*ta);
  unknown.set_client_id("c999");
  unknown.set_total_size(static_cast<int64_t>(good.size()));
  EXPECT_EQ(a.UploadWithHeader(unknown, good).code(), absl::StatusCode::kUnauthenticated);
  v1::UploadHeader token = a.Header(*ta);
  token.set_session_token("not-the-token");
  token.set_total_size(static_cast<int64_t>(good.size()));
  EXPECT_EQ(a.UploadWithHeader(token, good).code(), absl::StatusCode::kUnauthenticated);
  v1::UploadHeader size = a.Header(*ta);
  size.set_total_size(static_cast<int64_t>(good.size()) + 4);
  EXPECT_EQ(a.UploadWithHeader(size, good + "abcd").code(), absl::StatusCode::kInvalidArgument);
  ParameterSet nan = Filled(initial, 0.25f);
  nan.mutable_tensors()[0].values[0] = std::nanf("");
  EXPECT_EQ(a.Upload(*ta, nan.Encode()).code(), absl::StatusCode::kInvalidArgument);

  // The task still takes its good upload, and only the good ones count.
  ASSERT_TRUE(a.Upload(*ta, good).ok());
  ASSERT_TRUE(b.Upload(*tb, good).ok());
  run.thread.join();
  ASSERT_TRUE(run.status.ok()) << run.status;
  const ParameterSet after = run.c->GlobalModel();
  EXPECT_FLOAT_EQ(after.tensors()[0].values[0], initial.tensors()[0].values[0] + 0.25f);
}

// The round's deadline passes on the injected clock: the client that never uploads is
// counted as failed and the round commits with the quorum it has.
TEST(CoordinatorTest, TheDeadlinePassesOnTheInjectedClock) {
  CoordinatorRun run(std::string(kJob) + "server: {heartbeat_s: 1000, client_timeout_s: 5000}\n");
  ASSERT_TRUE(run.init.ok()) << run.init;
  const ParameterSet initial = run.c->GlobalModel();
  FakeClient a(run.c.get(), "a", 2), b(run.c.get(), "b", 2);
  ASSERT_TRUE(a.Join().ok());
  ASSERT_TRUE(b.Join().ok());
  run.Start();
  auto ta = a.NextTask(), tb = b.NextTask();
  ASSERT_TRUE(ta && tb);
  ASSERT_TRUE(a.Upload(*ta, Filled(initial, 0.5f).Encode()).ok());
  EXPECT_EQ(run.c->committed_round(), 0) << "b's result is still awaited";
  run.clock->AdvanceSeconds(31);
  run.thread.join();
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_EQ(run.c->History().size(), 1u);
  EXPECT_EQ(run.c->History()[0].participants, 1);
  EXPECT_EQ(run.c->History()[0].failures, 1);
  EXPECT_FLOAT_EQ(run.c->GlobalModel().tensors()[0].values[0],
                  initial.tensors()[0].values[0] + 0.5f);
}

}  // namespace
}  // namespace cleave
