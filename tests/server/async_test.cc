// scheduler.mode: async (FedBuff), driven by hand: each applied buffer is exactly the
// staleness-scaled mean of its updates, stale and future updates are refused with a
// clear status, a replay is not applied twice, and the model versions stale tasks may
// still fetch are kept (and no more).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/transfer.h"
#include "tests/deadline.h"
#include "tests/server/running_server.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

using grpc::StatusCode;

ParameterSet Delta(const ParameterSet& layout, float scale) {
  ParameterSet d = layout.ZerosLike();
  for (auto& t : d.mutable_tensors()) {
    for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = scale * ((i % 7) - 3.0f);
  }
  return d;
}

// a += f * d
void AddScaled(const ParameterSet& d, double f, ParameterSet* a) {
  for (size_t i = 0; i < a->size(); ++i) {
    auto& v = a->mutable_tensors()[i].values;
    for (size_t j = 0; j < v.size(); ++j) v[j] += static_cast<float>(f * d.tensors()[i].values[j]);
  }
}

class AsyncTest : public RunningServerTest {
 protected:
  // Waits (real time, up to a minute) until `version` is committed and its metrics are
  // in the history (the coordinator records them after it commits the model).
  ::testing::AssertionResult WaitForVersion(int64_t version) {
    for (int i = 0; i < 6000; ++i) {
      if (server_->committed_round() >= version && static_cast<int64_t>(server_->History().size()) >= version) {
        return ::testing::AssertionSuccess();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return ::testing::AssertionFailure() << "version " << server_->committed_round()
                                         << ", expected " << version;
  }
};

TEST_F(AsyncTest, BuffersApplyStalenessScaledUpdatesAndRefuseStaleOnes) {
  ServerOptions o;
  o.config = TestConfig(R"(
run: {rounds: 4}
model: {name: mlp}
clients: {min: 2, round_deadline_s: 60}
scheduler: {mode: async, buffer_size: 1, max_staleness: 1, staleness: polynomial,
            staleness_exponent: 1}
server: {client_timeout_s: 120}
)");
  StartServerWith(std::move(o));
  const ParameterSet g0 = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 300);
  ASSERT_TRUE(a.Join("a"));
  ASSERT_TRUE(b.Join("b"));
  auto ta1 = a.NextTask();
  auto tb1 = b.NextTask();
  ASSERT_TRUE(ta1 && tb1);
  EXPECT_EQ(ta1->round(), 1);
  EXPECT_EQ(tb1->round(), 1);

  auto upload = [](TestPeer& p, const v1::Task& t, int64_t n, const ParameterSet& d) {
    return UploadPayload(p.stub(), p.Header(t, n), d.Encode());
  };
  const ParameterSet da = Delta(g0, 0.01f), db = Delta(g0, -0.02f), d3 = Delta(g0, 0.03f),
                     d4 = Delta(g0, -0.01f);

  // An update against a future version names it and changes nothing.
  {
    v1::UploadHeader h = a.Header(*ta1, 100);
    h.set_round(2);
    auto r = UploadPayload(a.stub(), h, da.Encode());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("future"), std::string::npos) << r.status();
  }
  EXPECT_EQ(server_->committed_round(), 0);

  // Version 1: a's fresh update alone.
  ASSERT_TRUE(upload(a, *ta1, 100, da).ok());
  ASSERT_TRUE(WaitForVersion(1));
  // A replay of an applied update is acknowledged as a duplicate, not applied again.
  auto replay = upload(a, *ta1, 100, da);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_TRUE(replay->duplicate());
  auto ta2 = a.NextTask();  // a is idle again: it trains from version 1
  ASSERT_TRUE(ta2);
  EXPECT_EQ(ta2->round(), 2);
  EXPECT_NE(ta2->model_digest(), ta1->model_digest());

