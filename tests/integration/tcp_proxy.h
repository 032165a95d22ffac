// A TCP relay on loopback that counts the bytes it carries each way: what really
// crossed the transport, to check the server's own accounting against.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cleave {

class TcpProxy {
 public:
  // Relays connections on a free loopback port to 127.0.0.1:`upstream_port`.
  explicit TcpProxy(int upstream_port) : upstream_port_(upstream_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(listen_fd_, 64);
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }

  ~TcpProxy() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    {
      std::lock_guard<std::mutex> l(mu_);
      for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : pumps_) t.join();
    for (int fd : fds_) close(fd);
    close(listen_fd_);
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int64_t up() const { return up_; }      // client -> server
  int64_t down() const { return down_; }  // server -> client

 private:
  void Accept() {
    while (!stop_) {
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) return;
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(upstream_port_);
      if (connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(client);
        close(server);
        continue;
      }
      std::lock_guard<std::mutex> l(mu_);
      fds_.push_back(client);
      fds_.push_back(server);
      pumps_.emplace_back([this, client, server] { Pump(client, server, &up_); });
      pumps_.emplace_back([this, client, server] { Pump(server, client, &down_); });
    }
  }

  // Copies from `in` to `out` until either side closes.
  static void Pump(int in, int out, std::atomic<int64_t>* counter) {
    std::vector<char> buf(1 << 16);
    while (true) {
      const ssize_t n = read(in, buf.data(), buf.size());
      if (n <= 0) break;
      for (ssize_t done = 0; done < n;) {
        // MSG_NOSIGNAL: a peer that already closed must not SIGPIPE the test process.
        const ssize_t w = send(out, buf.data() + done, n - done, MSG_NOSIGNAL);
        if (w <= 0) {
          shutdown(in, SHUT_RDWR);
          return;
        }
        done += w;
      }
      *counter += n;
    }
    shutdown(out, SHUT_WR);
  }

  const int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> up_{0}, down_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> pumps_;
};

}  // namespace cleave
