// SecAgg+ over the wire against plain FedAvg, same run: one round with 10, 50 and 100
// clients on a 1M-parameter update, over loopback gRPC.
//   bench_secagg_wire [--params N] [--k K] [--t T]
// The server runs in this process; the clients are threads of a second process (this
// binary re-executed with --peers), each speaking the real protocol (SecAggClient)
// without training: the update is a fixed random delta, and the model is not
// downloaded (the same in both). Reported per configuration:
//   client ms   mean CPU time of one client's protocol thread (keys, shares, quantize,
//               mask, encode, reveal; plain: encoding the update)
//   server ms   CPU time of the server process over the round (all its threads)
//   round s     the round's wall time
//   up/down kB  transport bytes per client (the server's bytes_up / bytes_down)
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/spawn.h"
#include "client/secagg_client.h"
#include "client/transfer.h"
#include "server/server.h"
#include "job/job.h"

using namespace cleave;

namespace {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// The client process: `clients` peers join, each does its task on its own thread and
// adds its CPU seconds to the total written to `out`.
int RunPeers(int port, int clients, int64_t params, bool secure, const std::string& out) {
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  ParameterSet delta;
  {
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal(0, 0.01f);
    std::vector<float> v(params);
    for (auto& x : v) x = normal(rng);
    delta.Add({"w", {params}, std::move(v)}).IgnoreError();
  }
  const std::string plain_payload = secure ? "" : delta.Encode();
  std::atomic<int> failed{0};
  std::vector<double> cpu(clients, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      auto stream = stub->Control(&ctx);
      v1::ClientMessage m;
      m.mutable_join()->set_num_examples(100);
      m.mutable_join()->set_protocol_version(1);
      m.mutable_join()->add_codecs("fp32");
      m.mutable_join()->add_codecs("secagg");
      v1::ServerMessage r;
      if (!stream->Write(m) || !stream->Read(&r) || !r.has_welcome()) {
        ++failed;
        return;
      }
      const v1::Welcome w = r.welcome();
      if (!stream->Read(&r) || !r.has_task()) {
        ++failed;
        return;
      }
      const v1::Task task = r.task();
      const double t0 = ThreadCpuSeconds();
      Status s;
      if (secure) {
        NextMessage next = [&](v1::ServerMessage* msg) -> Status {
          if (stream->Read(msg)) return absl::OkStatus();
          return absl::UnavailableError("stream closed");
        };
        auto sa = SecAggClient::Prepare(stub.get(), w, task, next);
        s = sa.ok() ? sa->Submit(stub.get(), w, task, delta, 100, 100, 0.5, 1, nullptr, next).status()
                    : sa.status();
      } else {
        s = UploadPayload(stub.get(), TaskUploadHeader(w, task, 100, "fp32"), plain_payload).status();
      }
      cpu[i] = ThreadCpuSeconds() - t0;
      if (!s.ok()) {
        std::fprintf(stderr, "peer %d: %s\n", i, s.ToString().c_str());
        ++failed;
      }
      ctx.TryCancel();
      stream->Finish().ok();
    });
  }
  for (auto& t : threads) t.join();
  double sum = 0;
  for (double c : cpu) sum += c;
  std::ofstream(out) << sum / clients << "\n";
  return failed ? 1 : 0;
}

struct Row {
  double client_ms = 0, server_ms = 0, round_s = 0, up_kb = 0, down_kb = 0;
};

Row RunRound(const std::string& self, int clients, int64_t params, bool secure, int k, int t) {
  ParameterSet model;
  model.Add({"w", {params}, std::vector<float>(params, 0.5f)}).IgnoreError();
  ServerOptions o;
  o.config = *ParseJob(
      absl::StrCat("run: {rounds: 1}\nmodel: {name: mlp}\n",
                   "clients: {min: ", clients, ", quorum: 1.0, round_deadline_s: 600, "
                   "join_timeout_s: 600}\nserver: {client_timeout_s: 600}\n",
                   secure ? absl::StrCat("secure_aggregation: {k: ", k, ", t: ", t,
                                         ", stage_timeout_s: 300}\n")
                          : ""),
      "");
  o.listen = "127.0.0.1:0";
  o.insecure = true;
  o.evaluate = false;
  o.initial_model = std::move(model);
  auto server = *Server::Create(std::move(o));
  if (!server->Start().ok()) std::exit(1);
  const std::string out = absl::StrCat("/tmp/bench_secagg_wire.", getpid());
  std::vector<std::string> argv = {self, "--peers", std::to_string(clients), "--port",
                                   std::to_string(server->port()), "--params",
                                   std::to_string(params), "--secure", secure ? "1" : "0",
                                   "--out", out};
  const pid_t pid = SpawnExec(argv);
  const double cpu0 = ProcessCpuSeconds();
  Status s = server->Run();
  const double server_cpu = ProcessCpuSeconds() - cpu0;
  int status = 0;
  waitpid(pid, &status, 0);
  if (!s.ok() || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "round failed: %s (peers exit %d)\n", s.ToString().c_str(), status);
    std::exit(1);
  }
  const RoundMetrics m = server->History().at(0);
  Row r;
  std::ifstream in(out);
  in >> r.client_ms;
  std::remove(out.c_str());
  r.client_ms *= 1e3;
  r.server_ms = 1e3 * server_cpu;
  r.round_s = m.wall_s;
  r.up_kb = m.bytes_up / 1e3 / clients;
  r.down_kb = m.bytes_down / 1e3 / clients;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 1'000'000;
  int k = 8, t = 5, peers = 0, port = 0;
  bool secure = false;
  std::string out;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--params") params = std::atoll(argv[i + 1]);
    if (a == "--k") k = std::atoi(argv[i + 1]);
    if (a == "--t") t = std::atoi(argv[i + 1]);
    if (a == "--peers") peers = std::atoi(argv[i + 1]);
    if (a == "--port") port = std::atoi(argv[i + 1]);
    if (a == "--secure") secure = std::atoi(argv[i + 1]) != 0;
    if (a == "--out") out = argv[i + 1];
  }
  spdlog::set_level(spdlog::level::warn);
  if (peers > 0) return RunPeers(port, peers, params, secure, out);

  char self[4096] = {0};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return 1;
  std::printf("one round, %lld-parameter update, SecAgg+ k = %d, t = %d, over loopback\n",
              static_cast<long long>(params), k, t);
  std::printf("| clients | | client ms | server ms | round s | up kB/client | down kB/client |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int n : {10, 50, 100}) {
    const Row plain = RunRound(self, n, params, false, k, t);
    const Row sa = RunRound(self, n, params, true, k, t);
    std::printf("| %d | plain | %.1f | %.0f | %.2f | %.1f | %.1f |\n", n, plain.client_ms,
                plain.server_ms, plain.round_s, plain.up_kb, plain.down_kb);
    std::printf("| | SecAgg+ | %.1f | %.0f | %.2f | %.1f | %.1f |\n", sa.client_ms, sa.server_ms,
                sa.round_s, sa.up_kb, sa.down_kb);
    std::printf("| | ratio | %.2f | %.2f | %.2f | %.3f | %.3f |\n", sa.client_ms / plain.client_ms,
                sa.server_ms / plain.server_ms, sa.round_s / plain.round_s, sa.up_kb / plain.up_kb,
                sa.down_kb / plain.down_kb);
    std::fflush(stdout);
  }
  return 0;
}
