// The daemon's pool: site policies (what a long-lived client accepts), the schedulers that
// divide the attached clients among running jobs, declines kept in the job store, and a
// daemon admitting and offering jobs to sites attached over a real gRPC port.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <thread>

#include "cleave/v1/jobs.grpc.pb.h"
#include "core/clock.h"
#include "core/files.h"
#include "core/parameter_set.h"
#include "privacy/certs.h"
#include "privacy/tls.h"
#include "service/daemon.h"
#include "service/job_store.h"
#include "service/scheduler.h"
#include "service/site_policy.h"
#include "tests/deadline.h"
#include "tests/e2e/processes.h"
#include "tests/service/fake_site.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

// ---- Site policies ----

constexpr const char* kPolicy = R"(datasets:
  xray: [alice, bob]
  notes: ["*"]
models: [mlp, lenet5]
max_parameters: 5000000
max_rounds: 200
require_secure_aggregation: true
max_dp_epsilon: 8
max_concurrent_jobs: 2
)";

v1::JobSummary Summary(const std::string& submitter, const std::string& dataset) {
  v1::JobSummary j;
  j.set_name("j");
  j.set_submitter(submitter);
  j.set_dataset(dataset);
  j.set_model("mlp");
  j.set_parameters(100000);
  j.set_rounds(10);
  j.set_secure_aggregation(true);
  j.set_dp(true);
  j.set_dp_epsilon(4);
  return j;
}

v1::PoolHello Site(const v1::SitePolicy& policy, std::vector<std::string> datasets = {"xray", "notes"}) {
  v1::PoolHello h;
  for (const std::string& d : datasets) h.add_datasets()->set_name(d);
  *h.mutable_policy() = policy;
  return h;
}

// The reason `hello`'s site gives for refusing `job`; "" when it accepts.
std::string Refusal(const v1::PoolHello& hello, const v1::JobSummary& job) {
  const Status s = SiteAccepts(hello, job);
  EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kPermissionDenied) << s;
  return std::string(s.message());
}

TEST(SitePolicyTest, EachRuleRefusesWhatBreaksIt) {
  auto p = ParseSitePolicy(kPolicy, "site.yaml");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(MaxConcurrentJobs(*p), 2);
  const v1::PoolHello site = Site(*p);
  EXPECT_EQ(Refusal(site, Summary("alice", "xray")), "");
  EXPECT_EQ(Refusal(site, Summary("mallory", "notes")), "");  // "*"
  EXPECT_EQ(Refusal(site, Summary("mallory", "xray")), "its policy does not let mallory use dataset xray");
  EXPECT_EQ(Refusal(site, Summary("alice", "")), "exposes no dataset default");
  EXPECT_EQ(Refusal(Site(*p, {"xray", "notes", "scans"}), Summary("alice", "scans")),
            "its policy opens dataset scans to no job");
  v1::JobSummary j = Summary("alice", "xray");
  j.set_model("gpt");
  EXPECT_EQ(Refusal(site, j), "its policy accepts models mlp, lenet5, not gpt");
  j = Summary("alice", "xray");
  j.set_parameters(5000001);
  EXPECT_EQ(Refusal(site, j), "a model of 5000001 parameters; its policy accepts at most 5000000");
  j.set_parameters(0);  // not known yet (at submission): passes
  EXPECT_EQ(Refusal(site, j), "");
  j.set_rounds(201);
  EXPECT_EQ(Refusal(site, j), "201 rounds; its policy accepts at most 200");
  j = Summary("alice", "xray");
  j.set_secure_aggregation(false);
  EXPECT_EQ(Refusal(site, j), "its policy requires secure aggregation (secure_aggregation.enabled)");
  for (const auto& [dp, epsilon] : {std::pair{false, 0.0}, {true, 0.0}, {true, 8.5}}) {
    j = Summary("alice", "xray");
    j.set_dp(dp);
    j.set_dp_epsilon(epsilon);
    EXPECT_EQ(Refusal(site, j), "its policy requires DP with dp.target_epsilon at most 8") << dp << " " << epsilon;
  }
  // Without a policy file: every job on an exposed dataset.
  EXPECT_EQ(Refusal(Site(v1::SitePolicy()), Summary("anyone", "notes")), "");
  EXPECT_EQ(MaxConcurrentJobs(v1::SitePolicy()), 1);
}