  // Version 2: b's update, trained from version 0, is one version stale: 1/(1+1).
  ASSERT_TRUE(upload(b, *tb1, 300, db).ok());
  ASSERT_TRUE(WaitForVersion(2));
  {  // a's task from version 1 cannot pass for a fresh one
    v1::UploadHeader h = a.Header(*ta2, 100);
    h.set_round(3);
    auto r = UploadPayload(a.stub(), h, da.Encode());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("was given in round 2"), std::string::npos) << r.status();
  }
  auto tb3 = b.NextTask();
  ASSERT_TRUE(tb3);
  EXPECT_EQ(tb3->round(), 3);

  // Version 3: b's fresh update. a's task (from version 1) is now two versions stale.
  ASSERT_TRUE(upload(b, *tb3, 300, d3).ok());
  ASSERT_TRUE(WaitForVersion(3));
  {
    auto r = upload(a, *ta2, 100, da);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("2 versions stale"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("max_staleness is 1"), std::string::npos) << r.status();
  }
  // The versions a stale task may still fetch are kept: 2 and 3, not 1.
  auto fetch = [&](const std::string& digest) {
    return FetchBlob(a.stub(), a.welcome().client_id(), a.welcome().session_token(), digest)
        .status()
        .code();
  };
  EXPECT_EQ(fetch(tb3->model_digest()), absl::StatusCode::kOk);
  EXPECT_EQ(fetch(ta2->model_digest()), absl::StatusCode::kNotFound);

  // Version 4: a got new work when its task failed as too stale.
  auto ta4 = a.NextTask();
  ASSERT_TRUE(ta4);
  EXPECT_EQ(ta4->round(), 4);
  ASSERT_TRUE(upload(a, *ta4, 100, d4).ok());
  ASSERT_TRUE(a.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;

  auto h = server_->History();
  ASSERT_EQ(h.size(), 4u);
  const std::vector<int64_t> staleness = {0, 1, 0, 0};
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_TRUE(h[i].async.has_value());
    EXPECT_EQ(h[i].participants, 1) << i;
    EXPECT_EQ(h[i].async.value().staleness, (std::map<int64_t, int>{{staleness[i], 1}})) << i;
  }
  EXPECT_EQ(h[3].failures, 1) << "a's stale task failed while version 4 was built";

  ParameterSet expected = g0;
  AddScaled(da, 1.0, &expected);
  AddScaled(db, 0.5, &expected);
  AddScaled(d3, 1.0, &expected);
  AddScaled(d4, 1.0, &expected);
  const ParameterSet after = server_->GlobalModel();
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after.tensors()[i].values.size(); ++j) {
      ASSERT_NEAR(after.tensors()[i].values[j], expected.tensors()[i].values[j], 1e-6) << i << "," << j;
    }
  }
}

// A buffer of K updates is their weighted mean, as a synchronous round of the same
// clients would make it; an upload that arrives while the K are still being added goes
// into the next buffer.
TEST_F(AsyncTest, AFullBufferIsTheWeightedMeanAndLaterUpdatesGoToTheNext) {
  std::mutex mu;
  std::condition_variable cv;
  int entered = 0;
  bool release = false;
  ServerOptions o;
  o.config = TestConfig(R"(
run: {rounds: 2}
model: {name: mlp}
clients: {min: 3, round_deadline_s: 60}
scheduler: {mode: async, buffer_size: 2, max_staleness: 4, staleness: constant}
server: {client_timeout_s: 120, worker_threads: 2}
)");
  o.before_accumulate = [&] {  // holds the first update being added
    std::unique_lock<std::mutex> l(mu);
    if (++entered == 1) cv.wait(l, [&] { return release; });
  };
  StartServerWith(std::move(o));
  const ParameterSet g0 = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 300), c(address_, 200);
  ASSERT_TRUE(a.Join("a"));
  ASSERT_TRUE(b.Join("b"));
  ASSERT_TRUE(c.Join("c"));
  auto ta = a.NextTask(), tb = b.NextTask(), tc = c.NextTask();
  ASSERT_TRUE(ta && tb && tc);
  const ParameterSet da = Delta(g0, 0.01f), db = Delta(g0, -0.02f), dc = Delta(g0, 0.04f);
  StatusOr<v1::UploadReply> ra, rc;
  std::thread upload_a([&] { ra = UploadPayload(a.stub(), a.Header(*ta, 100), da.Encode()); });
  ASSERT_TRUE(WaitForUploads(1, 0));
  ASSERT_TRUE(UploadPayload(b.stub(), b.Header(*tb, 300), db.Encode()).ok());
  // The buffer holds its two updates (one still being added): c's waits for the next.
  std::thread upload_c([&] { rc = UploadPayload(c.stub(), c.Header(*tc, 200), dc.Encode()); });
  ASSERT_TRUE(WaitForUploads(2, 0));
  EXPECT_EQ(server_->committed_round(), 0);
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  upload_a.join();
  upload_c.join();
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rc.ok()) << rc.status();
  ASSERT_TRUE(WaitForVersion(1));
  ParameterSet v1 = g0;
  AddScaled(da, 100.0 / 400, &v1);
  AddScaled(db, 300.0 / 400, &v1);
  auto ta2 = a.NextTask();
  ASSERT_TRUE(ta2);
  ASSERT_TRUE(UploadPayload(a.stub(), a.Header(*ta2, 100), da.Encode()).ok());
  ASSERT_TRUE(a.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  // Version 2: c's update (from version 0; constant: it counts fully) and a's second.
  ParameterSet v2 = v1;
  AddScaled(dc, 200.0 / 300, &v2);
  AddScaled(da, 100.0 / 300, &v2);
  const ParameterSet got = server_->GlobalModel();
  for (size_t i = 0; i < got.size(); ++i) {
    for (size_t j = 0; j < got.tensors()[i].values.size(); ++j) {
      ASSERT_NEAR(got.tensors()[i].values[j], v2.tensors()[i].values[j], 1e-6) << i << "," << j;
    }
  }
  auto h = server_->History();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].async.value().staleness, (std::map<int64_t, int>{{0, 2}}));
  EXPECT_EQ(h[1].async.value().staleness, (std::map<int64_t, int>{{0, 1}, {1, 1}}));
}

