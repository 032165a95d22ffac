// Many idle clients on one server: a load generator holds N sessions in one process
// (gRPC's callback API: a reactor per Control stream, no thread per client), each on
// its own connection, joining and then only heartbeating, as devices between rounds do.
// The server runs in the parent with clients.min above N, so no round starts; after
// every client joined, the benchmark waits several client timeouts and checks that no
// session was dropped (heartbeats kept), and reports the server's memory per session.
//   bench_idle_clients [--clients N] [--wait S] [--scrapes K]
// Issue 16's target: 10,000 concurrently connected idle clients, bounded memory.
// With --scrapes K the server also serves its operator endpoint, and once every client
// joined a separate process (python3's urllib) fetches /metrics K times: the server's
// CPU over those scrapes, less what it spends over as long without them (heartbeats),
// over K is one scrape's cost (issue 18's target: < 5 ms at 1,000 clients).
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/process.h"
#include "cleave/v1/cleave.grpc.pb.h"
#include "server/server.h"
#include "job/job.h"

using namespace cleave;

namespace {

// One client's Control stream: Join, then a heartbeat whenever the driver asks and no
// write is in flight; reads until the server ends the stream.
class Session : public grpc::ClientBidiReactor<v1::ClientMessage, v1::ServerMessage> {
 public:
  Session(v1::Coordinator::Stub* stub, std::atomic<int>* joined, std::atomic<int>* ended)
      : joined_(joined), ended_(ended) {
    join_.mutable_join()->set_num_examples(1);
    join_.mutable_join()->set_protocol_version(1);
    join_.mutable_join()->add_codecs("fp32");
    stub->async()->Control(&ctx_, this);
    writing_ = true;
    StartWrite(&join_);
    StartRead(&in_);
    StartCall();
  }

  void Heartbeat(int64_t unix_ms) {
    if (!welcomed_ || writing_.exchange(true)) return;
    hb_.mutable_heartbeat()->set_unix_ms(unix_ms);
    StartWrite(&hb_);
  }
  void Cancel() { ctx_.TryCancel(); }
  bool done() const { return done_; }

  void OnWriteDone(bool) override { writing_ = false; }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ends; OnDone follows
    if (in_.has_welcome() && !welcomed_.exchange(true)) ++*joined_;
    StartRead(&in_);
  }
  void OnDone(const grpc::Status&) override {
    ++*ended_;
    done_ = true;
  }

 private:
  grpc::ClientContext ctx_;
  v1::ClientMessage join_, hb_;
  v1::ServerMessage in_;
  std::atomic<bool> writing_{false}, welcomed_{false}, done_{false};
  std::atomic<int>* joined_;
  std::atomic<int>* ended_;
};

// The child: `clients` sessions; reports over `report_fd` how many joined (an int),
// then heartbeats every `period_ms` until `hold_s` seconds after the last joined, then
// reports how many ended early (an int) and hangs up.
int RunClients(int port, int clients, int period_ms, int hold_s, int report_fd) {
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  std::atomic<int> joined{0}, ended{0}, created{0};
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs(clients);
  std::vector<std::unique_ptr<Session>> sessions(clients);
  // Heartbeats from the start: the first sessions must not wait for the last to connect.
  std::atomic<bool> beating{true};
  std::thread heartbeats([&] {
    while (beating) {
      const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count();
      for (int i = 0, n = created; i < n; ++i) sessions[i]->Heartbeat(now);
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
    }
  });
  for (int i = 0; i < clients; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);  // a connection of its own each
    stubs[i] = v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args));
    sessions[i] = std::make_unique<Session>(stubs[i].get(), &joined, &ended);
    ++created;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (joined + ended < clients && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const int j = joined;
  if (write(report_fd, &j, sizeof(j)) != sizeof(j)) return 1;
  std::this_thread::sleep_for(std::chrono::seconds(hold_s));
  const int e = ended;
  if (write(report_fd, &e, sizeof(e)) != sizeof(e)) return 1;
  beating = false;
  heartbeats.join();
  for (auto& s : sessions) s->Cancel();
  for (int i = 0; i < 100 && ended < clients; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return 0;
}

int ReadInt(int fd) {
  int v = -1;
  return read(fd, &v, sizeof(v)) == sizeof(v) ? v : -1;
}

}  // namespace