TEST(SitePolicyTest, ABadFileIsRefusedNamingItsLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"datasets:\n  xray: [alice]\nmax_round: 3\n", "site.yaml:3: unknown key max_round"},
      {"max_rounds: 0\n", "site.yaml:1: max_rounds is at least 1"},
      {"max_rounds: many\n", "site.yaml:1: max_rounds is a count"},
      {"datasets:\n  xray: alice\n", "site.yaml:2: datasets.xray is a list of names"},
      {"models: [mlp, \"\"]\n", "site.yaml:1: models: an empty name"},
      {"require_secure_aggregation: perhaps\n", "site.yaml:1: require_secure_aggregation is true or false"},
      {"max_concurrent_jobs: 65\n", "site.yaml:1: max_concurrent_jobs is in [1, 64]"},
      {"datasets: [\n", "site.yaml:2: not YAML"},
      {"- a list\n", "site.yaml: a site policy is a map"},
  };
  for (const auto& [yaml, error] : cases) {
    auto p = ParseSitePolicy(yaml, "site.yaml");
    ASSERT_FALSE(p.ok()) << yaml;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(p.status().message()).rfind(error, 0), 0u) << p.status() << "\nwanted " << error;
  }
}

TEST(SitePolicyTest, TheShippedExampleLoads) {
  auto p = LoadSitePolicy(std::string(CLEAVE_SOURCE_DIR) + "/deploy/site-policy.yaml");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->given());
}

// ---- Schedulers ----

PoolJob Want(const std::string& id, int priority, int64_t order, int min, int max, std::set<std::string> eligible) {
  return {id, priority, order, min, max, std::move(eligible), -1};
}

TEST(PoolSchedulerTest, FifoServesThePriorityFirstAndTakesClientsFromLowerJobs) {
  auto fifo = MakePoolScheduler("fifo");
  const std::vector<PoolSeat> seats = {{"a", 1}, {"b", 1}, {"c", 1}, {"d", 2}};
  const std::set<std::string> all = {"a", "b", "c", "d"};
  // job-1 came first and holds everyone; job-2 has the higher priority but wants 2.
  const PoolAllocation current = {{"job-1", {"a", "b", "c", "d"}}};
  const PoolAllocation got =
      fifo->Allocate({Want("job-1", 0, 1, 1, 0, all), Want("job-2", 5, 2, 1, 2, {"b", "c", "d"})}, seats, current);
  // job-2 takes the free clients it may use first by name (b, c) -- d's second seat is
  // free too, but b comes first; job-1 keeps what is left: a and d (twice-capable).
  EXPECT_EQ(got.at("job-2"), (std::set<std::string>{"b", "c"}));
  EXPECT_EQ(got.at("job-1"), (std::set<std::string>{"a", "d"}));
  // A client of two seats serves two jobs; one not eligible gets nothing.
  const PoolAllocation two = fifo->Allocate({Want("x", 0, 1, 1, 0, {"d"}), Want("y", 0, 2, 1, 0, {"d"}),
                                             Want("z", 0, 3, 1, 0, {"d"}), Want("w", 0, 4, 1, 0, {})},
                                            seats, {});
  EXPECT_EQ(two.at("x"), (std::set<std::string>{"d"}));
  EXPECT_EQ(two.at("y"), (std::set<std::string>{"d"}));
  EXPECT_TRUE(two.at("z").empty());
  EXPECT_TRUE(two.at("w").empty());
  EXPECT_EQ(MakePoolScheduler("lottery"), nullptr);
}

