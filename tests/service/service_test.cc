// The daemon's parts: the access policy, the job store, and the job API over a real gRPC
// port (plaintext on loopback, callers named by bearer tokens).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cleave/v1/jobs.grpc.pb.h"
#include "core/files.h"
#include "core/parameter_set.h"
#include "service/access_policy.h"
#include "service/daemon.h"
#include "service/dashboard.h"
#include "service/job_store.h"
#include "tests/deadline.h"
#include "tests/service/fake_site.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cleave_service_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  fs::path dir_;
};

// A job that passes the daemon's checks (the same as cleave-server --config's).
std::string Job(const std::string& name) {
  return "run: {name: " + name + ", rounds: 2}\nmodel: {name: mlp}\n"
         "train: {local_epochs: 1, batch_size: 32, lr: 0.05}\n";
}

// ---- The policy ----

TEST_F(ServiceTest, APolicyGrantsRightsByIdentityAndToken) {
  const std::string token_hash = Sha256Hex("alice-secret");
  auto p = AccessPolicy::Parse("identities:\n  alice: [submit]\n  carol: [read, cancel]\n  ops: [admin]\n"
                               "tokens:\n  " + token_hash + ": alice\n",
                               "policy.yaml");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->Has("alice", Right::kSubmit));
  EXPECT_FALSE(p->Has("alice", Right::kRead));
  EXPECT_TRUE(p->Has("carol", Right::kCancel));
  EXPECT_FALSE(p->Has("carol", Right::kSubmit));
  for (Right r : {Right::kSubmit, Right::kRead, Right::kCancel, Right::kAdmin}) EXPECT_TRUE(p->Has("ops", r));
  EXPECT_FALSE(p->Has("mallory", Right::kRead));
  EXPECT_EQ(p->IdentityOfToken("alice-secret"), "alice");
  EXPECT_EQ(p->IdentityOfToken("alice-secreT"), "");
  EXPECT_EQ(p->IdentityOfToken(""), "");
}

TEST_F(ServiceTest, TheShippedPolicyLoads) {
  auto p = AccessPolicy::Load(std::string(CLEAVE_SOURCE_DIR) + "/deploy/daemon-policy.yaml");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->Has("operator", Right::kAdmin));
}

TEST_F(ServiceTest, ABadPolicyIsRefusedNamingItsLine) {
  struct Case {
    std::string yaml, needle;
  };
  for (const Case& c : std::vector<Case>{
           {"identities:\n  alice: [submit]\n  bob: [rule]\n", "policy.yaml:3: unknown right rule"},
           {"identities:\n  alice: submit\n", "policy.yaml:2: alice: a list of rights"},
           {"tokens:\n  abc: alice\n", "policy.yaml:2: a token is named by its SHA-256"},
           {"identity:\n  alice: [submit]\n", "policy.yaml:1: unknown key identity"},
           {"identities: [a, b\n", "policy.yaml:"},
       }) {
    auto p = AccessPolicy::Parse(c.yaml, "policy.yaml");
    ASSERT_FALSE(p.ok()) << c.yaml;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.needle), std::string::npos) << p.status();
  }
}

TEST_F(ServiceTest, APolicyFileIsReloadedAndABadEditKeepsTheLastGoodOne) {
  const std::string path = Write("policy.yaml", "identities:\n  alice: [read]\n");
  auto file = PolicyFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE((*file)->Current()->Has("alice", Right::kSubmit));
  Write("policy.yaml", "identities:\n  alice: [read, submit]\n");
  EXPECT_TRUE((*file)->Current()->Has("alice", Right::kSubmit));
  Write("policy.yaml", "identities:\n  alice: [read, submit, fly]\n");  // refused: the last stays
  EXPECT_TRUE((*file)->Current()->Has("alice", Right::kSubmit));
  Write("policy.yaml", "identities:\n  bob: [read]\n");
  EXPECT_FALSE((*file)->Current()->Has("alice", Right::kRead));
  EXPECT_TRUE((*file)->Current()->Has("bob", Right::kRead));
}

// ---- The store ----

