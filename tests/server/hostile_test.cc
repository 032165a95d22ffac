// Hostile enrolled devices against a real server over gRPC (issue 13): each test plays
// one attack with a hand-driven TestPeer and then checks the federation's health: the
// attack is refused with a clear status, honest results still commit, and the model is
// exactly what the honest updates (with bounded weights) make of it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>
#include <unistd.h>

#include "cleave/v1/cleave.pb.h"
#include "client/transfer.h"
#include "core/files.h"
#include "server/server.h"
#include "tests/deadline.h"
#include "tests/server/running_server.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
using grpc::StatusCode;

class HostileTest : public RunningServerTest {
 protected:
  void StartServer(const std::string& yaml, const std::string& run_dir = "",
                   std::shared_ptr<Clock> clock = nullptr) {
    ServerOptions o;
    o.config = TestConfig(yaml);
    o.run_dir = run_dir;
    o.clock = std::move(clock);
    StartServerWith(std::move(o));
  }
  // Stops the server once its run thread is done or `timeout_s` passed.
  void WaitForRun(double timeout_s = 60) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    while (server_->committed_round() < 1 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    server_->Stop();
    runner_.join();
  }
};

// A delta with `layout`'s shapes, every value `v`.
ParameterSet Filled(const ParameterSet& layout, float v) {
  ParameterSet d = layout.ZerosLike();
  for (auto& t : d.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), v);
  return d;
}

Status Upload(TestPeer& peer, const v1::Task& task, int64_t num_examples, const ParameterSet& d) {
  return UploadPayload(peer.stub(), peer.Header(task, num_examples), d.Encode()).status();
}

// Every value of `model` equals `initial` + `shift`, to float precision.
void ExpectShiftedBy(const ParameterSet& initial, const ParameterSet& model, double shift) {
  ASSERT_TRUE(model.SameLayout(initial));
  for (size_t i = 0; i < model.size(); ++i) {
    const auto& a = initial.tensors()[i].values;
    const auto& b = model.tensors()[i].values;
    for (size_t j = 0; j < a.size(); ++j) {
      ASSERT_NEAR(b[j], a[j] + shift, 1e-5 + 1e-6 * std::abs(a[j])) << model.tensors()[i].name;
    }
  }
}

constexpr char kThreeClients[] = R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 3, quorum: 0.3, round_deadline_s: 60}
server: {client_timeout_s: 120}
)";

// Finite values of 1e36 used to overflow the weighted sum and commit an infinite model.
TEST_F(HostileTest, HugeValuesAreRefusedAndTheRoundCommitsWithoutThem) {
  StartServer(kThreeClients);
  const ParameterSet initial = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 100);
  auto evil = std::make_unique<TestPeer>(address_, 100);
  ASSERT_TRUE(a.Join("a") && b.Join("b") && evil->Join("evil"));
  auto ta = a.NextTask(), tb = b.NextTask(), te = evil->NextTask();
  ASSERT_TRUE(ta && tb && te);
  const Status refused = Upload(*evil, *te, 100, Filled(initial, 1e36f));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("beyond the bound"), std::string::npos) << refused;
  evil.reset();  // it leaves: its task fails and the round need not wait for its deadline
  ASSERT_TRUE(Upload(a, *ta, 100, Filled(initial, 0.01f)).ok());
  ASSERT_TRUE(Upload(b, *tb, 100, Filled(initial, 0.03f)).ok());
  WaitForRun();
  ASSERT_EQ(server_->committed_round(), 1);
  ExpectShiftedBy(initial, server_->GlobalModel(), 0.02);
  EXPECT_EQ(server_->History()[0].failures, 1);
}

// Bounded values can still overflow when the bound is raised to the float limit: the
// aggregate is then checked, and a non-finite one is neither committed nor checkpointed.
TEST_F(HostileTest, ANonFiniteAggregateIsNeverCommitted) {
  const fs::path dir = fs::temp_directory_path() / ("cleave-hostile-" + std::to_string(getpid()));
  fs::remove_all(dir);
  StartServer(R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 2, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120, max_update_abs: 3.0e38}
)",
              dir.string());
  const ParameterSet initial = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 100);
  ASSERT_TRUE(a.Join("a") && b.Join("b"));
  auto ta = a.NextTask(), tb = b.NextTask();
  ASSERT_TRUE(ta && tb);
  ASSERT_TRUE(Upload(a, *ta, 100, Filled(initial, 3e38f)).ok());
  ASSERT_TRUE(Upload(b, *tb, 100, Filled(initial, 3e38f)).ok());
  // The round fails and is retried: the retry's tasks say so (no wait on a clock).
  ASSERT_TRUE(a.NextTask() && b.NextTask());
  server_->Stop();
  runner_.join();
  EXPECT_EQ(server_->committed_round(), 0);
  ExpectShiftedBy(initial, server_->GlobalModel(), 0);
  EXPECT_FALSE(fs::exists(dir / "checkpoint.pb"));
  fs::remove_all(dir);
}