TEST(PoolSchedulerTest, FairGivesEachItsMinimumThenEqualSharesKeepingWhoItHas) {
  auto fair = MakePoolScheduler("fair");
  std::vector<PoolSeat> seats;
  std::set<std::string> all;
  for (const char* n : {"a", "b", "c", "d", "e", "f", "g"}) seats.push_back({n, 1}), all.insert(n);
  // job-1 held all seven; job-2 and job-3 arrive.
  const PoolAllocation current = {{"job-1", all}};
  const PoolAllocation got = fair->Allocate(
      {Want("job-1", 0, 1, 2, 0, all), Want("job-2", 0, 2, 2, 0, all), Want("job-3", 0, 3, 2, 0, all)}, seats,
      current);
  // Shares 3, 2, 2 (job-1 first in order gets the odd one) and job-1 keeps its own.
  EXPECT_EQ(got.at("job-1"), (std::set<std::string>{"a", "b", "g"}));
  EXPECT_EQ(got.at("job-2"), (std::set<std::string>{"c", "d"}));
  EXPECT_EQ(got.at("job-3"), (std::set<std::string>{"e", "f"}));
  // Reallocating that allocation changes nothing: nobody moves.
  EXPECT_EQ(fair->Allocate({Want("job-1", 0, 1, 2, 0, all), Want("job-2", 0, 2, 2, 0, all),
                            Want("job-3", 0, 3, 2, 0, all)},
                           seats, got),
            got);
  // A job that may use only one client leaves the rest to the others; one capped at 1 too.
  const PoolAllocation capped = fair->Allocate(
      {Want("job-1", 0, 1, 1, 0, {"a"}), Want("job-2", 0, 2, 1, 1, all), Want("job-3", 0, 3, 1, 0, all)}, seats, {});
  EXPECT_EQ(capped.at("job-1"), (std::set<std::string>{"a"}));
  EXPECT_EQ(capped.at("job-2").size(), 1u);
  EXPECT_EQ(capped.at("job-3").size(), 5u);
}

TEST(PoolSchedulerTest, GoodputGroupsClientsBySpeedAndLeavesASlowOneOutWhereItCostsMore) {
  auto goodput = MakePoolScheduler("goodput");
  ASSERT_NE(goodput, nullptr);
  auto job = [](const std::string& id, int64_t order, double phi, const std::vector<PoolSeat>& seats) {
    std::set<std::string> all;
    for (const PoolSeat& s : seats) all.insert(s.name);
    PoolJob j = Want(id, 0, order, 2, 0, all);
    j.noise_scale = phi;
    return j;
  };
  // Six clients, slowness 1, 1, 1.25, 1.25, 3, 3 (names not in speed order).
  const std::vector<PoolSeat> near = {{"a", 1, 3}, {"b", 1, 1}, {"c", 1, 1.25}, {"d", 1, 1}, {"e", 1, 3}, {"f", 1, 1.25}};
  // Updates that agree (phi 0): more clients add nothing, a slower one only costs: the
  // fastest two. Noisy ones (phi 8): 4 / 12 at 1.25 beats 2 / 10 at 1 (and 3 / 11 at
  // 1.25, so both 1.25s come at once), while 6 / 14 at 3 does not.
  EXPECT_EQ(goodput->Allocate({job("job-1", 1, 0, near)}, near, {}).at("job-1"), (std::set<std::string>{"b", "d"}));
  EXPECT_EQ(goodput->Allocate({job("job-1", 1, 8, near)}, near, {}).at("job-1"),
            (std::set<std::string>{"b", "c", "d", "f"}));

  // Slowness 1, 1, 2, 2, 3, 3. job-1 held all six; job-2 and job-3 arrive: each gets a
  // pair of equal speed, the first submitted the fastest.
  const std::vector<PoolSeat> seats = {{"a", 1, 3}, {"b", 1, 1}, {"c", 1, 2}, {"d", 1, 1}, {"e", 1, 3}, {"f", 1, 2}};
  const std::vector<PoolJob> three = {job("job-1", 1, 2, seats), job("job-2", 2, 2, seats), job("job-3", 3, 2, seats)};
  const PoolAllocation got = goodput->Allocate(three, seats, {{"job-1", {"a", "b", "c", "d", "e", "f"}}});
  EXPECT_EQ(got.at("job-1"), (std::set<std::string>{"b", "d"}));
  EXPECT_EQ(got.at("job-2"), (std::set<std::string>{"c", "f"}));
  EXPECT_EQ(got.at("job-3"), (std::set<std::string>{"a", "e"}));
  EXPECT_EQ(goodput->Allocate(three, seats, got), got) << "nobody moves again";

  // An allocation within 10 % of the best is kept: {a, c} and {b, d} at slowness 1.05
  // each (1.905) against {a, b} and {c, d} (1.952).
  const std::vector<PoolSeat> close = {{"a", 1, 1}, {"b", 1, 1}, {"c", 1, 1.05}, {"d", 1, 1.05}};
  const PoolAllocation mixed = {{"job-1", {"a", "c"}}, {"job-2", {"b", "d"}}};
  EXPECT_EQ(goodput->Allocate({job("job-1", 1, 0, close), job("job-2", 2, 0, close)}, close, mixed), mixed);
  // A job no client can take at clients.min holds none.
  EXPECT_TRUE(goodput->Allocate({Want("job-9", 0, 9, 3, 0, {"a", "b"})}, seats, {}).at("job-9").empty());
}

