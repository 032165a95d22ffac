// A hand-driven client for tests: joins over a real control stream and lets the test
// send arbitrary (also malformed) uploads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cleave/v1/cleave.grpc.pb.h"
#include "job/job.h"

namespace cleave {

class TestPeer {
 public:
  TestPeer(const std::string& address, int64_t num_examples,
           std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  ~TestPeer();

  // Sends Join (advertising `codecs`) and waits for Welcome. False on failure.
  bool Join(const std::string& name = "peer", const std::vector<std::string>& codecs = {"fp32"});
  bool edge = false;  // Join as an edge aggregator (Join.edge)
  bool count_from_fit = false;  // Join.count_from_fit (num_examples 0: uploads report it)
  // Sends a Profile on the control stream (width.assign: profile, cut: auto).
  bool SendProfile(const v1::Profile& p);
  // The next task from the server, or nullopt after `timeout_s`.
  std::optional<v1::Task> NextTask(double timeout_s = 30);
  // True once the server sent RunEnded (waits up to timeout_s).
  bool WaitRunEnded(double timeout_s = 30);

  const v1::Welcome& welcome() const { return welcome_; }
  v1::Coordinator::Stub* stub() { return stub_.get(); }
  // A header for `task` with this peer's identity, num_examples and codec fp32.
  v1::UploadHeader Header(const v1::Task& task, int64_t num_examples) const;

  // Sends `header` (total_size as given) then `chunks` as data messages.
  grpc::Status RawUpload(const v1::UploadHeader& header, const std::vector<std::string>& chunks,
                         v1::UploadReply* reply = nullptr);

 private:
  void ReadLoop();

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  int64_t num_examples_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream_;
  v1::Welcome welcome_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::ServerMessage> inbox_;
  bool closed_ = false;
};

// Builds a config from YAML text for tests; fails the test on errors.
JobConfig TestConfig(const std::string& yaml);

}  // namespace cleave