// A failed round leaves no trace in the strategy's state: with server momentum an
// overflowing round would otherwise leave an infinite velocity behind, and every later
// round would fail too. Here the retried round commits exactly FedAvgM's first step.
TEST_F(HostileTest, AFailedRoundLeavesTheServerOptimizerAsItWas) {
  StartServer(R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 2, quorum: 1.0, round_deadline_s: 60}
strategy: {name: fedavgm, server_lr: 1.0, server_momentum: 0.9}
server: {client_timeout_s: 120, max_update_abs: 3.0e38}
)");
  const ParameterSet initial = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 100);
  ASSERT_TRUE(a.Join("a") && b.Join("b"));
  auto ta = a.NextTask(), tb = b.NextTask();
  ASSERT_TRUE(ta && tb);
  ASSERT_TRUE(Upload(a, *ta, 100, Filled(initial, 3e38f)).ok());
  ASSERT_TRUE(Upload(b, *tb, 100, Filled(initial, 3e38f)).ok());
  // The overflowing round fails; its retry gets honest updates.
  ta = a.NextTask();
  tb = b.NextTask();
  ASSERT_TRUE(ta && tb);
  EXPECT_EQ(ta->round(), 1);
  ASSERT_TRUE(Upload(a, *ta, 100, Filled(initial, 0.01f)).ok());
  ASSERT_TRUE(Upload(b, *tb, 100, Filled(initial, 0.03f)).ok());
  ASSERT_TRUE(a.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  EXPECT_EQ(server_->committed_round(), 1);
  ExpectShiftedBy(initial, server_->GlobalModel(), 0.02);  // v = 0.9 * 0 + 0.02
}

// Options for a plaintext server on run directory `dir` (made empty).
ServerOptions OnRunDir(const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  ServerOptions o;
  o.config = TestConfig("model: {name: mlp}\n");
  o.insecure = true;
  o.evaluate = false;
  o.run_dir = dir.string();
  return o;
}

// A server restarted on a run directory whose checkpoint holds a non-finite model refuses
// to resume it, naming the file.
TEST(HostileCheckpointTest, APoisonedCheckpointIsRefused) {
  const fs::path dir =
      fs::temp_directory_path() / ("cleave-poisoned-" + std::to_string(getpid()));
  const ServerOptions o = OnRunDir(dir);
  {
    auto s = Server::Create(o);
    ASSERT_TRUE(s.ok()) << s.status();
    ParameterSet model = (*s)->GlobalModel();
    model.mutable_tensors()[1].values[3] = std::numeric_limits<float>::infinity();
    v1::Checkpoint ck;
    ck.set_run_id("r");
    ck.set_round(3);
    ck.set_global_model(model.Encode());
    ck.set_strategy_state(ParameterSet().Encode());
    ASSERT_TRUE(WriteFileAtomic((dir / "checkpoint.pb").string(), ck.SerializeAsString()).ok());
  }
  auto s = Server::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find("checkpoint.pb"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("non-finite"), std::string::npos) << s.status();
  fs::remove_all(dir);
}

// A checkpoint that is empty or a directory is an error that names it.
TEST(HostileCheckpointTest, AnEmptyOrDirectoryCheckpointIsNamed) {
  const fs::path dir = fs::temp_directory_path() / ("cleave-empty-ck-" + std::to_string(getpid()));
  const ServerOptions o = OnRunDir(dir);
  ASSERT_TRUE(WriteFileAtomic((dir / "checkpoint.pb").string(), "").ok());
  auto empty = Server::Create(o);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(empty.status().message().find("checkpoint.pb: empty file"), std::string::npos)
      << empty.status();
  fs::remove(dir / "checkpoint.pb");
  fs::create_directories(dir / "checkpoint.pb");
  auto directory = Server::Create(o);
  EXPECT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("checkpoint.pb is a directory"), std::string::npos)
      << directory.status();
  fs::remove_all(dir);
}