TEST(PoolSchedulerTest, SlownessIsFittedAcrossJobsThatSharedNoClient) {
  // Client x takes 1 s a round in job-1 (where y takes 2 s) and 10 s in job-2, whose work
  // is ten times larger (z 30 s there): y is 2, z 3 times as slow as x, though y and z
  // never ran the same job. w ran only job-3: it is the fastest of its own group. Each
  // job's unit is its task time on the fastest: 1, 10 and 7 s.
  const Slowness fit = RelativeSlowness({{{"job-1", "x"}, 1.0},
                                         {{"job-1", "y"}, 2.0},
                                         {{"job-2", "x"}, 10.0},
                                         {{"job-2", "z"}, 30.0},
                                         {{"job-3", "w"}, 7.0},
                                         {{"job-3", "v"}, -1.0}});
  const std::map<std::string, double>& s = fit.clients;
  ASSERT_EQ(s.size(), 4u);
  EXPECT_NEAR(s.at("x"), 1.0, 1e-6);
  EXPECT_NEAR(s.at("y"), 2.0, 1e-6);
  EXPECT_NEAR(s.at("z"), 3.0, 1e-6);
  EXPECT_NEAR(s.at("w"), 1.0, 1e-6);
  ASSERT_EQ(fit.unit_s.size(), 3u);
  EXPECT_NEAR(fit.unit_s.at("job-1"), 1.0, 1e-6);
  EXPECT_NEAR(fit.unit_s.at("job-2"), 10.0, 1e-5);
  EXPECT_NEAR(fit.unit_s.at("job-3"), 7.0, 1e-5);
}

// A round's fixed part (model transfer, the server's evaluation) makes a slower client
// cheaper: at slowness 1, 1, 3, 3 and noise scale 2, a job whose round is all training
// keeps to the fastest two (2/4 a round of 1 s, against 4/6 a round of 3 s), one whose
// round spends 10 s besides takes all four (2/4 in 11 s, against 4/6 in 13 s).
TEST(PoolSchedulerTest, GoodputCountsWhatARoundCostsBesidesTraining) {
  auto goodput = MakePoolScheduler("goodput");
  const std::vector<PoolSeat> seats = {{"a", 1, 1}, {"b", 1, 1}, {"c", 1, 3}, {"d", 1, 3}};
  PoolJob j = Want("job-1", 0, 1, 2, 0, {"a", "b", "c", "d"});
  j.noise_scale = 2;
  j.unit_s = 1;
  EXPECT_EQ(goodput->Allocate({j}, seats, {}).at("job-1"), (std::set<std::string>{"a", "b"}));
  j.overhead_s = 10;
  EXPECT_EQ(goodput->Allocate({j}, seats, {}).at("job-1").size(), 4u);
}

