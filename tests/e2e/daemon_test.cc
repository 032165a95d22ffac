// A daemon (cleave-server --daemon) with clients that stay (cleave-client --stay), driven
// by the operator's tool (cleave job): jobs run one after another over the same client
// processes, and a job the daemon was killed in resumes when it comes back.
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
    clients_port_ = testing::FreePort();
    ASSERT_GT(clients_port_, 0);
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
  pid_t StartDaemon(const std::string& out = "daemon.txt") {
    fs::remove(dir_ / "state" / "daemon.addr");
    const pid_t pid = Spawn({"cleave-server", "--daemon", "--state-dir", (dir_ / "state").string(), "--listen",
                             "127.0.0.1:0", "--clients-listen", "127.0.0.1:" + std::to_string(clients_port_),
                             "--policy", (dir_ / "policy.yaml").string(), "--insecure"},
                            out);
    api_ = testing::WaitForAddress(dir_ / "state", "daemon.addr");
    stub_ = v1::Jobs::NewStub(grpc::CreateChannel(api_, grpc::InsecureChannelCredentials()));
    return pid;
  }
  pid_t StartClient(int i) {
    return Spawn({"cleave-client", "--server", "127.0.0.1:" + std::to_string(clients_port_), "--insecure", "--stay",
                  "--data", "fmnist:/usr/share/datasets/fashion-mnist,limit=4000", "--partition",
                  "iid,client=" + std::to_string(i) + ",of=2,seed=1", "--name", "c" + std::to_string(i)},
                 "client" + std::to_string(i) + ".txt");
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
  std::string WriteJob(const std::string& name, int rounds) {
    const std::string path = (dir_ / (name + ".yaml")).string();
    std::ofstream(path) << "run: {name: " << name << ", rounds: " << rounds << "}\n"
                        << "model: {name: mlp}\n"
                        << "data: {test: \"fmnist:/usr/share/datasets/fashion-mnist\", test_limit: 1000}\n"
                        << "clients: {min: 2, quorum: 1.0, round_deadline_s: 120}\n"
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
  EXPECT_NE(Output("client0.txt").find("--stay: waiting for the next"), std::string::npos);

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

}  // namespace
}  // namespace cleave