// A client that declares 10^12 examples (at Join and in its upload) weighs at most
// aggregation.max_weight_ratio (3) times the round's median declared count.
TEST_F(HostileTest, ASelfDeclaredWeightIsCappedAtAMultipleOfTheMedian) {
  StartServer(kThreeClients);
  const ParameterSet initial = server_->GlobalModel();
  const int64_t huge = 1000000000000;
  TestPeer a(address_, 100), b(address_, 200), evil(address_, huge);
  ASSERT_TRUE(a.Join("a") && b.Join("b") && evil.Join("evil"));
  auto ta = a.NextTask(), tb = b.NextTask(), te = evil.NextTask();
  ASSERT_TRUE(ta && tb && te);
  ASSERT_TRUE(Upload(a, *ta, 100, Filled(initial, 0.01f)).ok());
  ASSERT_TRUE(Upload(b, *tb, 200, Filled(initial, 0.04f)).ok());
  ASSERT_TRUE(Upload(evil, *te, huge, Filled(initial, 1.0f)).ok());
  WaitForRun();
  ASSERT_EQ(server_->committed_round(), 1);
  // Median of (100, 200, 10^12) is 200: evil weighs 600, not 10^12.
  ExpectShiftedBy(initial, server_->GlobalModel(), (100 * 0.01 + 200 * 0.04 + 600 * 1.0) / 900);
}

// A client that declares no count (Join.count_from_fit, Flower's way) reports one with each
// update; the cap bounds it as it bounds a declared count, and the count it reported
// joins the median from the next round on.
TEST_F(HostileTest, ACountReportedWithTheUpdateIsCappedAsADeclaredOne) {
  StartServer(R"(
run: {rounds: 2}
model: {name: mlp}
clients: {min: 3, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120, evaluate: false, final_evaluation: false}
)");
  const ParameterSet initial = server_->GlobalModel();
  const int64_t huge = 1000000000000;
  TestPeer a(address_, 100), b(address_, 200), evil(address_, 0);
  evil.count_from_fit = true;
  ASSERT_TRUE(a.Join("a") && b.Join("b") && evil.Join("evil"));
  for (int round = 1; round <= 2; ++round) {
    auto ta = a.NextTask(), tb = b.NextTask(), te = evil.NextTask();
    ASSERT_TRUE(ta && tb && te);
    ASSERT_TRUE(Upload(a, *ta, 100, Filled(initial, 0.0f)).ok());
    ASSERT_TRUE(Upload(b, *tb, 200, Filled(initial, 0.0f)).ok());
    // Past 2^40 is refused outright; below it, the count is taken and capped.
    EXPECT_EQ(Upload(evil, *te, int64_t{1} << 41, Filled(initial, 1.0f)).code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(Upload(evil, *te, huge, Filled(initial, 1.0f)).ok());
  }
  ASSERT_TRUE(a.WaitRunEnded());
  runner_.join();
  const auto h = server_->History();
  ASSERT_EQ(h.size(), 2u);
  // Round 1: the median of the known counts (100, 200) is 150, evil weighs 450; round 2:
  // the median of (100, 200, 10^12) is 200, evil weighs 600, not 10^12.
  EXPECT_EQ(h[0].examples, 100 + 200 + 450);
  EXPECT_EQ(h[1].examples, 100 + 200 + 600);
  // A count with count_from_fit, or none without it, is refused at Join (and under secure
  // aggregation count_from_fit is: SecureAggregationMessagesAreCheckedBeforeAnyState).
  TestPeer both(address_, 5), neither(address_, 0);
  both.count_from_fit = true;
  EXPECT_FALSE(both.Join("both"));
  EXPECT_FALSE(neither.Join("neither"));
}

TEST_F(HostileTest, EqualWeightingIgnoresDeclaredCounts) {
  StartServer(std::string(kThreeClients) + "aggregation: {weighting: equal}\n");
  const ParameterSet initial = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 200), c(address_, 5000);
  ASSERT_TRUE(a.Join("a") && b.Join("b") && c.Join("c"));
  auto ta = a.NextTask(), tb = b.NextTask(), tc = c.NextTask();
  ASSERT_TRUE(ta && tb && tc);
  ASSERT_TRUE(Upload(a, *ta, 100, Filled(initial, 0.01f)).ok());
  ASSERT_TRUE(Upload(b, *tb, 200, Filled(initial, 0.02f)).ok());
  v1::UploadHeader h = c.Header(*tc, 5000);
  h.set_codec("none");  // protocol.md: the same as fp32
  ASSERT_TRUE(UploadPayload(c.stub(), h, Filled(initial, 0.06f).Encode()).ok());
  WaitForRun();
  ASSERT_EQ(server_->committed_round(), 1);
  ExpectShiftedBy(initial, server_->GlobalModel(), 0.03);
}