int main(int argc, char** argv) {
  int clients = 10000, hold_s = 45, scrapes = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--clients")) clients = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--wait")) hold_s = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--scrapes")) scrapes = std::atoi(argv[i + 1]);
  }
  const double heartbeat_s = 2, timeout_s = 15;  // the defaults; the hold spans three timeouts
  int portfd[2], reportfd[2];
  if (pipe(portfd) != 0 || pipe(reportfd) != 0) return 1;
  pid_t child = fork();  // before any gRPC or thread exists
  if (child == 0) {
    close(portfd[1]);
    close(reportfd[0]);
    int port = 0;
    if (read(portfd[0], &port, sizeof(port)) != sizeof(port)) _exit(9);
    _exit(RunClients(port, clients, static_cast<int>(heartbeat_s * 1000), hold_s, reportfd[1]));
  }
  close(portfd[0]);
  close(reportfd[1]);

  ServerOptions o;
  auto cfg = ParseJob(
      "run: {rounds: 1}\nmodel: {name: mlp}\n"
      "clients: {min: " + std::to_string(clients + 1) + ", join_timeout_s: 3600}\n"
      "server: {heartbeat_s: " + std::to_string(heartbeat_s) + ", client_timeout_s: " +
          std::to_string(timeout_s) + ", max_sessions: " + std::to_string(clients + 100) +
          ", max_connections: " + std::to_string(clients + 500) +
          (scrapes > 0 ? ", metrics_listen: \"127.0.0.1:0\"" : "") + "}\n",
      "");
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().ToString().c_str());
    return 2;
  }
  o.config = *cfg;
  o.listen = "127.0.0.1:0";
  o.insecure = true;
  o.evaluate = false;
  auto server = Server::Create(std::move(o));
  if (!server.ok() || !(*server)->Start().ok()) return 1;
  const int64_t idle = RssBytes();
  int port = (*server)->port();
  if (write(portfd[1], &port, sizeof(port)) != sizeof(port)) return 1;
  std::thread run([&] { (*server)->Run().IgnoreError(); });
  auto connected = [&] {
    auto stub = v1::Coordinator::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::StatusRequest req;
    v1::StatusReply reply;
    return stub->GetStatus(&ctx, req, &reply).ok() ? reply.connected_clients() : -1;
  };
  const auto t0 = std::chrono::steady_clock::now();
  const int joined = ReadInt(reportfd[0]);
  const double join_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t all = RssBytes();
  const int after_join = connected();
  double scrape_ms = 0;
  if (scrapes > 0) {
    // Each scrape by a process of its own making: python3 fetching /metrics K times.
    const std::string url = "http://127.0.0.1:" + std::to_string((*server)->metrics_port()) + "/metrics";
    const std::string script = "import urllib.request as u\nfor _ in range(" +
                               std::to_string(scrapes) + "): u.urlopen('" + url + "').read()\n";
    const double idle0 = ProcessCpu().total();
    const auto w0 = std::chrono::steady_clock::now();
    pid_t scraper = fork();
    if (scraper == 0) {
      execl("/usr/bin/python3", "python3", "-c", script.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    int st = 0;
    waitpid(scraper, &st, 0);
    const double busy = ProcessCpu().total() - idle0;
    const auto wall = std::chrono::steady_clock::now() - w0;
    const double base0 = ProcessCpu().total();
    std::this_thread::sleep_for(wall);  // as long, without scrapes
    const double base = ProcessCpu().total() - base0;
    scrape_ms = 1e3 * (busy - base) / scrapes;
    if (st != 0) std::fprintf(stderr, "the scraper failed (%d)\n", st);
  }
  const double cpu0 = ProcessCpu().total();
  const auto hold0 = std::chrono::steady_clock::now();
  int64_t peak = all;
  int least = after_join;
  std::atomic<bool> holding{true};
  std::thread sampler([&] {  // while the clients only heartbeat
    while (holding) {
      peak = std::max(peak, RssBytes());
      least = std::min(least, connected());
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  const int ended_early = ReadInt(reportfd[0]);
  const double hold_cpu = ProcessCpu().total() - cpu0;
  const double hold_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - hold0).count();
  holding = false;
  sampler.join();
  (*server)->Stop();
  run.join();
  int status = 0;
  waitpid(child, &status, 0);
  std::printf("%d idle clients, one connection each, heartbeat %.0f s, client timeout %.0f s\n",
              clients, heartbeat_s, timeout_s);
  std::printf("joined: %d in %.1f s; connected after joining: %d; least connected over the "
              "next %d s: %d; sessions that ended early: %d\n",
              joined, join_s, after_join, hold_s, least, ended_early);
  std::printf("server RSS idle %.1f MB, with every client %.1f MB (peak %.1f MB): %.3f MiB "
              "per connected client (target <= 0.25)\n",
              idle / 1e6, all / 1e6, peak / 1e6, (peak - idle) / 1048576.0 / std::max(1, joined));
  std::printf("server CPU while the clients heartbeat: %.1f %% of a core (%.0f heartbeats/s)\n",
              100 * hold_cpu / hold_wall, joined / heartbeat_s);
  if (scrapes > 0) {
    std::printf("a /metrics scrape at %d connected clients: %.2f ms of server CPU (mean of %d; "
                "target < 5)\n", joined, scrape_ms, scrapes);
  }
  return joined == clients && least == clients && ended_early == 0 ? 0 : 1;
}