// The open buffer survives the server: each update is journaled before its upload is
// acknowledged, so a server restarted on the run directory (after a crash or a stop)
// holds the two updates of version 1 it had, and one more upload completes the buffer
// as three would have on the first server. On the code before the journal the restarted
// buffer is empty and version 1 never comes.
TEST_F(AsyncTest, TheOpenBufferSurvivesARestart) {
  const std::string run_dir =
      ::testing::TempDir() + "/cleave-async-journal-" + std::to_string(::getpid());
  std::filesystem::remove_all(run_dir);
  auto options = [&] {
    ServerOptions o;
    o.config = TestConfig(R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 1, round_deadline_s: 60}
scheduler: {mode: async, buffer_size: 3, max_staleness: 2, staleness: constant}
server: {client_timeout_s: 120}
)");
    o.run_dir = run_dir;
    return o;
  };
  StartServerWith(options());
  const ParameterSet g0 = server_->GlobalModel();
  const ParameterSet da = Delta(g0, 0.01f), db = Delta(g0, -0.02f), dc = Delta(g0, 0.04f);
  {
    TestPeer a(address_, 100), b(address_, 300);
    ASSERT_TRUE(a.Join("a"));
    ASSERT_TRUE(b.Join("b"));
    auto ta = a.NextTask(), tb = b.NextTask();
    ASSERT_TRUE(ta && tb);
    ASSERT_TRUE(UploadPayload(a.stub(), a.Header(*ta, 100), da.Encode()).ok());
    ASSERT_TRUE(UploadPayload(b.stub(), b.Header(*tb, 300), db.Encode()).ok());
    EXPECT_EQ(server_->committed_round(), 0);
    server_->Stop();
    runner_.join();
  }
  server_.reset();
  StartServerWith(options());
  TestPeer c(address_, 200);
  ASSERT_TRUE(c.Join("c"));
  auto tc = c.NextTask();
  ASSERT_TRUE(tc);
  EXPECT_EQ(tc->round(), 1);
  ASSERT_TRUE(UploadPayload(c.stub(), c.Header(*tc, 200), dc.Encode()).ok());
  ASSERT_TRUE(WaitForVersion(1));
  ASSERT_TRUE(c.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  ParameterSet v1 = g0;
  AddScaled(da, 100.0 / 600, &v1);
  AddScaled(db, 300.0 / 600, &v1);
  AddScaled(dc, 200.0 / 600, &v1);
  const ParameterSet got = server_->GlobalModel();
  for (size_t i = 0; i < got.size(); ++i) {
    for (size_t j = 0; j < got.tensors()[i].values.size(); ++j) {
      ASSERT_NEAR(got.tensors()[i].values[j], v1.tensors()[i].values[j], 1e-6) << i << "," << j;
    }
  }
  auto h = server_->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].participants, 3);
  EXPECT_EQ(h[0].async.value().staleness, (std::map<int64_t, int>{{0, 3}}));
  // Applied and checkpointed: the journal holds nothing to add again.
  for (const char* f : {"buffer-a.log", "buffer-b.log"}) {
    EXPECT_EQ(std::filesystem::file_size(run_dir + "/" + f), 0u) << f;
  }
  std::filesystem::remove_all(run_dir);
}

