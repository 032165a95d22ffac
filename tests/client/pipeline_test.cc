// A pipeline's hop (split.mode: pipeline) against hostile or mistaken neighbours: only
// the upstream device the task names, with its secret, is served; a micro-batch that is
// not finite ends the call with the reason and fails the relay's task.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <thread>

#include "client/gossip.h"
#include "client/pipeline_relay.h"
#include "models/part.h"

namespace cleave {
namespace {

using UpStream = grpc::ServerReaderWriter<v1::SplitDown, v1::SplitUp>;
using HopStream = grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>;

// Opens Peer.Pipeline on `port` as `sender`; the call's status once the receiver ends it
// (after SplitReady, `then` runs on the open stream).
grpc::Status OpenAs(int port, const std::string& run, int64_t round, const std::string& sender,
                    const std::string& token, const std::function<void(HopStream*)>& then = nullptr) {
  auto stub = v1::Peer::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub->Pipeline(&ctx);
  v1::SplitUp open;
  open.mutable_hop()->set_run_id(run);
  open.mutable_hop()->set_round(round);
  open.mutable_hop()->set_sender(sender);
  open.mutable_hop()->set_token(token);
  stream->Write(open);
  v1::SplitDown ready;
  if (stream->Read(&ready) && ready.has_ready() && then) then(stream.get());
  stream->WritesDone();
  v1::SplitDown rest;
  while (stream->Read(&rest)) {
  }
  return stream->Finish();
}

// A relay's task: stages [1, 2) of LeNet-5 in run "run" round 1, batches of 8 in
// `micro_batches`, the upstream "alice" with secret "t1" (at `upstream_address`, or none),
// a deadline a minute away.
v1::Task RelayTask(int micro_batches, const std::string& upstream_address = "") {
  v1::Task task;
  task.set_run_id("run");
  task.set_round(1);
  task.set_deadline_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                (std::chrono::system_clock::now() + std::chrono::seconds(60)).time_since_epoch())
                                .count());
  task.mutable_train()->set_batch_size(8);
  task.mutable_train()->set_lr(0.1);
  v1::SplitTask* st = task.mutable_split();
  st->set_mode("pipeline");
  st->set_begin(1);
  st->set_cut(2);
  st->set_num_stages(5);
  st->set_micro_batches(micro_batches);
  st->mutable_upstream()->set_name("alice");
  st->mutable_upstream()->set_address(upstream_address);
  st->mutable_upstream()->set_token("t1");
  return task;
}

