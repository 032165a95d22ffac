// Server peak memory while aggregating 100 updates of a 10M-parameter model.
// The server runs in this process; 100 clients run in a forked child over loopback,
// uploading all at once. Reported: peak RSS above the idle server (model loaded,
// listening), in multiples of the model size. Target: <= 4x.
//   bench_server_memory [--params N] [--clients C] [--codec SPEC] [--fetchers]
// With --codec the updates are compressed (compression.update = SPEC) and aggregated
// straight from their encodings. With --fetchers the clients instead start downloading
// the model at once and stall after its first chunk (slow links): reported is the
// server's memory per download in flight (issue 16's target: <= 0.25 MiB a client).
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "bench/process.h"
#include "client/transfer.h"
#include "compression/codec.h"
#include "server/server.h"
#include "job/job.h"

using namespace cleave;

namespace {

// The child: `clients` peers join, wait for their task, then all upload at once.
// `joined_fd`: where the child tells the parent (one byte) that every client holds its
// task, before any download starts.
int RunClients(int port, int clients, int64_t params, const std::string& codec, bool fetch,
               int joined_fd) {
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  struct Peer {
    std::unique_ptr<v1::Coordinator::Stub> stub;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream;
    v1::Welcome welcome;
    v1::Task task;
  };
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < clients; ++i) {
    auto p = std::make_unique<Peer>();
    p->stub = v1::Coordinator::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
    p->stream = p->stub->Control(&p->ctx);
    v1::ClientMessage m;
    m.mutable_join()->set_num_examples(1);
    m.mutable_join()->set_protocol_version(1);
    for (const auto& family : SupportedCodecFamilies()) m.mutable_join()->add_codecs(family);
    v1::ServerMessage r;
    if (!p->stream->Write(m) || !p->stream->Read(&r) || !r.has_welcome()) return 1;
    p->welcome = r.welcome();
    peers.push_back(std::move(p));
  }
  for (auto& p : peers) {
    v1::ServerMessage r;
    if (!p->stream->Read(&r) || !r.has_task()) return 2;
    p->task = r.task();
  }
  if (fetch) {
    const char joined = 1;
    if (write(joined_fd, &joined, 1) != 1) return 5;
    std::this_thread::sleep_for(std::chrono::seconds(1));  // the parent measures
    // Every client opens a download of the model and reads its first chunk; the rest
    // waits on the server while the parent measures; then all hang up.
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<std::unique_ptr<grpc::ClientReader<v1::Chunk>>> readers;
    for (auto& p : peers) {
      v1::FetchRequest req;
      req.set_client_id(p->welcome.client_id());
      req.set_session_token(p->welcome.session_token());
      req.set_digest(p->task.model_digest());
      contexts.push_back(std::make_unique<grpc::ClientContext>());
      readers.push_back(p->stub->Fetch(contexts.back().get(), req));
      v1::Chunk first;
      if (!readers.back()->Read(&first)) return 4;
    }
    std::this_thread::sleep_for(std::chrono::seconds(3));
    for (auto& c : contexts) c->TryCancel();
    for (auto& r : readers) r->Finish().IgnoreError();
    for (auto& p : peers) p->ctx.TryCancel();
    return 0;
  }
  ParameterSet delta;
  delta.Add({"w", {params}, std::vector<float>(params, 1e-3f)}).IgnoreError();
  const std::string payload =
      codec == "fp32" ? delta.Encode() : EncodeTensors(**MakeCodec(codec, 1), delta);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (auto& p : peers) {
    threads.emplace_back([&, peer = p.get()] {
      v1::UploadHeader h;
      h.set_run_id(peer->task.run_id());
      h.set_client_id(peer->welcome.client_id());
      h.set_session_token(peer->welcome.session_token());
      h.set_round(peer->task.round());
      h.set_task_id(peer->task.task_id());
      h.set_num_examples(1);
      h.set_codec(codec);
      if (!UploadPayload(peer->stub.get(), h, payload).ok()) ++failed;
    });
  }
  for (auto& t : threads) t.join();
  for (auto& p : peers) p->ctx.TryCancel();
  return failed ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 10'000'000;
  int clients = 100;
  std::string codec = "fp32";
  bool fetch = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--fetchers")) fetch = true;
    if (i + 1 >= argc) break;
    if (!std::strcmp(argv[i], "--params")) params = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--clients")) clients = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--codec")) codec = argv[i + 1];
  }
  int pipefd[2], joinedfd[2];
  if (pipe(pipefd) != 0 || pipe(joinedfd) != 0) return 1;
  pid_t child = fork();  // before any gRPC or thread exists
  if (child == 0) {
    close(pipefd[1]);
    int port = 0;
    if (read(pipefd[0], &port, sizeof(port)) != sizeof(port)) _exit(9);
    _exit(RunClients(port, clients, params, codec, fetch, joinedfd[1]));
  }
  close(pipefd[0]);

  ParameterSet model;
  model.Add({"w", {params}, std::vector<float>(params, 0.5f)}).IgnoreError();
  const double model_bytes = params * 4.0;
  ServerOptions o;
  auto cfg = ParseJob("run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: " +
                                  std::to_string(clients) +
                                  ", quorum: 1.0, round_deadline_s: 600, join_timeout_s: 600}\n"
                                  "server: {client_timeout_s: 600}\n" +
                                  (codec == "fp32" ? "" : "compression: {update: \"" + codec + "\"}\n"),
                              "");
  o.config = *cfg;
  const int o_chunk_bytes = o.config.server.chunk_bytes;
  o.listen = "127.0.0.1:0";
  o.insecure = true;
  o.evaluate = false;
  o.initial_model = std::move(model);
  auto server = *Server::Create(std::move(o));
  if (!server->Start().ok()) return 1;
  const int64_t idle = RssBytes();
  int port = server->port();
  if (write(pipefd[1], &port, sizeof(port)) != sizeof(port)) return 1;

  std::atomic<bool> done{false};
  std::atomic<int64_t> peak{idle};
  std::thread sampler([&] {
    while (!done) {
      peak = std::max<int64_t>(peak, RssBytes());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  if (fetch) {
    std::atomic<int64_t> joined_rss{0};
    std::thread joined_probe([&] {  // RSS with every client connected, none downloading
      char b;
      if (read(joinedfd[0], &b, 1) == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        joined_rss = RssBytes();
      }
    });
    // The run never starts training: when the child is done, stop the server.
    std::thread waiter([&] {
      int status = 0;
      waitpid(child, &status, 0);
      server->Stop();
      std::printf("clients: %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "ok" : "failed");
    });
    server->Run().IgnoreError();
    waiter.join();
    joined_probe.join();
    done = true;
    sampler.join();
    std::printf("model: %lld params (%.0f MB); %d clients each with a download in flight, "
                "stalled after its first chunk (server.chunk_bytes %d)\n",
                static_cast<long long>(params), model_bytes / 1e6, clients,
                o_chunk_bytes);
    std::printf("idle RSS %.1f MB, every client connected %.1f MB, peak while downloading "
                "%.1f MB\n", idle / 1e6, joined_rss / 1e6, peak / 1e6);
    std::printf("per connected client: %.3f MiB; per download in flight: %.3f MiB; both: "
                "%.3f MiB (target <= 0.25 a connected client)\n",
                (joined_rss - idle) / 1048576.0 / clients, (peak - joined_rss) / 1048576.0 / clients,
                (peak - idle) / 1048576.0 / clients);
    return 0;
  }
  auto t0 = std::chrono::steady_clock::now();
  Status s = server->Run();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  sampler.join();
  int status = 0;
  waitpid(child, &status, 0);
  const auto& h = server->History();
  const float w = server->GlobalModel().tensors()[0].values[params / 2];
  std::printf("model: %lld params (%.0f MB); %d clients, one %s update each, uploaded at once\n",
              static_cast<long long>(params), model_bytes / 1e6, clients, codec.c_str());
  std::printf("run: %s, %d updates aggregated in %.1fs; w = %.6f (fp32: 0.501000)\n",
              s.ok() ? "ok" : s.ToString().c_str(), h.empty() ? 0 : h[0].participants, secs, w);
  std::printf("idle RSS %.0f MB, peak RSS %.0f MB\n", idle / 1e6, peak / 1e6);
  std::printf("peak above idle: %.2fx the model size (target <= 4)\n",
              (peak - idle) / model_bytes);
  return s.ok() && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