// scheduler.target_staleness: each task's local steps are sized from its client's
// measured speed and the interval between versions (FakeClock seconds), so that a slow
// client's update arrives about target_staleness versions late instead of many; a fast
// client keeps train's work, an unmeasured one is sized as the slowest, and each
// version's metrics say what steps its updates had.
TEST_F(AsyncTest, TargetStalenessSizesEachClientsStepsFromItsSpeed) {
  auto clock = std::make_shared<FakeClock>();
  ServerOptions o;
  o.clock = clock;
  o.config = TestConfig(R"(
run: {rounds: 4}
model: {name: mlp}
clients: {min: 2, round_deadline_s: 600}
train: {local_steps: 32}
scheduler: {mode: async, buffer_size: 1, max_staleness: 4, target_staleness: 1,
            min_local_steps: 2}
server: {client_timeout_s: 100000}
)");
  StartServerWith(std::move(o));
  const ParameterSet g0 = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 300);
  ASSERT_TRUE(a.Join("a"));
  ASSERT_TRUE(b.Join("b"));
  auto upload = [&](TestPeer& p, const v1::Task& t, double train_s) {
    v1::UploadHeader h = p.Header(t, 100);
    h.set_train_seconds(train_s);
    return UploadPayload(p.stub(), h, Delta(g0, 0.01f).Encode());
  };
  // Unmeasured, both get train's 32 steps (t = 0).
  auto ta1 = a.NextTask(), tb1 = b.NextTask();
  ASSERT_TRUE(ta1 && tb1);
  EXPECT_EQ(ta1->train().local_steps(), 32);
  EXPECT_EQ(tb1->train().local_steps(), 32);

  // t = 2: a's update (1 s of training: 1/32 s a step, 1 s besides) makes version 1,
  // 2 s after the buffer opened. Versions' interval: the mean of the last 10.
  clock->AdvanceSeconds(2);
  ASSERT_TRUE(upload(a, *ta1, 1.0).ok());
  ASSERT_TRUE(WaitForVersion(1));
  auto ta2 = a.NextTask();  // 1 version x 2 s - 1 s = 1 s: all 32 of its steps fit
  ASSERT_TRUE(ta2);
  EXPECT_EQ(ta2->train().local_steps(), 32);

  // t = 10: b's update (8 s of training: 1/4 s a step, 2 s besides) makes version 2,
  // one version stale. Versions now come every (2 + 8) / 2 = 5 s: b's next task gets
  // (5 - 2) / (1/4) = 12 steps.
  clock->AdvanceSeconds(8);
  ASSERT_TRUE(upload(b, *tb1, 8.0).ok());
  ASSERT_TRUE(WaitForVersion(2));
  auto tb3 = b.NextTask();
  ASSERT_TRUE(tb3);
  EXPECT_EQ(tb3->round(), 3);
  EXPECT_EQ(tb3->train().local_steps(), 12);
  // A client not measured yet is taken to be as slow as the slowest measured: c joins
  // now and gets b's 12 steps, not 32 (its update is never needed).
  TestPeer c(address_, 100);
  ASSERT_TRUE(c.Join("c"));
  auto tc3 = c.NextTask();
  ASSERT_TRUE(tc3);
  EXPECT_EQ(tc3->train().local_steps(), 12);

  // t = 13: b's 12 steps take 3 s and its update is fresh; then a's, two versions late.
  clock->AdvanceSeconds(3);
  ASSERT_TRUE(upload(b, *tb3, 3.0).ok());
  ASSERT_TRUE(WaitForVersion(3));
  ASSERT_TRUE(upload(a, *ta2, 1.0).ok());
  ASSERT_TRUE(a.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  auto h = server_->History();
  ASSERT_EQ(h.size(), 4u);
  const std::vector<int64_t> steps = {32, 32, 12, 32}, staleness = {0, 1, 0, 2};
  for (size_t i = 0; i < h.size(); ++i) {
    EXPECT_EQ(h[i].async.value().local_steps_min, steps[i]) << i;
    EXPECT_EQ(h[i].async.value().local_steps_max, steps[i]) << i;
    EXPECT_DOUBLE_EQ(h[i].async.value().local_steps_mean, steps[i]) << i;
    EXPECT_EQ(h[i].async.value().staleness, (std::map<int64_t, int>{{staleness[i], 1}})) << i;
  }
}