TEST_F(ServiceTest, TheStoreQueuesJobsBoundedAndOnePerName) {
  int64_t now = 1000;
  auto store = JobStore::Open((dir_ / "jobs.db").string(), /*max_queued=*/2, [&] { return now; });
  ASSERT_TRUE(store.ok()) << store.status();
  auto a = (*store)->Submit("alice", "a", Job("a"), 2);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->id, "job-1");
  EXPECT_EQ(a->state, JobState::kQueued);
  EXPECT_EQ(a->digest, Sha256Hex(Job("a")));
  EXPECT_EQ(a->submitted_ms, 1000);
  auto same = (*store)->Submit("bob", "a", Job("a"), 2);
  EXPECT_EQ(same.status().code(), absl::StatusCode::kAlreadyExists) << same.status();
  ASSERT_TRUE((*store)->Submit("alice", "b", Job("b"), 2).ok());
  auto full = (*store)->Submit("alice", "c", Job("c"), 2);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  ASSERT_EQ((*store)->List().size(), 2u);

  // Started, it no longer counts against the queue; ended, its name is free again.
  auto started = (*store)->StartNext();
  ASSERT_TRUE(started.ok());
  EXPECT_EQ(started->id, "job-1");
  ASSERT_TRUE((*store)->Submit("alice", "c", Job("c"), 2).ok());
  ASSERT_TRUE((*store)->Finish("job-1", JobState::kSucceeded, "").ok());
  EXPECT_EQ((*store)->Get("job-1")->state, JobState::kSucceeded);
  auto again = (*store)->Cancel("job-1", "alice");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_EQ((*store)->Get("job-9").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->Get("../etc").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ServiceTest, TheStoreSurvivesARestartRequeuingRunningJobs) {
  const std::string db = (dir_ / "jobs.db").string();
  {
    auto store = JobStore::Open(db, 10);
    ASSERT_TRUE(store.ok());
    for (const char* name : {"a", "b", "c", "d"}) ASSERT_TRUE((*store)->Submit("alice", name, Job(name), 2).ok());
    ASSERT_TRUE((*store)->StartNext().ok());  // job-1 running
    ASSERT_TRUE((*store)->StartNext().ok());  // job-2 running, then cancelled while it runs
    ASSERT_TRUE((*store)->Cancel("job-2", "carol").ok());
    ASSERT_TRUE((*store)->Cancel("job-3", "carol").ok());  // queued: cancelled at once
    ASSERT_TRUE((*store)->Progress("job-1", 1, true, 0.7, 0.8).ok());
  }  // the daemon "dies" here: nothing else was written
  auto store = JobStore::Open(db, 10);
  ASSERT_TRUE(store.ok());
  const std::vector<JobRecord> jobs = (*store)->List();
  ASSERT_EQ(jobs.size(), 4u);
  EXPECT_EQ(jobs[0].state, JobState::kQueued);  // resumes from its checkpoint
  EXPECT_GT(jobs[0].started_ms, 0);
  EXPECT_EQ(jobs[0].committed_round, 1);
  EXPECT_EQ(jobs[1].state, JobState::kCancelled);
  EXPECT_EQ(jobs[1].reason, "cancelled by carol");
  EXPECT_EQ(jobs[2].state, JobState::kCancelled);
  EXPECT_EQ(jobs[3].state, JobState::kQueued);
  // Queued again, the oldest starts first.
  EXPECT_EQ((*store)->StartNext()->id, "job-1");
  const std::vector<AuditEntry> audit = (*store)->AuditLog();
  ASSERT_EQ(audit.size(), 6u);  // four submissions, two cancellations
  EXPECT_EQ(audit[4].who, "carol");
  EXPECT_EQ(audit[4].action, "cancel");
  EXPECT_EQ(audit[4].job, "job-2");
  EXPECT_EQ(audit[4].digest, Sha256Hex(Job("b")));
}

// ---- The forecast ----

