#include "tests/server/test_peer.h"

#include <gtest/gtest.h>

#include "client/transfer.h"
#include "tests/deadline.h"
#include "job/job.h"

namespace cleave {

TestPeer::TestPeer(const std::string& address, int64_t num_examples,
                   std::shared_ptr<grpc::ChannelCredentials> credentials)
    : channel_(grpc::CreateChannel(
          address, credentials ? credentials : grpc::InsecureChannelCredentials())),
      stub_(v1::Coordinator::NewStub(channel_)),
      num_examples_(num_examples) {}

TestPeer::~TestPeer() {
  ctx_.TryCancel();
  if (reader_.joinable()) reader_.join();
  if (stream_) stream_->Finish();
}

bool TestPeer::Join(const std::string& name, const std::vector<std::string>& codecs) {
  stream_ = stub_->Control(&ctx_);
  v1::ClientMessage m;
  m.mutable_join()->set_name(name);
  m.mutable_join()->set_num_examples(num_examples_);
  m.mutable_join()->set_protocol_version(1);
  m.mutable_join()->set_edge(edge);
  m.mutable_join()->set_count_from_fit(count_from_fit);
  for (const auto& c : codecs) m.mutable_join()->add_codecs(c);
  v1::ServerMessage reply;
  if (!stream_->Write(m) || !stream_->Read(&reply) || !reply.has_welcome()) return false;
  welcome_ = reply.welcome();
  reader_ = std::thread([this] { ReadLoop(); });
  return true;
}

bool TestPeer::SendProfile(const v1::Profile& p) {
  v1::ClientMessage m;
  *m.mutable_profile() = p;
  return stream_->Write(m);
}

void TestPeer::ReadLoop() {
  v1::ServerMessage m;
  while (stream_->Read(&m)) {
    std::lock_guard<std::mutex> l(mu_);
    inbox_.push_back(m);
    cv_.notify_all();
  }
  std::lock_guard<std::mutex> l(mu_);
  closed_ = true;
  cv_.notify_all();
}

std::optional<v1::Task> TestPeer::NextTask(double timeout_s) {
  std::unique_lock<std::mutex> l(mu_);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (true) {
    while (!inbox_.empty()) {
      v1::ServerMessage m = inbox_.front();
      inbox_.pop_front();
      if (m.has_task()) return m.task();
    }
    if (closed_ || cv_.wait_until(l, until) == std::cv_status::timeout) return std::nullopt;
  }
}

bool TestPeer::WaitRunEnded(double timeout_s) {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)), [&] {
    for (const auto& m : inbox_) {
      if (m.has_run_ended()) return true;
    }
    return false;
  });
}

v1::UploadHeader TestPeer::Header(const v1::Task& task, int64_t num_examples) const {
  v1::UploadHeader h = TaskUploadHeader(welcome_, task, num_examples, "fp32");
  h.set_train_loss(0.5);
  return h;
}

grpc::Status TestPeer::RawUpload(const v1::UploadHeader& header,
                                 const std::vector<std::string>& chunks,
                                 v1::UploadReply* reply) {
  grpc::ClientContext ctx;
  ctx.set_deadline(testing::RpcDeadline(60));
  v1::UploadReply r;
  auto w = stub_->Upload(&ctx, &r);
  v1::UploadChunk m;
  *m.mutable_header() = header;
  bool ok = w->Write(m);
  for (const auto& c : chunks) {
    if (!ok) break;
    m.set_data(c);
    ok = w->Write(m);
  }
  if (ok) w->WritesDone();
  grpc::Status s = w->Finish();
  if (reply) *reply = r;
  return s;
}

JobConfig TestConfig(const std::string& yaml) {
  auto c = ParseJob(yaml, "");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : JobConfig{};
}

}  // namespace cleave