// Admission: a client measured so slow that even scheduler.min_local_steps would make
// its update more than max_staleness versions late gets no task while a faster client
// trains, and is tried again (with min_local_steps) kRetryVersions = 10 versions later.
TEST_F(AsyncTest, ClientsTooSlowForMaxStalenessAreNotAdmitted) {
  auto clock = std::make_shared<FakeClock>();
  ServerOptions o;
  o.clock = clock;
  o.config = TestConfig(R"(
run: {rounds: 14}
model: {name: mlp}
clients: {min: 2, round_deadline_s: 600}
train: {local_steps: 32}
scheduler: {mode: async, buffer_size: 2, max_staleness: 2, target_staleness: 1,
            min_local_steps: 2}
server: {client_timeout_s: 100000}
)");
  StartServerWith(std::move(o));
  const ParameterSet g0 = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 100);
  ASSERT_TRUE(a.Join("a"));
  ASSERT_TRUE(b.Join("b"));
  auto upload = [&](TestPeer& p, const v1::Task& t, double train_s) {
    v1::UploadHeader h = p.Header(t, 100);
    h.set_train_seconds(train_s);
    return UploadPayload(p.stub(), h, Delta(g0, 0.01f).Encode()).ok();
  };
  auto tb = b.NextTask();
  ASSERT_TRUE(tb);
  // a trains fast: one update a second, a version every two.
  auto a_step = [&]() -> ::testing::AssertionResult {
    auto t = a.NextTask();
    if (!t) return ::testing::AssertionFailure() << "no task for a";
    clock->AdvanceSeconds(1);
    v1::UploadHeader h = a.Header(*t, 100);
    h.set_train_seconds(0.5);
    auto r = UploadPayload(a.stub(), h, Delta(g0, 0.01f).Encode());
    if (!r.ok()) return ::testing::AssertionFailure() << r.status();
    return ::testing::AssertionSuccess();
  };
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a_step()) << i;
  ASSERT_TRUE(WaitForVersion(2));
  // b's update arrives two versions late, after 320 s of training for its 32 steps: at
  // 10 s a step even 2 steps are 10 versions of 2 s. It is accepted (staleness 2), and b
  // gets no new task while a trains.
  ASSERT_TRUE(upload(b, *tb, 320));
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(a_step()) << i;
  ASSERT_TRUE(WaitForVersion(3));
  EXPECT_FALSE(b.NextTask(0.5)) << "a client too slow for max_staleness got a task";
  // Ten versions after it was refused (at version 3's buffer), b gets one task again.
  std::optional<v1::Task> retry;
  while (!retry && server_->committed_round() < 14) {
    ASSERT_TRUE(a_step());
    if (server_->committed_round() >= 12) retry = b.NextTask(0.2);
  }
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->round(), 13);
  EXPECT_EQ(retry->train().local_steps(), 2);
  // a's updates fill the last buffers (b's retried task is not needed). Its last upload
  // ends the run, so a missing next task is the end, not a failure.
  while (server_->committed_round() < 14) {
    auto t = a.NextTask(5);
    if (!t) break;
    clock->AdvanceSeconds(1);
    ASSERT_TRUE(upload(a, *t, 0.5));
  }
  ASSERT_TRUE(WaitForVersion(14));
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  EXPECT_EQ(server_->History()[2].async.value().staleness, (std::map<int64_t, int>{{0, 1}, {2, 1}}));
}

