// A long-lived client as the daemon's pool sees it, driven by a test: it attaches over a
// real gRPC stream with a hello and answers offers as told (it joins no job itself).
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <thread>
#include <vector>

#include "cleave/v1/pool.grpc.pb.h"
#include "core/mutex.h"

namespace cleave::testing {

class FakeSite {
 public:
  // Attaches to the pool at `address` with `hello` (over `credentials`; null:
  // plaintext); offers are answered with `decline` as the reason when it is not empty,
  // else left unanswered (accepted by silence: the job waits for a client that never
  // dials).
  FakeSite(const std::string& address, v1::PoolHello hello, std::string decline = "",
           std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr)
      : decline_(std::move(decline)) {
    stub_ = v1::Pool::NewStub(
        grpc::CreateChannel(address, credentials ? credentials : grpc::InsecureChannelCredentials()));
    stream_ = stub_->Attach(&ctx_);
    v1::PoolUp up;
    *up.mutable_hello() = std::move(hello);
    stream_->Write(up);
    v1::PoolDown welcome;
    welcomed_ = stream_->Read(&welcome) && welcome.has_welcome();
    name_ = welcome.welcome().name();
    reader_ = std::thread([this] {
      for (v1::PoolDown down; stream_->Read(&down);) {
        MutexLock l(&mu_);
        if (down.has_offer()) offers_.push_back(down.offer());
        if (down.has_release()) releases_.push_back(down.release());
        if (down.has_offer() && !decline_.empty()) {
          v1::PoolUp answer;
          answer.mutable_answer()->set_job_id(down.offer().job_id());
          answer.mutable_answer()->set_reason(decline_);
          stream_->Write(answer);
        }
      }
    });
  }
  ~FakeSite() {
    ctx_.TryCancel();
    reader_.join();
    stream_->Finish();
  }
  bool welcomed() const { return welcomed_; }
  // The name the daemon knows it by (its welcome's).
  const std::string& name() const { return name_; }
  std::vector<v1::JobOffer> Offers() {
    MutexLock l(&mu_);
    return offers_;
  }
  std::vector<v1::JobRelease> Releases() {
    MutexLock l(&mu_);
    return releases_;
  }
  // Tells the daemon it pauses until `until_unix_ms` (0: resumes).
  void Pause(int64_t until_unix_ms, const std::string& reason) {
    v1::PoolUp up;
    up.mutable_pause()->set_until_unix_ms(until_unix_ms);
    up.mutable_pause()->set_reason(reason);
    MutexLock l(&mu_);
    stream_->Write(up);
  }

  // A hello exposing `datasets`, without a site policy.
  static v1::PoolHello Hello(const std::string& name, const std::vector<std::string>& datasets = {"default"}) {
    v1::PoolHello h;
    h.set_name(name);
    for (const std::string& d : datasets) h.add_datasets()->set_name(d);
    return h;
  }

 private:
  const std::string decline_;
  std::unique_ptr<v1::Pool::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::PoolUp, v1::PoolDown>> stream_;
  bool welcomed_ = false;
  std::string name_;
  std::thread reader_;
  Mutex mu_;
  std::vector<v1::JobOffer> offers_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::JobRelease> releases_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cleave::testing
