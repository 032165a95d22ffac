// Server CPU per round: 100 no-op clients, a 1M-parameter model, FedAvg, every client
// every round (issue 16's setting; target <= 0.3 s of server CPU a round).
// The server runs in this process, the clients in a forked child over loopback: each
// client downloads the round's model and uploads a fixed update, nothing else, so
// what the parent process spends (user + system CPU, getrusage) is the coordinator's
// cost: the transport on both directions, validation, aggregation, publishing.
//   bench_server_cpu [--params N] [--clients C] [--rounds R]
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/process.h"
#include "client/transfer.h"
#include "server/server.h"
#include "job/job.h"

using namespace cleave;

namespace {

// The child: `clients` peers, each in its own thread and connection, that join and then
// for every task fetch the model and upload `payload`, until the run ends.
int RunClients(int port, int clients, int64_t params) {
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  ParameterSet delta;
  delta.Add({"w", {params}, std::vector<float>(params, 1e-3f)}).IgnoreError();
  const std::string payload = delta.Encode();
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&] {
      auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      auto stream = stub->Control(&ctx);
      v1::ClientMessage m;
      m.mutable_join()->set_num_examples(1);
      m.mutable_join()->set_protocol_version(1);
      m.mutable_join()->add_codecs("fp32");
      v1::ServerMessage r;
      if (!stream->Write(m) || !stream->Read(&r) || !r.has_welcome()) {
        ++failed;
        return;
      }
      const v1::Welcome w = r.welcome();
      while (stream->Read(&r)) {
        if (r.has_run_ended()) break;
        if (!r.has_task()) continue;
        const v1::Task& t = r.task();
        if (!FetchBlob(stub.get(), w.client_id(), w.session_token(), t.model_digest()).ok()) {
          ++failed;
          break;
        }
        v1::UploadHeader h;
        h.set_run_id(t.run_id());
        h.set_client_id(w.client_id());
        h.set_session_token(w.session_token());
        h.set_round(t.round());
        h.set_task_id(t.task_id());
        h.set_num_examples(1);
        h.set_codec("fp32");
        if (!UploadPayload(stub.get(), h, payload).ok()) {
          ++failed;
          break;
        }
      }
      ctx.TryCancel();
      stream->Finish().IgnoreError();
    });
  }
  for (auto& t : threads) t.join();
  return failed ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 1'000'000;
  int clients = 100, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--params")) params = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--clients")) clients = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  }
  int pipefd[2];
  if (pipe(pipefd) != 0) return 1;
  pid_t child = fork();  // before any gRPC or thread exists
  if (child == 0) {
    close(pipefd[1]);
    int port = 0;
    if (read(pipefd[0], &port, sizeof(port)) != sizeof(port)) _exit(9);
    _exit(RunClients(port, clients, params));
  }
  close(pipefd[0]);

  ParameterSet model;
  model.Add({"w", {params}, std::vector<float>(params, 0.5f)}).IgnoreError();
  ServerOptions o;
  auto cfg = ParseJob(
      "run: {rounds: " + std::to_string(rounds) + "}\nmodel: {name: mlp}\nclients: {min: " +
          std::to_string(clients) + ", quorum: 1.0, round_deadline_s: 600, join_timeout_s: 600}\n"
          "server: {client_timeout_s: 600}\n",
      "");
  o.config = *cfg;
  o.listen = "127.0.0.1:0";
  o.insecure = true;
  o.evaluate = false;
  o.initial_model = std::move(model);
  auto server = *Server::Create(std::move(o));
  if (!server->Start().ok()) return 1;
  int port = server->port();
  if (write(pipefd[1], &port, sizeof(port)) != sizeof(port)) return 1;
  const CpuTime cpu0 = ProcessCpu();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = server->Run();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const CpuTime cpu1 = ProcessCpu();
  const double user = cpu1.user - cpu0.user, system = cpu1.system - cpu0.system;
  const double cpu = user + system;
  int status = 0;
  waitpid(child, &status, 0);
  const auto h = server->History();
  // Rounds after the first: the first also waits for every client to join.
  double first_wall = h.empty() ? 0 : h[0].wall_s;
  std::printf("%d no-op clients x %lld params (%.1f MB), FedAvg, %d rounds: %s\n", clients,
              static_cast<long long>(params), params * 4 / 1e6, rounds,
              s.ok() ? "ok" : s.ToString().c_str());
  const double per = static_cast<double>(std::max<size_t>(1, h.size()));
  std::printf("server CPU %.2f s (user %.2f, system %.2f) over %.2f s wall (round 1 %.2f s)\n",
              cpu, user, system, wall, first_wall);
  std::printf("%.3f s of server CPU a round: user %.3f, system %.3f (target <= 0.3 at 100 "
              "clients x 1M)\n", cpu / per, user / per, system / per);
  std::printf("each round moves %.0f MB down and %.0f MB up over loopback\n",
              h.empty() ? 0.0 : h.back().bytes_down / 1e6, h.empty() ? 0.0 : h.back().bytes_up / 1e6);
  return s.ok() && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