TEST(PoolSchedulerTest, TheNoiseScaleIsTheRatioOfTheAveragedNoiseAndSignal) {
  NoiseScaleAverage n;
  EXPECT_EQ(n.value(), -1) << "none measured";
  n.Add(8, 4);
  EXPECT_DOUBLE_EQ(n.value(), 2);
  // Averages 8 + 0.3 (2 - 8) = 6.2 and 4 + 0.3 (-2 - 4) = 2.2: a round whose signal
  // came out negative moves the ratio, it does not flip it.
  n.Add(2, -2);
  EXPECT_DOUBLE_EQ(n.value(), 6.2 / 2.2);
  n.Add(std::nan(""), 1);
  EXPECT_DOUBLE_EQ(n.value(), 6.2 / 2.2) << "a non-finite estimate is ignored";
  NoiseScaleAverage noise_only;
  noise_only.Add(5, -1);
  EXPECT_EQ(noise_only.value(), 1000) << "all noise: the most";
}

// ---- The store ----

class PoolStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cleave_pool_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(PoolStoreTest, DeclinesAreKeptAndAHigherPriorityStartsFirst) {
  auto store = JobStore::Open((dir_ / "jobs.db").string(), 10);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Submit("alice", "low", "a", 2, 0).ok());
  ASSERT_TRUE((*store)->Submit("alice", "high", "b", 2, 7).ok());
  ASSERT_TRUE((*store)->Submit("alice", "high2", "c", 2, 7).ok());
  EXPECT_EQ((*store)->StartNext()->id, "job-2");
  EXPECT_EQ((*store)->StartNext()->id, "job-3");
  EXPECT_EQ((*store)->StartNext()->id, "job-1");
  ASSERT_TRUE((*store)->Decline("job-2", "site-b", "too many rounds").ok());
  ASSERT_TRUE((*store)->Decline("job-2", "site-a", "no such dataset").ok());
  ASSERT_TRUE((*store)->Decline("job-2", "site-b", "still too many").ok());  // replaces
  store->reset();
  auto reopened = JobStore::Open((dir_ / "jobs.db").string(), 10);
  ASSERT_TRUE(reopened.ok());
  const JobRecord j = *(*reopened)->Get("job-2");
  EXPECT_EQ(j.priority, 7);
  ASSERT_EQ(j.declines.size(), 2u);
  std::map<std::string, std::string> declines(j.declines.begin(), j.declines.end());
  EXPECT_EQ(declines["site-a"], "no such dataset");
  EXPECT_EQ(declines["site-b"], "still too many");
  EXPECT_TRUE((*reopened)->Get("job-1")->declines.empty());
}