TEST(PipelineHopTest, OnlyTheNamedUpstreamWithItsSecretIsServed) {
  auto peer = PeerServer::Start("127.0.0.1:0", "", "", "");
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::atomic<int> served{0};
  (*peer)->ExpectPipeline("run", 3, "alice", "secret", [&](grpc::ServerContext*, UpStream* up, const v1::PipelineOpen& o) {
    EXPECT_EQ(o.sender(), "alice");
    ++served;
    v1::SplitDown ready;
    ready.mutable_ready();
    up->Write(ready);
    return grpc::Status::OK;
  });
  const int port = (*peer)->port();
  EXPECT_EQ(OpenAs(port, "run", 3, "mallory", "secret").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(OpenAs(port, "run", 3, "alice", "guess").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(OpenAs(port, "other", 3, "alice", "secret").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(OpenAs(port, "run", 2, "alice", "secret").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(served, 0);
  EXPECT_TRUE(OpenAs(port, "run", 3, "alice", "secret").ok());
  EXPECT_EQ(served, 1);
  const grpc::Status again = OpenAs(port, "run", 3, "alice", "secret");
  EXPECT_EQ(again.error_code(), grpc::StatusCode::ALREADY_EXISTS) << again.error_message();
  EXPECT_TRUE((*peer)->EndPipeline()) << "it was taken";
  EXPECT_EQ(OpenAs(port, "run", 3, "alice", "secret").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(served, 1);
}

// A relay (stages [1, 2) of LeNet-5) between a test upstream and a test downstream: a
// micro-batch with a NaN, sent while a good one is in flight, ends the upstream's call
// with INVALID_ARGUMENT naming it (not a cancellation), and the relay's task fails with
// the same reason.
TEST(PipelineHopTest, ARelayRefusesActivationsThatAreNotFinite) {
  ModelSpec spec;
  spec.name = "lenet5";
  spec.seed = 1;
  auto part = ModelPart::Create(spec, 1, 2);
  ASSERT_TRUE(part.ok());
  auto relay_peer = PeerServer::Start("127.0.0.1:0", "", "", "");
  auto down_peer = PeerServer::Start("127.0.0.1:0", "", "", "");
  ASSERT_TRUE(relay_peer.ok() && down_peer.ok());
  std::atomic<int> onward{0};
  (*down_peer)->ExpectPipeline("run", 1, "relay", "t2", [&](grpc::ServerContext*, UpStream* up, const v1::PipelineOpen&) {
    v1::SplitDown ready;
    ready.mutable_ready();
    up->Write(ready);
    v1::SplitUp m;
    while (up->Read(&m)) ++onward;
    return grpc::Status::OK;
  });
  v1::Task task = RelayTask(2);
  v1::SplitTask* st = task.mutable_split();
  st->mutable_downstream()->set_name("bob");
  st->mutable_downstream()->set_address("127.0.0.1:" + std::to_string((*down_peer)->port()));
  st->mutable_downstream()->set_token("t2");
  SplitTaskOptions o;
  o.model = spec;
  o.peer.name = "relay";
  StatusOr<SplitTaskResult> result = absl::UnknownError("not run");
  std::thread relay([&] {
    result = RunPipelineRelay(nullptr, v1::Welcome(), task, (*part)->Parameters(), o, relay_peer->get());
  });
  const grpc::Status call = OpenAs((*relay_peer)->port(), "run", 1, "alice", "t1", [](HopStream* s) {
    for (int seq : {1, 2}) {  // the second has a NaN
      v1::SplitUp batch;
      batch.mutable_batch()->set_seq(seq);
      v1::TensorData* t = batch.mutable_batch()->mutable_activations();
      for (int64_t d : {4, 6, 12, 12}) t->add_shape(d);
      std::vector<float> values(4 * 6 * 12 * 12, 0.5f);
      if (seq == 2) values[17] = std::numeric_limits<float>::quiet_NaN();
      t->set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
      s->Write(batch);
    }
  });
  relay.join();
  EXPECT_EQ(call.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << call.error_message();
  EXPECT_NE(call.error_message().find("not finite"), std::string::npos) << call.error_message();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_LE(onward, 1) << "only the good micro-batch may have gone onward";
}

// A U-shaped chain's relay passes the head's input from downstream back up as it came,
// once per micro-batch in flight: a second copy (a hostile or broken downstream) fails
// its task with DATA_LOSS; and the head's gradient from upstream goes on only when due.
class UShapedRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_.name = "lenet5";
    spec_.seed = 1;
    auto part = ModelPart::Create(spec_, 1, 2);
    ASSERT_TRUE(part.ok());
    part_ = (*part)->Parameters();
    auto relay = PeerServer::Start("127.0.0.1:0", "", "", "");
    auto down = PeerServer::Start("127.0.0.1:0", "", "", "");
    ASSERT_TRUE(relay.ok() && down.ok());
    relay_peer_ = *std::move(relay);
    down_peer_ = *std::move(down);
    task_ = RelayTask(2);
    v1::SplitTask* st = task_.mutable_split();
    st->set_tail_begin(4);  // the owner keeps stage 4
    st->mutable_downstream()->set_name("bob");
    st->mutable_downstream()->set_address("127.0.0.1:" + std::to_string(down_peer_->port()));
    st->mutable_downstream()->set_token("t2");
  }

  // Runs the relay between a test upstream (`up`) and downstream (`down`, after Ready).
  void Run(const std::function<void(HopStream*)>& up, const std::function<void(UpStream*)>& down) {
    down_peer_->ExpectPipeline("run", 1, "relay", "t2", [&](grpc::ServerContext*, UpStream* s, const v1::PipelineOpen&) {
      v1::SplitDown ready;
      ready.mutable_ready();
      s->Write(ready);
      down(s);
      return grpc::Status::OK;
    });
    SplitTaskOptions o;
    o.model = spec_;
    o.peer.name = "relay";
    std::thread relay([&] { result_ = RunPipelineRelay(nullptr, v1::Welcome(), task_, part_, o, relay_peer_.get()); });
    call_ = OpenAs(relay_peer_->port(), "run", 1, "alice", "t1", up);
    relay.join();
  }

  static v1::SplitUp Batch(int64_t seq) {
    v1::SplitUp batch;
    batch.mutable_batch()->set_seq(seq);
    v1::TensorData* t = batch.mutable_batch()->mutable_activations();
    for (int64_t d : {4, 6, 12, 12}) t->add_shape(d);
    std::vector<float> values(4 * 6 * 12 * 12, 0.5f);
    t->set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
    return batch;
  }
  static v1::SplitDown HeadInput(int64_t seq) {
    v1::SplitDown f;
    f.mutable_forward()->set_seq(seq);
    f.mutable_forward()->mutable_activations()->add_shape(4);
    f.mutable_forward()->mutable_activations()->add_shape(84);
    f.mutable_forward()->mutable_activations()->set_data(std::string(4 * 84 * 4, '\0'));
    return f;
  }

  ModelSpec spec_;
  ParameterSet part_;
  std::unique_ptr<PeerServer> relay_peer_, down_peer_;
  v1::Task task_;
  StatusOr<SplitTaskResult> result_ = absl::UnknownError("not run");
  grpc::Status call_;
};

TEST_F(UShapedRelayTest, PassesTheHeadsInputUpOnceAndRefusesACopy) {
  std::atomic<int> heads{0};
  std::promise<void> arrived;  // the copy goes after the first reached upstream: the
  std::future<void> first = arrived.get_future();  // refusal cancels what is still queued
  Run(
      [&](HopStream* s) {
        s->Write(Batch(1));
        v1::SplitDown m;
        while (s->Read(&m)) {
          if (m.has_forward() && m.forward().seq() == 1 && m.forward().activations().shape(1) == 84 && ++heads == 1) {
            arrived.set_value();
          }
        }
      },
      [&](UpStream* s) {
        v1::SplitUp m;
        if (!s->Read(&m) || !m.has_batch()) return;
        s->Write(HeadInput(1));
        first.wait_for(std::chrono::seconds(30));
        s->Write(HeadInput(1));  // again: not due
        while (s->Read(&m)) {
        }
      });
  EXPECT_EQ(heads, 1);
  ASSERT_FALSE(result_.ok());
  EXPECT_EQ(result_.status().code(), absl::StatusCode::kDataLoss) << result_.status();
  EXPECT_NE(result_.status().message().find("not due"), std::string::npos) << result_.status();
}

TEST_F(UShapedRelayTest, RefusesTheHeadsGradientBeforeItsInputWentUp) {
  std::atomic<int> onward{0};
  Run(
      [&](HopStream* s) {
        s->Write(Batch(1));
        v1::SplitUp g;
        g.mutable_grad()->set_seq(1);  // its head input never came
        s->Write(g);
      },
      [&](UpStream* s) {
        v1::SplitUp m;
        while (s->Read(&m)) onward += m.has_grad();
      });
  EXPECT_EQ(call_.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << call_.error_message();
  EXPECT_NE(call_.error_message().find("not due"), std::string::npos) << call_.error_message();
  EXPECT_FALSE(result_.ok());
  EXPECT_EQ(onward, 0);
}

// A relay whose upstream is gone before it dials (nothing listens at its Peer address)
// gives up after three failed probes, not at the task's deadline a minute away.
TEST(PipelineHopTest, ARelayWhoseUpstreamIsGoneGivesUpWithoutWaitingForTheDeadline) {
  ModelSpec spec;
  spec.name = "lenet5";
  auto part = ModelPart::Create(spec, 1, 2);
  ASSERT_TRUE(part.ok());
  auto relay_peer = PeerServer::Start("127.0.0.1:0", "", "", "");
  ASSERT_TRUE(relay_peer.ok());
  // A port that was just free: nothing listens there.
  int gone_port = 0;
  {
    auto probe = PeerServer::Start("127.0.0.1:0", "", "", "");
    ASSERT_TRUE(probe.ok());
    gone_port = (*probe)->port();
  }
  const v1::Task task = RelayTask(1, "127.0.0.1:" + std::to_string(gone_port));
  SplitTaskOptions o;
  o.model = spec;
  o.peer.name = "relay";
  const auto t0 = std::chrono::steady_clock::now();
  auto result = RunPipelineRelay(nullptr, v1::Welcome(), task, (*part)->Parameters(), o, relay_peer->get());
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
  EXPECT_NE(result.status().message().find("alice"), std::string::npos) << result.status();
  EXPECT_LT(waited, 30) << "not the task's deadline";
}

}  // namespace
}  // namespace cleave
