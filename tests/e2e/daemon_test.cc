// A daemon (cleave-server --daemon) with clients that stay (cleave-client --stay), driven
// by the operator's tool (cleave job): jobs run one after another or side by side over
// the same client processes, jobs the daemon was killed in resume when it comes back,
// and sites decline by their policy.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "cleave/v1/jobs.grpc.pb.h"
#include "core/files.h"
#include "core/parameter_set.h"
#include "tests/e2e/processes.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

class DaemonE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cleave_daemon_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "alice.token") << "alice-token\n";
    std::ofstream(dir_ / "policy.yaml") << "identities:\n  alice: [submit]\ntokens:\n  "
                                        << Sha256Hex("alice-token") << ": alice\n";
  }
  void TearDown() override {
    for (pid_t p : pids_) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
    if (!getenv("KEEP")) fs::remove_all(dir_);
  }

  pid_t Spawn(std::vector<std::string> argv, const std::string& out) {
    const pid_t pid = testing::SpawnBinary(std::move(argv), (dir_ / out).string());
    pids_.push_back(pid);
    return pid;
  }
  // The first start picks the clients' port (a free one, from the kernel: no port picked
  // in advance that another process could take meanwhile); a restart keeps it, for the
  // clients to come back to.
  pid_t StartDaemon(const std::string& out = "daemon.txt", std::vector<std::string> more = {}) {
    fs::remove(dir_ / "state" / "daemon.addr");
    fs::remove(dir_ / "state" / "pool.addr");
    std::vector<std::string> argv = {"cleave-server", "--daemon", "--state-dir", (dir_ / "state").string(), "--listen",
                                     "127.0.0.1:0", "--clients-listen", "127.0.0.1:" + std::to_string(clients_port_),
                                     "--policy", (dir_ / "policy.yaml").string(), "--insecure"};
    argv.insert(argv.end(), more.begin(), more.end());
    const pid_t pid = Spawn(std::move(argv), out);
    api_ = testing::WaitForAddress(dir_ / "state", "daemon.addr");
    const std::string pool = testing::WaitForAddress(dir_ / "state", "pool.addr");
    if (!pool.empty()) clients_port_ = std::stoi(pool.substr(pool.rfind(':') + 1));
    stub_ = v1::Jobs::NewStub(grpc::CreateChannel(api_, grpc::InsecureChannelCredentials()));
    return pid;
  }
  // Long-lived client i of `of`, exposing its part of 4000 Fashion-MNIST examples as its
  // default data (or, with `more`, as it says).
  pid_t StartClient(int i, int of = 2, std::vector<std::string> more = {}) {
    std::vector<std::string> argv = {"cleave-client", "--server", "127.0.0.1:" + std::to_string(clients_port_),
                                     "--insecure", "--stay", "--partition",
                                     "iid,client=" + std::to_string(i) + ",of=" + std::to_string(of) + ",seed=1",
                                     "--name", "c" + std::to_string(i)};
    if (more.empty()) more = {"--data", "fmnist:/usr/share/datasets/fashion-mnist,limit=4000"};
    argv.insert(argv.end(), more.begin(), more.end());
    return Spawn(std::move(argv), "client" + std::to_string(i) + ".txt");
  }
  // Whether client i attached to the pool (within a minute).
  bool Attached(int i) {
    return testing::WaitForText(dir_ / ("client" + std::to_string(i) + ".txt"), "attached to the pool");
  }
  // `cleave job ARGS...` as alice: its exit code, its output in *out.
  int Job(std::vector<std::string> args, std::string* out = nullptr) {
    std::vector<std::string> argv = {"cleave", "job", "--server", api_, "--insecure", "--token-file",
                                     (dir_ / "alice.token").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    const pid_t pid = testing::SpawnBinary(argv, (dir_ / "job.txt").string());
    const int rc = testing::WaitForExit(pid, 60);
    if (out) *out = ReadFile((dir_ / "job.txt").string()).value_or("");
    return rc;
  }
  // A job of `rounds` rounds of `per_round` clients each (0: every client it is given);
  // `data` adds keys to its data section.
  std::string WriteJob(const std::string& name, int rounds, const std::string& data = "", int per_round = 2) {
    const std::string path = (dir_ / (name + ".yaml")).string();
    std::ofstream(path) << "run: {name: " << name << ", rounds: " << rounds << "}\n"
                        << "model: {name: mlp}\n"
                        << "data: {test: \"fmnist:/usr/share/datasets/fashion-mnist\", test_limit: 1000" << data
                        << "}\n"
                        << "clients: {min: 2, per_round: " << per_round << ", quorum: 1.0, round_deadline_s: 120}\n"
                        << "train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}\n";
    return path;
  }
  // Job `id` once it ended (or the last seen after `timeout_s`).
  v1::JobInfo AwaitEnd(const std::string& id, int timeout_s = 300) {
    v1::JobInfo info;
    for (int i = 0; i < testing::ScaledSeconds(timeout_s) * 5; ++i) {
      grpc::ClientContext ctx;
      ctx.AddMetadata("authorization", "Bearer alice-token");
      v1::GetJobRequest req;
      req.set_id(id);
      if (stub_->Get(&ctx, req, &info).ok() && (info.state() == "succeeded" || info.state() == "failed" ||
                                                 info.state() == "cancelled")) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return info;
  }
  std::string Output(const std::string& name) { return ReadFile((dir_ / name).string()).value_or(""); }

  fs::path dir_;
  int clients_port_ = 0;
  std::string api_;
  std::unique_ptr<v1::Jobs::Stub> stub_;
  std::vector<pid_t> pids_;
};

TEST_F(DaemonE2eTest, TwoJobsRunOneAfterTheOtherOverClientsThatStay) {
  const pid_t daemon = StartDaemon();
  ASSERT_FALSE(api_.empty()) << Output("daemon.txt");
  const pid_t c0 = StartClient(0), c1 = StartClient(1);
  ASSERT_TRUE(Attached(0) && Attached(1)) << Output("daemon.txt");
  std::string out;
  ASSERT_EQ(Job({"submit", WriteJob("first", 2)}, &out), 0) << out;
  EXPECT_EQ(out, "job-1\n");
  ASSERT_EQ(Job({"submit", WriteJob("second", 2)}, &out), 0) << out;
  EXPECT_EQ(out, "job-2\n");

  for (const char* id : {"job-1", "job-2"}) {
    const v1::JobInfo info = AwaitEnd(id);
    ASSERT_EQ(info.state(), "succeeded") << id << ": " << info.reason() << "\n" << Output("daemon.txt");
    EXPECT_EQ(info.committed_round(), 2);
    EXPECT_TRUE(info.evaluated());
    EXPECT_GT(info.test_accuracy(), 0.6);
    const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "state" / "jobs" / id);
    ASSERT_EQ(rows.size(), 2u) << id;
    EXPECT_EQ(rows[1]["participants"], 2);
  }
  // The same two client processes served both jobs.
  EXPECT_EQ(waitpid(c0, nullptr, WNOHANG), 0) << Output("client0.txt");
  EXPECT_EQ(waitpid(c1, nullptr, WNOHANG), 0) << Output("client1.txt");
  for (const char* id : {"joins job-1", "joins job-2"}) EXPECT_NE(Output("client0.txt").find(id), std::string::npos);

  ASSERT_EQ(Job({"list"}, &out), 0) << out;
  EXPECT_NE(out.find("job-2     second              succeeded  alice       2/2"), std::string::npos) << out;
  ASSERT_EQ(Job({"logs", "job-2"}, &out), 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  const fs::path got = dir_ / "download";
  ASSERT_EQ(Job({"download", "job-1", "--out", got.string()}, &out), 0) << out;
  EXPECT_EQ(testing::MetricsRows(got).size(), 2u);
  EXPECT_TRUE(fs::exists(got / "checkpoint.pb"));
  EXPECT_TRUE(fs::exists(got / "config.yaml"));
  EXPECT_TRUE(fs::exists(got / "report.html"));
  EXPECT_FALSE(fs::exists(got / "tls"));
  // A job that already ended cannot be cancelled.
  EXPECT_NE(Job({"cancel", "job-1"}, &out), 0);
  EXPECT_NE(out.find("already ended"), std::string::npos) << out;

  kill(daemon, SIGTERM);
  EXPECT_EQ(testing::WaitForExit(daemon, 60), 0) << Output("daemon.txt");
}

TEST_F(DaemonE2eTest, AJobTheDaemonWasKilledInResumesWhenItComesBack) {
  StartDaemon();
  ASSERT_FALSE(api_.empty()) << Output("daemon.txt");
  StartClient(0);
  StartClient(1);
  ASSERT_TRUE(Attached(0) && Attached(1)) << Output("daemon.txt");
  std::string out;
  ASSERT_EQ(Job({"submit", WriteJob("long", 8)}, &out), 0) << out;
  const fs::path run = dir_ / "state" / "jobs" / "job-1";
  for (int i = 0; i < testing::ScaledSeconds(240) * 10 && testing::MetricsRows(run).size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(testing::MetricsRows(run).size(), 2u) << Output("daemon.txt");
  {  // Running, with rounds committed: its end is forecast, after its start.
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer alice-token");
    v1::GetJobRequest req;
    req.set_id("job-1");
    v1::JobInfo info;
    ASSERT_TRUE(stub_->Get(&ctx, req, &info).ok());
    EXPECT_EQ(info.state(), "running");
    EXPECT_GT(info.expected_end_unix_ms(), info.started_unix_ms());
  }
  kill(pids_[0], SIGKILL);  // mid-round: a round past the second is running
  waitpid(pids_[0], nullptr, 0);

  StartDaemon("daemon2.txt");
  ASSERT_FALSE(api_.empty()) << Output("daemon2.txt");
  const v1::JobInfo info = AwaitEnd("job-1");
  ASSERT_EQ(info.state(), "succeeded") << info.reason() << "\n" << Output("daemon2.txt");
  // Every round once: resumed from the checkpoint, nothing run twice.
  const std::vector<nlohmann::json> rows = testing::MetricsRows(run);
  ASSERT_EQ(rows.size(), 8u);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(rows[r]["round"], r + 1);
  EXPECT_NE(Output("daemon2.txt").find("resum"), std::string::npos) << Output("daemon2.txt");
}

TEST_F(DaemonE2eTest, TwoJobsShareThePoolAtOnceAndBothResumeAfterAKill) {
  StartDaemon("daemon.txt", {"--scheduler", "fair"});
  ASSERT_FALSE(api_.empty()) << Output("daemon.txt");
  // Both jobs are submitted while one client is attached (neither can run a round with
  // it alone), so that they start together when the others attach, two clients each:
  // neither can be near its end when the other has begun, however loaded the machine.
  StartClient(0, 4);
  ASSERT_TRUE(Attached(0)) << Output("client0.txt");
  std::string out;
  constexpr int kRounds = 60;  // a round takes about 0.1 s here
  ASSERT_EQ(Job({"submit", WriteJob("a", kRounds)}, &out), 0) << out;
  ASSERT_EQ(Job({"submit", WriteJob("b", kRounds)}, &out), 0) << out;
  for (int i = 1; i < 4; ++i) StartClient(i, 4);
  for (int i = 1; i < 4; ++i) ASSERT_TRUE(Attached(i)) << Output("client" + std::to_string(i) + ".txt");
  const fs::path a = dir_ / "state" / "jobs" / "job-1", b = dir_ / "state" / "jobs" / "job-2";
  for (int i = 0; i < testing::ScaledSeconds(240) * 10 &&
                  (testing::MetricsRows(a).size() < 2 || testing::MetricsRows(b).size() < 2);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Both run at once, two clients each.
  ASSERT_GE(testing::MetricsRows(a).size(), 2u) << Output("daemon.txt");
  ASSERT_GE(testing::MetricsRows(b).size(), 2u) << Output("daemon.txt");
  ASSERT_LT(testing::MetricsRows(a).size(), static_cast<size_t>(kRounds));
  ASSERT_LT(testing::MetricsRows(b).size(), static_cast<size_t>(kRounds));
  kill(pids_[0], SIGKILL);  // mid-round in both
  waitpid(pids_[0], nullptr, 0);

  StartDaemon("daemon2.txt", {"--scheduler", "fair"});
  ASSERT_FALSE(api_.empty()) << Output("daemon2.txt");
  for (const char* id : {"job-1", "job-2"}) {
    const v1::JobInfo info = AwaitEnd(id);
    ASSERT_EQ(info.state(), "succeeded") << id << ": " << info.reason() << "\n" << Output("daemon2.txt");
    const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "state" / "jobs" / id);
    ASSERT_EQ(rows.size(), static_cast<size_t>(kRounds)) << id;
    for (int r = 0; r < kRounds; ++r) {
      EXPECT_EQ(rows[r]["round"], r + 1) << id;  // each round once
      EXPECT_EQ(rows[r]["participants"], 2) << id;
    }
  }
  // The same four client processes served both jobs, before and after the kill.
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(waitpid(pids_[i], nullptr, WNOHANG), 0) << Output("client0.txt");
}

// A job that arrives while another holds every client takes its share: the scheduler
// releases two clients from the first and offers them the second at once, and each
// takes it (its seat is free once it left the first: no decline for lack of room).
TEST_F(DaemonE2eTest, AJobThatArrivesTakesItsShareFromARunningOne) {
  StartDaemon("daemon.txt", {"--scheduler", "fair"});
  ASSERT_FALSE(api_.empty()) << Output("daemon.txt");
  for (int i = 0; i < 4; ++i) StartClient(i, 4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Attached(i)) << Output("client" + std::to_string(i) + ".txt");
  std::string out;
  ASSERT_EQ(Job({"submit", WriteJob("a", 400, "", /*per_round=*/0)}, &out), 0) << out;
  const fs::path a = dir_ / "state" / "jobs" / "job-1";
  auto all_four = [&] {  // a round of a's with every client (some may join after its first)
    const std::vector<nlohmann::json> rows = testing::MetricsRows(a);
    return !rows.empty() && rows.back()["participants"] == 4;
  };
  for (int i = 0; i < testing::ScaledSeconds(120) * 10 && !all_four(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(all_four()) << Output("daemon.txt");
  ASSERT_EQ(Job({"submit", WriteJob("b", 3)}, &out), 0) << out;
  const v1::JobInfo b = AwaitEnd("job-2");
  ASSERT_EQ(b.state(), "succeeded") << b.reason() << "\n" << Output("daemon.txt");
  EXPECT_EQ(b.declines_size(), 0) << b.declines(0).client() << ": " << b.declines(0).reason();
  ASSERT_EQ(Job({"cancel", "job-1"}, &out), 0) << out;
}

TEST_F(DaemonE2eTest, AClientThatComesBackRejoinsEveryJobItWasIn) {
  // Both clients train both jobs at once (their policies allow two).
  std::ofstream(dir_ / "two.yaml") << "datasets: {default: [\"*\"]}\nmax_concurrent_jobs: 2\n";
  const std::vector<std::string> args = {"--data", "fmnist:/usr/share/datasets/fashion-mnist,limit=4000",
                                         "--site-policy", (dir_ / "two.yaml").string()};
  StartDaemon();
  ASSERT_FALSE(api_.empty()) << Output("daemon.txt");
  StartClient(0, 2, args);
  const pid_t c1 = StartClient(1, 2, args);
  ASSERT_TRUE(Attached(0) && Attached(1)) << Output("daemon.txt");
  std::string out;
  ASSERT_EQ(Job({"submit", WriteJob("a", 20)}, &out), 0) << out;
  ASSERT_EQ(Job({"submit", WriteJob("b", 20)}, &out), 0) << out;
  const fs::path a = dir_ / "state" / "jobs" / "job-1", b = dir_ / "state" / "jobs" / "job-2";
  for (int i = 0; i < testing::ScaledSeconds(240) * 10 &&
                  (testing::MetricsRows(a).empty() || testing::MetricsRows(b).empty());
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(testing::MetricsRows(a).empty() || testing::MetricsRows(b).empty()) << Output("daemon.txt");
  kill(c1, SIGKILL);  // both jobs need two clients: they wait for it
  waitpid(c1, nullptr, 0);
  fs::rename(dir_ / "client1.txt", dir_ / "client1-before.txt");
  StartClient(1, 2, args);
  for (const char* id : {"job-1", "job-2"}) {
    const v1::JobInfo info = AwaitEnd(id);
    ASSERT_EQ(info.state(), "succeeded") << id << ": " << info.reason() << "\n" << Output("daemon.txt");
    EXPECT_EQ(testing::MetricsRows(dir_ / "state" / "jobs" / id).back()["participants"], 2) << id;
  }
  EXPECT_NE(Output("client1.txt").find("joins job-1"), std::string::npos) << Output("client1.txt");
  EXPECT_NE(Output("client1.txt").find("joins job-2"), std::string::npos) << Output("client1.txt");
}

// A site whose policy allows three rounds a day trains three, then pauses and leaves its
// job, which waits for it (not failed, no fourth round); a restart of the client keeps
// the count (STATE_DIR/usage.ledger): it pauses again as it attaches.
TEST_F(DaemonE2eTest, ASiteThatSpentItsDailyRoundsPausesAndStaysPausedAcrossARestart) {
  std::ofstream(dir_ / "daily.yaml") << "datasets: {default: [\"*\"]}\nmax_rounds_per_day: 3\n";
  const std::vector<std::string> args = {"--data",        "fmnist:/usr/share/datasets/fashion-mnist,limit=2000",
                                         "--site-policy", (dir_ / "daily.yaml").string(),
                                         "--state-dir",   (dir_ / "site").string()};
  StartDaemon();
  ASSERT_FALSE(api_.empty()) << Output("daemon.txt");
  const pid_t site = StartClient(0, 1, args);
  ASSERT_TRUE(Attached(0)) << Output("client0.txt");
  const std::string job = (dir_ / "job.yaml").string();
  std::ofstream(job) << "run: {name: daily, rounds: 10}\nmodel: {name: mlp}\n"
                     << "data: {test: \"fmnist:/usr/share/datasets/fashion-mnist\", test_limit: 500}\n"
                     << "clients: {min: 1, round_deadline_s: 120, join_timeout_s: 600}\n";
  std::string out;
  ASSERT_EQ(Job({"submit", job}, &out), 0) << out;
  ASSERT_TRUE(testing::WaitForText(dir_ / "client0.txt", "pauses until")) << Output("client0.txt");
  EXPECT_NE(Output("client0.txt").find("3 tasks trained in 24 hours, its policy's max_rounds_per_day"),
            std::string::npos)
      << Output("client0.txt");
  const fs::path run = dir_ / "state" / "jobs" / "job-1";
  for (int i = 0; i < testing::ScaledSeconds(60) * 10 && testing::MetricsRows(run).size() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(testing::MetricsRows(run).size(), 3u) << Output("daemon.txt");
  ASSERT_TRUE(testing::WaitForText(dir_ / "daemon.txt", "pauses until")) << Output("daemon.txt");

  kill(site, SIGKILL);
  waitpid(site, nullptr, 0);
  fs::rename(dir_ / "client0.txt", dir_ / "client0-before.txt");
  StartClient(0, 1, args);
  ASSERT_TRUE(testing::WaitForText(dir_ / "client0.txt", "pauses until")) << Output("client0.txt");
  ASSERT_EQ(Job({"status", "job-1"}, &out), 0) << out;
  EXPECT_NE(out.find("running"), std::string::npos) << out;
  EXPECT_EQ(testing::MetricsRows(run).size(), 3u) << "no round without the paused site";
  EXPECT_EQ(Output("client0.txt").find("joins job-1"), std::string::npos) << Output("client0.txt");
}

TEST_F(DaemonE2eTest, SitesExposeNamedDataAndDeclineWhatTheirPolicyRefuses) {
  std::ofstream(dir_ / "small.yaml") << "datasets: {fmnist: [\"*\"]}\nmax_parameters: 1000\n";
  std::ofstream(dir_ / "broken.yaml") << "datasets: {fmnist: [\"*\"]}\nmax_rounds: 0\n";
  const std::string fmnist = "fmnist=fmnist:/usr/share/datasets/fashion-mnist,limit=4000";
  // A site policy that does not parse: the client refuses to start, naming the line.
  const pid_t broken = StartClient(9, 3, {"--dataset", fmnist, "--site-policy", (dir_ / "broken.yaml").string()});
  EXPECT_EQ(testing::WaitForExit(broken, 60), 2);
  EXPECT_NE(Output("client9.txt").find("broken.yaml:2: max_rounds is at least 1"), std::string::npos)
      << Output("client9.txt");

  StartDaemon();
  ASSERT_FALSE(api_.empty()) << Output("daemon.txt");
  // A --stay client pointed at a port that serves no pool (the job API's) gives up at
  // once, saying so.
  const pid_t lost = Spawn({"cleave-client", "--server", api_, "--insecure", "--stay", "--dataset", fmnist},
                           "lost.txt");
  EXPECT_EQ(testing::WaitForExit(lost, 60), 1);
  EXPECT_NE(Output("lost.txt").find("serves no pool: --stay attaches to cleave-server --daemon's --clients-listen"),
            std::string::npos)
      << Output("lost.txt");
  StartClient(0, 3, {"--dataset", fmnist});
  StartClient(1, 3, {"--dataset", fmnist});
  StartClient(2, 3, {"--dataset", fmnist, "--site-policy", (dir_ / "small.yaml").string()});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Attached(i)) << Output("client" + std::to_string(i) + ".txt");
  std::string out;
  // A dataset no client exposes: refused at submission.
  EXPECT_NE(Job({"submit", WriteJob("nowhere", 1, ", dataset: xray")}, &out), 0);
  EXPECT_NE(out.find("exposes no dataset xray"), std::string::npos) << out;
  // c2's policy takes no model of more than 1000 parameters: the daemon, which holds the
  // policy c2 sent, does not offer it the job (which takes every client it is given) and
  // shows why; the others run it.
  ASSERT_EQ(Job({"submit", WriteJob("named", 2, ", dataset: fmnist", 0)}, &out), 0) << out;
  const v1::JobInfo info = AwaitEnd("job-1");
  ASSERT_EQ(info.state(), "succeeded") << info.reason() << "\n" << Output("daemon.txt");
  EXPECT_GT(info.test_accuracy(), 0.6);
  ASSERT_EQ(Job({"status", "job-1"}, &out), 0) << out;
  EXPECT_NE(out.find("declined by c2: a model of "), std::string::npos) << out;
  EXPECT_NE(out.find("parameters; its policy accepts at most 1000"), std::string::npos) << out;
  EXPECT_EQ(Output("client2.txt").find("joins job-1"), std::string::npos) << Output("client2.txt");
}

}  // namespace
}  // namespace cleave