TEST_F(PoolStoreTest, ADatabaseOfAnOlderDaemonGainsTheNewColumns) {
  const std::string path = (dir_ / "jobs.db").string();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  // The first schema's jobs table, with one queued job.
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TABLE jobs(seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, "
                         "submitter TEXT NOT NULL, digest TEXT NOT NULL, config TEXT NOT NULL, state TEXT NOT NULL, "
                         "submitted_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL DEFAULT 0, ended_ms INTEGER NOT "
                         "NULL DEFAULT 0, reason TEXT NOT NULL DEFAULT '', cancel_requested INTEGER NOT NULL DEFAULT "
                         "0, committed_round INTEGER NOT NULL DEFAULT 0, total_rounds INTEGER NOT NULL DEFAULT 0, "
                         "evaluated INTEGER NOT NULL DEFAULT 0, accuracy REAL NOT NULL DEFAULT 0, loss REAL NOT NULL "
                         "DEFAULT 0);"
                         "INSERT INTO jobs(name, submitter, digest, config, state, submitted_ms) "
                         "VALUES('old', 'alice', 'd', 'c', 'queued', 1);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto store = JobStore::Open(path, 10);
  ASSERT_TRUE(store.ok()) << store.status();
  const JobRecord j = *(*store)->Get("job-1");
  EXPECT_EQ(j.name, "old");
  EXPECT_EQ(j.priority, 0);
  EXPECT_TRUE((*store)->Submit("bob", "new", "x", 1, 3).ok());
  EXPECT_EQ((*store)->StartNext()->id, "job-2");
}

// ---- A daemon and its pool ----

class PoolDaemonTest : public PoolStoreTest {
 protected:
  void SetUp() override {
    PoolStoreTest::SetUp();
    std::ofstream(dir_ / "policy.yaml") << "identities:\n  alice: [submit]\ntokens:\n  "
                                        << Sha256Hex("alice-token") << ": alice\n";
    Start(0);
  }
  // A daemon whose jobs serve on `job_port` alone (0: any port).
  void Start(int job_port) {
    sites_.clear();
    daemon_.reset();
    DaemonOptions o;
    o.state_dir = (dir_ / "state").string();
    o.listen = "127.0.0.1:0";
    o.clients_listen = "127.0.0.1:0";
    o.policy = (dir_ / "policy.yaml").string();
    o.insecure = true;
    o.job_port_lo = o.job_port_hi = job_port;
    auto d = Daemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    pool_ = "127.0.0.1:" + std::to_string(daemon_->pool_port());
    stub_ = v1::Jobs::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(daemon_->port()),
                                                  grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    sites_.clear();
    daemon_.reset();
    PoolStoreTest::TearDown();
  }
  testing::FakeSite* Attach(v1::PoolHello hello, std::string decline = "") {
    sites_.push_back(std::make_unique<testing::FakeSite>(pool_, std::move(hello), std::move(decline)));
    EXPECT_TRUE(sites_.back()->welcomed());
    return sites_.back().get();
  }
  grpc::Status Submit(const std::string& yaml) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer alice-token");
    v1::SubmitJobRequest req;
    req.set_config_yaml(yaml);
    v1::JobInfo reply;
    return stub_->Submit(&ctx, req, &reply);
  }
  grpc::Status Get(const std::string& id, v1::JobInfo* info) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer alice-token");
    v1::GetJobRequest get;
    get.set_id(id);
    return stub_->Get(&ctx, get, info);
  }
  std::string State(const std::string& id) {
    v1::JobInfo info;
    return Get(id, &info).ok() ? info.state() : "";
  }
  v1::JobInfo AwaitEnd(const std::string& id) {
    v1::JobInfo info;
    for (int i = 0; i < testing::ScaledSeconds(60) * 20; ++i) {
      if (Get(id, &info).ok() && (info.state() == "failed" || info.state() == "succeeded")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return info;
  }

  std::unique_ptr<Daemon> daemon_;
  std::string pool_;
  std::unique_ptr<v1::Jobs::Stub> stub_;
  std::vector<std::unique_ptr<testing::FakeSite>> sites_;
};

constexpr const char* kJob = "run: {name: j, rounds: 2}\nmodel: {name: mlp}\ndata: {test: \"\"%s}\n"
                             "clients: {min: 1, join_timeout_s: 600}\n";

std::string JobOn(const std::string& dataset) {
  std::string yaml = kJob;
  const std::string with = dataset.empty() ? "" : ", dataset: " + dataset;
  yaml.replace(yaml.find("%s"), 2, with);
  return yaml;
}

TEST_F(PoolDaemonTest, AJobNoAttachedClientWouldTakeIsRefusedAtSubmission) {
  grpc::Status s = Submit(JobOn("xray"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("no client is attached"), std::string::npos) << s.error_message();
  Attach(testing::FakeSite::Hello("site-a", {"notes"}));
  v1::PoolHello b = Site(*ParseSitePolicy("datasets: {xray: [bob]}\n", "p"), {"xray"});
  b.set_name("site-b");
  Attach(b);
  s = Submit(JobOn("xray"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("site-a: exposes no dataset xray"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("its policy does not let alice use dataset xray"), std::string::npos)
      << s.error_message();
  v1::JobInfo info;
  EXPECT_EQ(Get("job-1", &info).error_code(), grpc::StatusCode::NOT_FOUND);  // nothing was queued
  EXPECT_TRUE(Submit(JobOn("notes")).ok());
}

TEST_F(PoolDaemonTest, AJobEverySiteDeclinesFailsWithTheirReasons) {
  Attach(testing::FakeSite::Hello("site-a"), "the device is charging");
  Attach(testing::FakeSite::Hello("site-b"), "no room for the model");
  ASSERT_TRUE(Submit(JobOn("")).ok());
  const v1::JobInfo info = AwaitEnd("job-1");
  ASSERT_EQ(info.state(), "failed") << info.reason();
  EXPECT_EQ(info.reason(),
            "no attached client accepts the job: site-a: the device is charging; site-b: no room for the model");
  ASSERT_EQ(info.declines_size(), 2);
  std::map<std::string, std::string> declines;
  for (const v1::JobDecline& d : info.declines()) declines[d.client()] = d.reason();
  EXPECT_EQ(declines["site-a"], "the device is charging");
  EXPECT_EQ(declines["site-b"], "no room for the model");
}

TEST_F(PoolDaemonTest, OffersNameTheJobsPortAndWhatASiteDecidesOn) {
  testing::FakeSite* site = Attach(testing::FakeSite::Hello("site-a", {"default", "xray"}));
  ASSERT_TRUE(Submit(JobOn("xray")).ok());
  std::vector<v1::JobOffer> offers;
  for (int i = 0; i < testing::ScaledSeconds(30) * 20 && offers.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    offers = site->Offers();
  }
  ASSERT_EQ(offers.size(), 1u);
  EXPECT_EQ(offers[0].job_id(), "job-1");
  EXPECT_GT(offers[0].port(), 0);
  EXPECT_NE(offers[0].port(), daemon_->pool_port());
  EXPECT_EQ(ReadFile((dir_ / "state" / "jobs" / "job-1" / "server.addr").string()).value_or(""),
            "127.0.0.1:" + std::to_string(offers[0].port()) + "\n");
  EXPECT_EQ(offers[0].job().submitter(), "alice");
  EXPECT_EQ(offers[0].job().dataset(), "xray");
  EXPECT_EQ(offers[0].job().model(), "mlp");
  EXPECT_EQ(offers[0].job().rounds(), 2);
  EXPECT_GT(offers[0].job().parameters(), 100000);  // the mlp's 784*128 weights and more
}

TEST_F(PoolDaemonTest, JobsTakeTheirPortsFromTheRangeAndWaitWhenItIsTaken) {
  const int port = testing::FreePort();
  ASSERT_GT(port, 0);
  Start(port);
  testing::FakeSite* site = Attach(testing::FakeSite::Hello("site-a"));
  ASSERT_TRUE(Submit(JobOn("")).ok());
  std::string second = JobOn("");
  second.replace(second.find("name: j"), 7, "name: k");
  ASSERT_TRUE(Submit(second).ok());
  for (int i = 0; i < testing::ScaledSeconds(30) * 20 && site->Offers().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(site->Offers().size(), 1u);
  EXPECT_EQ(site->Offers()[0].port(), port);
  EXPECT_EQ(State("job-1"), "running");
  EXPECT_EQ(State("job-2"), "queued");  // the range's one port is job-1's
  DaemonOptions bad;
  bad.state_dir = (dir_ / "other").string();
  bad.clients_listen = "127.0.0.1:0";
  bad.policy = (dir_ / "policy.yaml").string();
  bad.job_port_lo = 9000;
  bad.job_port_hi = 8000;
  EXPECT_NE(Daemon::Start(bad).status().message().find("--job-ports"), std::string::npos);
}

// With TLS the pool requires a client certificate, and its CN, not the hello's name, is
// the client's name.
TEST_F(PoolStoreTest, ThePoolOverMutualTlsNamesClientsByTheirCertificates) {
  const std::string certs = (dir_ / "certs").string();
  ASSERT_TRUE(InitFederation(certs).ok());
  ASSERT_TRUE(IssueClientCert(certs, "site-x").ok());
  std::ofstream(dir_ / "policy.yaml") << "identities: {}\n";
  DaemonOptions o;
  o.state_dir = (dir_ / "state").string();
  o.listen = "127.0.0.1:0";
  o.clients_listen = "127.0.0.1:0";
  o.policy = (dir_ / "policy.yaml").string();
  o.tls_cert = certs + "/server.crt";
  o.tls_key = certs + "/server.key";
  o.tls_ca = certs + "/ca.crt";
  auto daemon = Daemon::Start(o);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string pool = "127.0.0.1:" + std::to_string((*daemon)->pool_port());
  {
    testing::FakeSite site(pool, testing::FakeSite::Hello("spoofed"), "",
                           ClientCredentials(o.tls_ca, certs + "/clients/site-x.crt", certs + "/clients/site-x.key"));
    ASSERT_TRUE(site.welcomed());
    EXPECT_EQ(site.name(), "site-x");
  }
  // Without a certificate (the CA trusted, nothing presented): no attachment.
  testing::FakeSite anonymous(pool, testing::FakeSite::Hello("anonymous"), "", ClientCredentials(o.tls_ca, "", ""));
  EXPECT_FALSE(anonymous.welcomed());
  // And no plaintext at all.
  testing::FakeSite plain(pool, testing::FakeSite::Hello("plain"));
  EXPECT_FALSE(plain.welcomed());
}

// A site whose daily limit is spent pauses: the daemon releases it from its job, which
// waits (its reason is no decline), and offers the job again once the site resumes.
TEST_F(PoolDaemonTest, APausedSiteLeavesItsJobWhichWaitsForItToResume) {
  testing::FakeSite* site = Attach(testing::FakeSite::Hello("site-a"));
  ASSERT_TRUE(Submit(JobOn("")).ok());
  auto wait_for = [](const std::function<bool()>& done) {
    for (int i = 0; i < testing::ScaledSeconds(30) * 20 && !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return done();
  };
  ASSERT_TRUE(wait_for([&] { return site->Offers().size() == 1; }));
  site->Pause(UnixNowMs() + 3600 * 1000, "40 tasks trained in 24 hours, its policy's max_rounds_per_day");
  ASSERT_TRUE(wait_for([&] { return !site->Releases().empty(); }));
  EXPECT_EQ(site->Releases()[0].job_id(), "job-1");
  EXPECT_NE(site->Releases()[0].reason().find("the client paused until"), std::string::npos)
      << site->Releases()[0].reason();
  // Its job waits for it: still running, with no decline; a new one is admitted.
  v1::JobInfo info;
  ASSERT_TRUE(Get("job-1", &info).ok());
  EXPECT_EQ(info.state(), "running");
  EXPECT_EQ(info.declines_size(), 0);
  std::string second = JobOn("");
  second.replace(second.find("name: j"), 7, "name: k");
  EXPECT_TRUE(Submit(second).ok());
  EXPECT_EQ(site->Offers().size(), 1u) << "nothing is offered to a paused site";
  site->Pause(0, "");
  ASSERT_TRUE(wait_for([&] { return site->Offers().size() >= 2; }));
  EXPECT_EQ(site->Offers()[1].job_id(), "job-1");
  // A pause beyond a day (and an hour of skew) ends the attachment.
  site->Pause(UnixNowMs() + 48 * 3600 * 1000LL, "");
  ASSERT_TRUE(wait_for([&] {
    return Submit(JobOn("nothing")).error_message().find("no client is attached") != std::string::npos;
  }));
}

TEST_F(PoolDaemonTest, AMalformedHelloIsRefusedAndAttachesNothing) {
  auto stub = v1::Pool::NewStub(grpc::CreateChannel(pool_, grpc::InsecureChannelCredentials()));
  for (const v1::PoolHello& hello : [] {
         std::vector<v1::PoolHello> bad(4, testing::FakeSite::Hello("x"));
         bad[0].set_name("");  // no name, no certificate
         bad[1].add_datasets()->set_name("default");  // twice
         bad[2].add_datasets()->set_name(std::string(200, 'd'));
         bad[3].set_name("bad\nname");
         return bad;
       }()) {
    grpc::ClientContext ctx;
    auto stream = stub->Attach(&ctx);
    v1::PoolUp up;
    *up.mutable_hello() = hello;
    stream->Write(up);
    v1::PoolDown down;
    EXPECT_FALSE(stream->Read(&down));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  grpc::Status s = Submit(JobOn(""));
  EXPECT_NE(s.error_message().find("no client is attached"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace cleave