// scheduler.max_client_share 1/2 over a buffer of `buffer` updates, `min` clients.
class AsyncShareTest : public AsyncTest {
 protected:
  void Start(int buffer, int min) {
    ServerOptions o;
    o.config = TestConfig(absl::StrCat("run: {rounds: 3}\nmodel: {name: mlp}\n"
                                       "clients: {min: ", min, ", round_deadline_s: 60}\n"
                                       "scheduler: {mode: async, buffer_size: ", buffer,
                                       ", max_client_share: 0.5}\n"
                                       "server: {client_timeout_s: 120}\n"));
    StartServerWith(std::move(o));
    g0_ = server_->GlobalModel();
  }
  // Uploads `p`'s update for task `t`.
  ::testing::AssertionResult Upload(TestPeer& p, const v1::Task& t) {
    auto r = UploadPayload(p.stub(), p.Header(t, 100), Delta(g0_, 0.01f).Encode());
    if (r.ok()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << r.status();
  }
  ParameterSet g0_;
};

// A client that uploads as fast as it gets tasks (a flooder) fills at most
// ceil(max_client_share x buffer_size) of a buffer: with a buffer of 4 and a share of
// 1/2, its first two tasks build version 1, and its third trains from version 1, given
// only once the two other clients' updates applied it.
TEST_F(AsyncShareTest, AFloodingClientFillsAtMostItsShareOfABuffer) {
  Start(/*buffer=*/4, /*min=*/3);
  TestPeer a(address_, 100), b(address_, 100), c(address_, 100);
  ASSERT_TRUE(a.Join("a") && b.Join("b") && c.Join("c"));
  auto ta = a.NextTask(), tb = b.NextTask(), tc = c.NextTask();
  ASSERT_TRUE(ta && tb && tc);
  const int64_t first = ta->round();
  ASSERT_TRUE(Upload(a, *ta));
  ta = a.NextTask();
  ASSERT_TRUE(ta);
  EXPECT_EQ(ta->round(), first);
  ASSERT_TRUE(Upload(a, *ta));
  ASSERT_TRUE(Upload(b, *tb));
  ASSERT_TRUE(Upload(c, *tc));
  ASSERT_TRUE(WaitForVersion(1));
  auto third = a.NextTask();
  ASSERT_TRUE(third);
  EXPECT_EQ(third->round(), first + 1) << "a's third task was for the buffer its two filled half of";
  EXPECT_EQ(server_->History()[0].participants, 4);
}

// A lone client is not held to the bound: nobody else could fill its buffer.
TEST_F(AsyncShareTest, ALoneClientIsNotHeldToItsShare) {
  Start(/*buffer=*/3, /*min=*/1);
  TestPeer a(address_, 100);
  ASSERT_TRUE(a.Join("a"));
  auto t = a.NextTask();
  ASSERT_TRUE(t);
  const int64_t first = t->round();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(t);
    EXPECT_EQ(t->round(), first);
    ASSERT_TRUE(Upload(a, *t));
    if (i < 2) t = a.NextTask();
  }
  ASSERT_TRUE(WaitForVersion(1));
  EXPECT_EQ(server_->History()[0].participants, 3);
}

// With dp, a client's update is in a buffer at most once (the accounting's premise): a
// client whose update is in the open buffer gets its next task only once it is applied.
// Without dp the bound is scheduler.max_client_share of the buffer: at 1 (the default) it
// gets one at once, for the same buffer; at 1/2 of a buffer of 2, it waits like with dp.
// Returns the round of a's second task, taken after b's upload applied version 1.
class AsyncDpTest : public AsyncTest {
 protected:
  int64_t RoundOfSecondTask(bool dp, double share = 1) {
    ServerOptions o;
    o.config = TestConfig(absl::StrCat(R"(
run: {rounds: 2}
model: {name: mlp}
clients: {min: 2, round_deadline_s: 60}
scheduler: {mode: async, buffer_size: 2, max_client_share: )", share, R"(}
server: {client_timeout_s: 120}
)", dp ? "dp: {noise_multiplier: 0.5, clip: 1.0}\n" : ""));
    StartServerWith(std::move(o));
    const ParameterSet g0 = server_->GlobalModel();
    TestPeer a(address_, 100), b(address_, 300);
    EXPECT_TRUE(a.Join("a"));
    EXPECT_TRUE(b.Join("b"));
    auto ta = a.NextTask(), tb = b.NextTask();
    if (!ta || !tb) return -1;
    EXPECT_TRUE(UploadPayload(a.stub(), a.Header(*ta, 100), Delta(g0, 0.01f).Encode()).ok());
    EXPECT_TRUE(UploadPayload(b.stub(), b.Header(*tb, 300), Delta(g0, -0.01f).Encode()).ok());
    EXPECT_TRUE(WaitForVersion(1));
    auto second = a.NextTask();
    if (dp) {
      auto h = server_->History();
      EXPECT_EQ(h.size(), 1u);
      if (!h.empty()) {
        EXPECT_EQ(h[0].strategy_stats.at("dp_sampling_rate"), 1.0);
      }
    }
    return second ? second->round() : -1;
  }
};

TEST_F(AsyncDpTest, WithoutDpAnIdleClientTrainsAgainForTheSameBuffer) {
  EXPECT_EQ(RoundOfSecondTask(false), 1);
}

TEST_F(AsyncDpTest, AtAShareOfAHalfAClientFillsAtMostHalfABuffer) {
  EXPECT_EQ(RoundOfSecondTask(false, 0.5), 2);
}

TEST_F(AsyncDpTest, WithDpAClientContributesOnceToABuffer) {
  EXPECT_EQ(RoundOfSecondTask(true), 2);
}

}  // namespace
}  // namespace cleave
