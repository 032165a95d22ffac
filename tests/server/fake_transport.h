// An in-memory transport for the coordinator (server/transport/transport.h): clients whose control
// stream is a queue in this process and whose uploads are calls on the coordinator, so
// that rounds, schedulers and drivers are tested without sockets or gRPC, on the
// coordinator's injected clock.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "client/transfer.h"
#include "server/coordinator.h"

namespace cleave::testing {

// A control stream that keeps what the coordinator sends. When it ends (finish_after,
// Close), it calls `on_done` once, as the gRPC transport reports a finished stream
// (Coordinator::ControlDone), without holding its own mutex.
class FakeLink : public ClientLink {
 public:
  std::function<void(const ClientLink*)> on_done;

  bool Send(v1::ServerMessage msg, bool finish_after) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (closed_) return false;
      inbox_.push_back(std::move(msg));
      closed_ = finish_after;
      cv_.notify_all();
    }
    if (finish_after) Done();
    return true;
  }
  void Close(const Status& /*why*/) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (closed_) return;
      closed_ = true;
      cv_.notify_all();
    }
    Done();
  }
  // The next message, or nullopt once `real_timeout_s` of wall time passed (the
  // coordinator's clock may be a fake one: this bounds only a broken test).
  std::optional<v1::ServerMessage> Next(double real_timeout_s = 60) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::duration<double>(real_timeout_s),
                 [&] { return !inbox_.empty() || closed_; });
    if (inbox_.empty()) return std::nullopt;
    v1::ServerMessage m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }

 private:
  void Done() {
    if (on_done) on_done(this);
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::ServerMessage> inbox_;
  bool closed_ = false;
};

// A client of the coordinator that the test drives by hand.
class FakeClient {
 public:
  FakeClient(Coordinator* c, std::string name, int64_t examples)
      : c_(c), name_(std::move(name)), examples_(examples), link_(std::make_shared<FakeLink>()) {}

  Status Join() {
    v1::Join j;
    j.set_protocol_version(1);
    j.set_name(name_);
    j.set_num_examples(examples_);
    j.add_codecs("fp32");
    RETURN_IF_ERROR(c_->Join(link_, j, "", &welcome_));
    link_->on_done = [c = c_, id = welcome_.client_id()](const ClientLink* link) {
      c->ControlDone(id, link);
    };
    c_->Ready(welcome_.client_id());
    return absl::OkStatus();
  }
  // The next task (skipping other messages), or nullopt.
  std::optional<v1::Task> NextTask() {
    while (auto m = link_->Next()) {
      if (m->has_task()) return m->task();
      if (m->has_run_ended()) return std::nullopt;
    }
    return std::nullopt;
  }
  // The global model a task trains from.
  StatusOr<ParameterSet> Model(const v1::Task& task) {
    v1::FetchRequest req;
    req.set_client_id(welcome_.client_id());
    req.set_session_token(welcome_.session_token());
    req.set_digest(task.model_digest());
    int64_t fp32_size = 0;
    ASSIGN_OR_RETURN(auto blob, c_->FindBlob(req, "", &fp32_size));
    return ParameterSet::Decode(*blob);
  }
  // Uploads `payload` for `task` as the transport would: the header's checks, then the
  // payload's validation and aggregation.
  Status Upload(const v1::Task& task, const std::string& payload, int64_t examples = 0) {
    v1::UploadHeader h =
        TaskUploadHeader(welcome_, task, examples > 0 ? examples : examples_, "fp32");
    h.set_total_size(static_cast<int64_t>(payload.size()));
    return UploadWithHeader(h, payload);
  }
  Status UploadWithHeader(const v1::UploadHeader& h, const std::string& payload) {
    bool duplicate = false;
    ASSIGN_OR_RETURN(int64_t size, c_->CheckUploadHeader(h, "", &duplicate));
    if (size != static_cast<int64_t>(payload.size())) {
      return absl::InvalidArgumentError("payload size differs from the header's");
    }
    return c_->ProcessUpload(h, payload, &duplicate);
  }
  v1::UploadHeader Header(const v1::Task& task) const {
    return TaskUploadHeader(welcome_, task, examples_, "fp32");
  }

  const v1::Welcome& welcome() const { return welcome_; }
  FakeLink& link() { return *link_; }

 private:
  Coordinator* c_;
  std::string name_;
  int64_t examples_;
  std::shared_ptr<FakeLink> link_;
  v1::Welcome welcome_;
};

}  // namespace cleave::testing