// A participant opens two uploads for its own task, sends a header and a few bytes on
// each and goes silent, with one upload slot on the server. Its second upload replaces
// its first, the stalled one is cancelled after server.upload_idle_timeout_s, its task
// fails, and the honest upload queued behind it goes through: the round commits with it.
// Time is a FakeClock: the idle timeout passes when the test says so.
TEST_F(HostileTest, StalledUploadsCannotStarveHonestOnes) {
  auto clock = std::make_shared<FakeClock>();
  StartServer(R"(
run: {rounds: 2}
model: {name: mlp}
clients: {min: 2, quorum: 0.5, round_deadline_s: 100000}
server: {client_timeout_s: 100000, worker_threads: 1, upload_idle_timeout_s: 30}
)",
              "", clock);
  const ParameterSet initial = server_->GlobalModel();
  TestPeer staller(address_, 10), good(address_, 10);
  ASSERT_TRUE(staller.Join("staller") && good.Join("good"));
  auto ts = staller.NextTask(), tg = good.NextTask();
  ASSERT_TRUE(ts && tg);
  const std::string payload = Filled(initial, 0.5f).Encode();

  struct Stall {
    grpc::ClientContext ctx;
    v1::UploadReply reply;
    std::unique_ptr<grpc::ClientWriter<v1::UploadChunk>> w;
  };
  std::vector<std::unique_ptr<Stall>> stalls;
  for (int i = 0; i < 2; ++i) {
    auto st = std::make_unique<Stall>();
    st->ctx.set_deadline(testing::RpcDeadline(120));
    st->w = staller.stub()->Upload(&st->ctx, &st->reply);
    v1::UploadChunk m;
    *m.mutable_header() = staller.Header(*ts, 10);
    m.mutable_header()->set_total_size(static_cast<int64_t>(payload.size()));
    ASSERT_TRUE(st->w->Write(m));
    m.set_data(payload.substr(0, 1000));
    ASSERT_TRUE(st->w->Write(m));
    stalls.push_back(std::move(st));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // One upload in progress per client: the second replaced the first, and holds the slot.
  ASSERT_TRUE(WaitForUploads(1, 0));
  // The honest upload queues for the slot; 31 s of fake time later the stalled upload
  // is cancelled (time spent queued does not count) and the honest one goes through.
  Status honest;
  std::thread t([&] { honest = Upload(good, *tg, 10, Filled(initial, 0.02f)); });
  ASSERT_TRUE(WaitForUploads(2, 1));
  clock->AdvanceSeconds(31);
  t.join();
  EXPECT_TRUE(honest.ok()) << honest;
  for (auto& st : stalls) {
    const grpc::Status s = st->w->Finish();
    EXPECT_EQ(s.error_code(), StatusCode::CANCELLED) << s.error_message();
  }
  // The staller's task failed: it cannot come back with a third upload this round. (The
  // round may commit with the honest update meanwhile: then the late upload is cancelled.)
  const Status again = Upload(staller, *ts, 10, Filled(initial, 0.5f));
  EXPECT_TRUE(again.code() == absl::StatusCode::kFailedPrecondition || again.code() == absl::StatusCode::kCancelled)
      << again;
  WaitForRun();
  ASSERT_EQ(server_->committed_round(), 1);
  ExpectShiftedBy(initial, server_->GlobalModel(), 0.02);
  EXPECT_EQ(server_->History()[0].participants, 1);
  EXPECT_EQ(server_->History()[0].failures, 1);
}

// server.max_sessions bounds how many clients hold a session at once.
TEST_F(HostileTest, SessionsAreCapped) {
  StartServer("model: {name: mlp}\nclients: {min: 5}\nserver: {max_sessions: 2}\n");
  TestPeer a(address_, 10), b(address_, 10), c(address_, 10);
  ASSERT_TRUE(a.Join("a") && b.Join("b"));
  EXPECT_FALSE(c.Join("c"));
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Control(&ctx);
  v1::ClientMessage m;
  m.mutable_join()->set_num_examples(10);
  m.mutable_join()->set_protocol_version(1);
  stream->Write(m);
  v1::ServerMessage reply;
  EXPECT_FALSE(stream->Read(&reply));
  const grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("server.max_sessions"), std::string::npos);
}

// Names, ids and digests a client sends come back bounded and escaped.
TEST_F(HostileTest, AttackerStringsAreBoundedAndEscapedInErrors) {
  StartServer(kThreeClients);
  TestPeer a(address_, 10);
  EXPECT_FALSE(a.Join(std::string("bad\nname\0x", 10)));
  TestPeer b(address_, 10);
  ASSERT_TRUE(b.Join("b"));
  v1::FetchRequest req;
  req.set_client_id(b.welcome().client_id());
  req.set_session_token(b.welcome().session_token());
  req.set_digest("ab\n" + std::string(100000, 'f'));
  grpc::ClientContext ctx;
  auto reader = b.stub()->Fetch(&ctx, req);
  v1::Chunk chunk;
  while (reader->Read(&chunk)) {
  }
  const grpc::Status s = reader->Finish();
  ASSERT_EQ(s.error_code(), StatusCode::NOT_FOUND);
  EXPECT_LT(s.error_message().size(), 300u) << "the 100 KB digest is not echoed whole";
  EXPECT_EQ(s.error_message().find('\n'), std::string::npos);
  EXPECT_NE(s.error_message().find("\\x0a"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace cleave