TEST_F(ServiceTest, AJobsEndIsForecastAtThePaceOfItsCommittedRounds) {
  EXPECT_EQ(ForecastEnd({}, 0, 10), 0);
  EXPECT_EQ(ForecastEnd({{1, 10'000}}, 2.0, 5), 18'000);  // one round: its wall time
  // Resumed after round 2: rounds 3 to 5 came every 2 s, 5 are left.
  EXPECT_EQ(ForecastEnd({{3, 1'000}, {4, 3'000}, {5, 5'000}}, 9.0, 10), 15'000);
  EXPECT_EQ(ForecastEnd({{9, 1'000}, {10, 4'000}}, 3.0, 10), 4'000);  // done
  // The pace of the last five rounds: 1 s each after three of 5 s (fewer clients then).
  EXPECT_EQ(ForecastEnd({{1, 0}, {2, 5'000}, {3, 10'000}, {4, 11'000}, {5, 12'000}, {6, 13'000}, {7, 14'000},
                         {8, 15'000}},
                        1.0, 10),
            17'000);  // (15000 - 10000) / 5 = 1000 ms a round, 2 left
}

// A job that ends at a target accuracy ends where its accuracy, a straight line in
// ln(round), reaches it: 0.5 + 0.1 ln(r) reaches 0.8 at r = e^3 = 20.1, so round 21.
TEST_F(ServiceTest, AJobWithATargetAccuracyIsForecastToEndWhereItsCurveReachesIt) {
  std::vector<std::pair<int64_t, double>> acc;
  for (int64_t r = 1; r <= 4; ++r) acc.emplace_back(r, 0.5 + 0.1 * std::log(static_cast<double>(r)));
  EXPECT_EQ(RoundsToTarget(acc, 0.8, 100), 21);
  EXPECT_EQ(RoundsToTarget(acc, 0.8, 15), 15) << "capped at run.rounds";
  EXPECT_EQ(RoundsToTarget(acc, 0, 100), 100) << "no target";
  EXPECT_EQ(RoundsToTarget({{1, 0.5}}, 0.8, 100), 100) << "one point: no line";
  EXPECT_EQ(RoundsToTarget({{1, 0.6}, {2, 0.5}}, 0.8, 100), 100) << "falling: no line";
  EXPECT_EQ(RoundsToTarget({{1, 0.6}, {2, 0.81}}, 0.8, 100), 2) << "reached";
  // A line that reached the target before the last evaluated round (which did not): the
  // next round.
  EXPECT_EQ(RoundsToTarget({{1, 0.5}, {2, 0.8}, {3, 0.75}}, 0.78, 100), 4);
}

TEST_F(ServiceTest, MetricsShowEveryLiveJobAndTheLastEndedOnes) {
  std::vector<JobRecord> jobs;
  for (int i = 1; i <= 30; ++i) {
    JobRecord j;
    j.id = "job-" + std::to_string(i);
    j.name = i == 30 ? "a \"quoted\" name" : "n" + std::to_string(i);
    j.submitter = "alice";
    j.state = i <= 27 ? JobState::kSucceeded : i == 28 ? JobState::kRunning : JobState::kQueued;
    j.total_rounds = 10;
    j.committed_round = i == 28 ? 4 : i <= 27 ? 10 : 0;
    j.evaluated = i <= 28;
    j.accuracy = 0.5;
    j.expected_end_ms = i == 28 ? 1'700'000'000'000 : 0;
    jobs.push_back(j);
  }
  const std::string text = DaemonMetricsText(jobs, 123456);
  EXPECT_NE(text.find("cleave_daemon_jobs{state=\"succeeded\"} 27\n"), std::string::npos) << text;
  EXPECT_NE(text.find("cleave_daemon_jobs{state=\"queued\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("cleave_daemon_resident_bytes 123456\n"), std::string::npos);
  EXPECT_NE(text.find("cleave_job_committed_rounds{job=\"job-28\",name=\"n28\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("cleave_job_expected_end_timestamp_seconds{job=\"job-28\",name=\"n28\"} 1.7e+09\n"),
            std::string::npos);
  EXPECT_NE(text.find("name=\"a \\\"quoted\\\" name\""), std::string::npos) << text;
  // 3 live jobs and the 20 that ended last: job-8 to job-27, not job-7.
  EXPECT_NE(text.find("job=\"job-8\""), std::string::npos);
  EXPECT_EQ(text.find("job=\"job-7\""), std::string::npos);
  size_t infos = 0;
  for (size_t p = 0; (p = text.find("\ncleave_job_info{", p)) != std::string::npos; ++p) ++infos;
  EXPECT_EQ(infos, 23u);
}

// ---- The API ----

class DaemonApiTest : public ServiceTest {
 protected:
  // The API alone: jobs stay queued.
  virtual bool Paused() const { return true; }
  void SetUp() override {
    ServiceTest::SetUp();
    std::string policy = "identities:\n  alice: [submit]\n  bob: [submit]\n  carol: [read]\n  ops: [admin]\ntokens:\n";
    for (const char* who : {"alice", "bob", "carol", "ops"}) policy += "  " + Sha256Hex(std::string(who) + "-token") + ": " + who + "\n";
    DaemonOptions o;
    o.state_dir = (dir_ / "state").string();
    o.listen = "127.0.0.1:0";
    o.clients_listen = "127.0.0.1:0";
    o.policy = Write("policy.yaml", policy);
    o.insecure = true;
    o.paused = Paused();
    o.metrics_listen = "127.0.0.1:0";
    o.max_queued = 3;
    auto d = Daemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    stub_ = v1::Jobs::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(daemon_->port()),
                                                  grpc::InsecureChannelCredentials()));
    // A site in the pool, so that jobs on the default dataset are admitted.
    site_ = std::make_unique<testing::FakeSite>(PoolAddress(), testing::FakeSite::Hello("site"));
    ASSERT_TRUE(site_->welcomed());
  }
  void TearDown() override {
    site_.reset();
    daemon_.reset();
    ServiceTest::TearDown();
  }
  std::string PoolAddress() const { return "127.0.0.1:" + std::to_string(daemon_->pool_port()); }

  std::unique_ptr<grpc::ClientContext> As(const std::string& who) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!who.empty()) ctx->AddMetadata("authorization", "Bearer " + who + "-token");
    return ctx;
  }
  grpc::Status Submit(const std::string& who, const std::string& yaml, v1::JobInfo* out = nullptr) {
    v1::SubmitJobRequest req;
    req.set_config_yaml(yaml);
    v1::JobInfo reply;
    grpc::Status s = stub_->Submit(As(who).get(), req, &reply);
    if (out) *out = reply;
    return s;
  }
  std::vector<v1::JobInfo> List(const std::string& who, grpc::Status* status = nullptr) {
    v1::ListJobsReply reply;
    grpc::Status s = stub_->List(As(who).get(), v1::ListJobsRequest(), &reply);
    if (status) *status = s;
    return {reply.jobs().begin(), reply.jobs().end()};
  }
  grpc::Status Cancel(const std::string& who, const std::string& id) {
    v1::CancelJobRequest req;
    req.set_id(id);
    v1::JobInfo reply;
    return stub_->Cancel(As(who).get(), req, &reply);
  }

  // Job `id` once it is in `state` (or as last seen after a minute).
  v1::JobInfo AwaitState(const std::string& id, const std::string& state) {
    v1::JobInfo info;
    for (int i = 0; i < testing::ScaledSeconds(60) * 20; ++i) {
      v1::GetJobRequest get;
      get.set_id(id);
      if (stub_->Get(As("ops").get(), get, &info).ok() && info.state() == state) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return info;
  }

  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::Jobs::Stub> stub_;
  std::unique_ptr<testing::FakeSite> site_;
};

// The runner at work (no clients connect): a job that cannot start fails with its reason
// and the next one starts; a running job is stopped by a cancel.
class DaemonRunnerTest : public DaemonApiTest {
 protected:
  bool Paused() const override { return false; }
};

TEST_F(DaemonRunnerTest, AFailedJobEndsWithItsReasonAndTheNextRuns) {
  ASSERT_TRUE(Submit("alice", "run: {name: bad, rounds: 1}\nmodel: {name: mlp}\n"
                              "data: {test: \"fmnist:/nonexistent\"}\n").ok());
  ASSERT_TRUE(Submit("bob", "run: {name: waits, rounds: 1}\nmodel: {name: mlp}\n"
                            "clients: {min: 2, join_timeout_s: 600}\n").ok());
  const v1::JobInfo bad = AwaitState("job-1", "failed");
  ASSERT_EQ(bad.state(), "failed");
  EXPECT_NE(bad.reason().find("data.test: cannot open /nonexistent"), std::string::npos) << bad.reason();
  EXPECT_GT(bad.ended_unix_ms(), 0);
  ASSERT_EQ(AwaitState("job-2", "running").state(), "running");  // waiting for its clients
  ASSERT_TRUE(Cancel("bob", "job-2").ok());
  const v1::JobInfo cancelled = AwaitState("job-2", "cancelled");
  ASSERT_EQ(cancelled.state(), "cancelled");
  EXPECT_EQ(cancelled.reason(), "cancelled by bob");
}

TEST_F(DaemonApiTest, ACallerWithoutIdentityOrRightIsRefusedAndChangesNothing) {
  EXPECT_EQ(Submit("", Job("a")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Submit("mallory", Job("a")).error_code(), grpc::StatusCode::UNAUTHENTICATED);  // no such token
  const grpc::Status s = Submit("carol", Job("a"));  // a reader
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("carol may not submit"), std::string::npos) << s.error_message();
  EXPECT_TRUE(List("ops").empty());
  ASSERT_TRUE(Submit("alice", Job("a")).ok());
  EXPECT_EQ(Cancel("bob", "job-1").error_code(), grpc::StatusCode::PERMISSION_DENIED);  // not his job
  EXPECT_EQ(Cancel("carol", "job-1").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  const std::vector<v1::JobInfo> jobs = List("ops");
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].state(), "queued");

  // The audit log: the refusals and the submission, to an administrator only.
  v1::AuditReply audit;
  EXPECT_EQ(stub_->Audit(As("alice").get(), v1::AuditRequest(), &audit).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(stub_->Audit(As("ops").get(), v1::AuditRequest(), &audit).ok());
  ASSERT_EQ(audit.entries_size(), 4);
  EXPECT_EQ(audit.entries(0).who(), "carol");
  EXPECT_EQ(audit.entries(0).outcome(), "refused: permission denied");
  EXPECT_EQ(audit.entries(1).who(), "alice");
  EXPECT_EQ(audit.entries(1).job(), "job-1");
  EXPECT_EQ(audit.entries(1).digest(), Sha256Hex(Job("a")));
  EXPECT_EQ(audit.entries(2).who(), "bob");
  EXPECT_EQ(audit.entries(2).action(), "cancel");
  EXPECT_EQ(audit.entries(3).who(), "carol");
  EXPECT_GT(audit.entries(3).at_unix_ms(), 0);
}

TEST_F(DaemonApiTest, MetricsAndTheDashboardAreServed) {
  ASSERT_TRUE(Submit("alice", Job("a")).ok());
  httplib::Client http("127.0.0.1", daemon_->metrics_port());
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->body.find("cleave_daemon_jobs{state=\"queued\"} 1\n"), std::string::npos) << res->body;
  EXPECT_NE(res->body.find("cleave_job_info{job=\"job-1\",name=\"a\",state=\"queued\",submitter=\"alice\"} 1"),
            std::string::npos)
      << res->body;
  // The dashboard: the job and the attached site.
  res = http.Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(res->body.find("<td>job-1</td><td>a</td><td>alice</td><td class=\"queued\">queued</td>"),
            std::string::npos)
      << res->body;
  EXPECT_NE(res->body.find("<td>site</td><td>default (0)</td><td>-</td><td>no site policy</td>"), std::string::npos)
      << res->body;
}

TEST_F(ServiceTest, TheDashboardEscapesWhatSubmittersAndClientsNamed) {
  std::vector<JobRecord> jobs(25);
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].id = "job-" + std::to_string(i + 1);
    jobs[i].state = JobState::kSucceeded;
  }
  jobs[24].state = JobState::kRunning;
  jobs[24].name = "<script>alert(1)</script>";
  jobs[24].submitter = "a&b";
  jobs[24].committed_round = 3;
  jobs[24].total_rounds = 10;
  jobs[24].evaluated = true;
  jobs[24].accuracy = 0.8125;
  jobs[24].expected_end_ms = 1700000000000;
  PoolMemberView site;
  site.name = "site\"x";
  site.hello.add_datasets()->set_name("<b>");
  site.hello.mutable_policy()->set_given(true);
  site.jobs["job-25"] = {true, 7100};
  const std::string html = DaemonDashboardHtml(jobs, {site}, 64 << 20);
  EXPECT_EQ(html.find("<script>"), std::string::npos);
  EXPECT_EQ(html.find("<b>"), std::string::npos);
  EXPECT_NE(html.find("<td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td>a&amp;b</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("<td>3/10</td><td>0.8125</td>"), std::string::npos) << html;
  EXPECT_NE(html.find("<td>2023-11-14 22:13:20</td>"), std::string::npos) << html;  // the forecast end
  EXPECT_NE(html.find("<td>site&quot;x</td><td>&lt;b&gt; (0)</td><td>job-25</td><td>site policy, 1 job(s) at once"),
            std::string::npos)
      << html;
  EXPECT_NE(html.find("0 queued, 1 running, 25 submitted; 1 client(s) attached; 64 MiB resident"), std::string::npos);
  // The running job and the 20 that ended last: job-5 to job-24, not job-4.
  EXPECT_NE(html.find("<td>job-5</td>"), std::string::npos);
  EXPECT_EQ(html.find("<td>job-4</td>"), std::string::npos);
}

TEST_F(DaemonApiTest, EachSeesWhatTheyMayAndCancelsTheirOwn) {
  ASSERT_TRUE(Submit("alice", Job("a")).ok());
  ASSERT_TRUE(Submit("bob", Job("b")).ok());
  EXPECT_EQ(List("alice").size(), 1u);
  EXPECT_EQ(List("carol").size(), 2u);
  v1::GetJobRequest get;
  get.set_id("job-2");
  v1::JobInfo info;
  EXPECT_EQ(stub_->Get(As("alice").get(), get, &info).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(stub_->Get(As("carol").get(), get, &info).ok());
  EXPECT_EQ(info.submitter(), "bob");
  EXPECT_EQ(info.name(), "b");
  ASSERT_TRUE(Cancel("bob", "job-2").ok());
  const grpc::Status twice = Cancel("bob", "job-2");
  EXPECT_EQ(twice.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << twice.error_message();
  EXPECT_EQ(Cancel("ops", "job-7").error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Cancel("ops", "job-1").ok());  // admin: anyone's
  for (const v1::JobInfo& j : List("ops")) EXPECT_EQ(j.state(), "cancelled") << j.id();
}

TEST_F(DaemonApiTest, ABadJobIsRefusedNamingTheKey) {
  v1::JobInfo info;
  grpc::Status s = Submit("alice", Job("a") + "strategy: {name: fedavgg}\n");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("strategy.name"), std::string::npos) << s.error_message();
  s = Submit("alice", Job("a") + "trian: {}\n");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("trian"), std::string::npos) << s.error_message();
  s = Submit("alice", "run: [not, a, map");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  s = Submit("alice", Job("a") + "# " + std::string(2 << 20, 'x') + "\n");  // over 1 MiB
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("at most 1048576"), std::string::npos) << s.error_message();
  s = Submit("alice", std::string(5 << 20, 'x'));  // past what the API reads at all
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_TRUE(List("ops").empty());
}

TEST_F(DaemonApiTest, AFloodOfSubmissionsMeetsTheBoundedQueue) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Submit("alice", Job("j" + std::to_string(i))).ok());
  const grpc::Status full = Submit("alice", Job("j3"));
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << full.error_message();
  const grpc::Status same = Submit("bob", Job("j0"));
  EXPECT_EQ(same.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << same.error_message();
  ASSERT_TRUE(Cancel("alice", "job-1").ok());
  const grpc::Status named = Submit("bob", Job("j1"));
  EXPECT_EQ(named.error_code(), grpc::StatusCode::ALREADY_EXISTS) << named.error_message();
  EXPECT_TRUE(Submit("bob", Job("j0")).ok());  // job-1 (j0) was cancelled: its name is free
  EXPECT_EQ(List("ops").size(), 4u);
}

}  // namespace
}  // namespace cleave
