// Every kind of bad split-stream message gets a clear status before it touches the
// server part; U-shaped streams never accept labels.
#include <gtest/gtest.h>

#include <limits>
#include <thread>

#include "client/transfer.h"
#include "server/server.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

using grpc::StatusCode;

// LeNet-5 cut at 2: the server's first stage takes [B, 16, 4, 4].
constexpr int64_t kFeatures = 16 * 4 * 4;

v1::SplitUp Batch(int64_t seq, int64_t batch, int64_t labels, float value = 0.5f) {
  v1::SplitUp m;
  auto* b = m.mutable_batch();
  b->set_seq(seq);
  auto* t = b->mutable_activations();
  for (int64_t d : {batch, int64_t{16}, int64_t{4}, int64_t{4}}) t->add_shape(d);
  std::vector<float> v(batch * kFeatures, value);
  t->set_data(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  for (int64_t i = 0; i < labels; ++i) b->add_labels(i % 10);
  return m;
}

class SplitValidationTest : public ::testing::Test {
 protected:
  void Start(const std::string& mode) {
    ServerOptions o;
    o.config = TestConfig("model: {name: lenet5}\nrun: {rounds: 1}\nclients: {min: 1}\n"
                          "train: {batch_size: 8}\nsplit: {mode: " + mode + ", cut: 2}\n"
                          "data: {test_limit: 100}\n");
    o.listen = "127.0.0.1:0";
    o.insecure = true;
    auto s = Server::Create(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    ASSERT_TRUE(server_->Start().ok());
    address_ = "127.0.0.1:" + std::to_string(server_->port());
    runner_ = std::thread([this] { server_->Run().IgnoreError(); });
    peer_ = std::make_unique<TestPeer>(address_, 100);
    ASSERT_TRUE(peer_->Join());
    auto task = peer_->NextTask();
    ASSERT_TRUE(task.has_value());
    ASSERT_TRUE(task->has_split());
    task_ = *task;
  }

  void TearDown() override {
    if (server_) server_->Stop();
    peer_.reset();
    if (runner_.joinable()) runner_.join();
  }

  v1::SplitUp Open(const std::string& token = "") const {
    v1::SplitUp m;
    auto* o = m.mutable_open();
    o->set_run_id(task_.run_id());
    o->set_client_id(peer_->welcome().client_id());
    o->set_session_token(token.empty() ? peer_->welcome().session_token() : token);
    o->set_round(task_.round());
    o->set_task_id(task_.task_id());
    return m;
  }

  // Sends `msgs` on a new split stream, collects the replies and returns its status.
  grpc::Status Exchange(const std::vector<v1::SplitUp>& msgs,
                        std::vector<v1::SplitDown>* replies = nullptr) {
    grpc::ClientContext ctx;
    auto stream = peer_->stub()->Split(&ctx);
    std::thread writer([&] {
      for (const auto& m : msgs) {
        if (!stream->Write(m)) break;
      }
      stream->WritesDone();
    });
    v1::SplitDown d;
    while (stream->Read(&d)) {
      if (replies) replies->push_back(d);
    }
    writer.join();
    return stream->Finish();
  }

  std::unique_ptr<Server> server_;
  std::string address_;
  std::thread runner_;
  std::unique_ptr<TestPeer> peer_;
  v1::Task task_;
};

// The round builds each cut's client part once: every client at that cut gets the same
// blob, which holds the global model's tensors of the stages before the cut.
TEST(SplitPartBlobTest, ClientsAtOneCutShareOnePublishedPart) {
  ServerOptions o;
  o.config = TestConfig("model: {name: lenet5}\nrun: {rounds: 1}\nclients: {min: 3}\n"
                        "train: {batch_size: 8}\nsplit: {mode: sfl-v2, cut: 2}\n"
                        "data: {test_limit: 100}\n");
  o.listen = "127.0.0.1:0";
  o.insecure = true;
  auto server = Server::Create(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->Start().ok());
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  std::thread runner([&] { (*server)->Run().IgnoreError(); });
  std::vector<std::unique_ptr<TestPeer>> peers;
  for (int i = 0; i < 3; ++i) {
    peers.push_back(std::make_unique<TestPeer>(address, 100));
    ASSERT_TRUE(peers.back()->Join());
  }
  std::vector<v1::Task> tasks;
  for (auto& p : peers) {
    auto t = p->NextTask();
    ASSERT_TRUE(t.has_value());
    tasks.push_back(*t);
  }
  EXPECT_EQ(tasks[1].model_digest(), tasks[0].model_digest());
  EXPECT_EQ(tasks[2].model_digest(), tasks[0].model_digest());
  auto blob = FetchBlob(peers[0]->stub(), peers[0]->welcome().client_id(),
                        peers[0]->welcome().session_token(), tasks[0].model_digest());
  ASSERT_TRUE(blob.ok()) << blob.status();
  auto part = ParameterSet::Decode(*blob);
  ASSERT_TRUE(part.ok()) << part.status();
  const ParameterSet global = (*server)->GlobalModel();
  ASSERT_EQ(part->size(), 4u) << "lenet5's two convolutions, weight and bias";
  for (const Tensor& t : part->tensors()) EXPECT_EQ(t.values, global.Find(t.name)->values) << t.name;
  (*server)->Stop();
  peers.clear();
  runner.join();
}

TEST_F(SplitValidationTest, AGoodMicroBatchGetsItsGradient) {
  Start("sfl-v2");
  std::vector<v1::SplitDown> replies;
  auto s = Exchange({Open(), Batch(1, 8, 8), Batch(2, 3, 3)}, &replies);
  EXPECT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_TRUE(replies[0].has_ready());
  ASSERT_TRUE(replies[2].has_result());
  EXPECT_EQ(replies[2].result().seq(), 2);
  EXPECT_EQ(std::vector<int64_t>(replies[2].result().grad().shape().begin(),
                                 replies[2].result().grad().shape().end()),
            (std::vector<int64_t>{3, 16, 4, 4}));
  EXPECT_GT(replies[1].result().loss(), 0);
}

TEST_F(SplitValidationTest, OpeningChecksIdentityRoundAndTask) {
  Start("sfl-v2");
  EXPECT_EQ(Exchange({Batch(1, 8, 8)}).error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Exchange({Open("00ff")}).error_code(), StatusCode::UNAUTHENTICATED);
  auto wrong_round = Open();
  wrong_round.mutable_open()->set_round(task_.round() + 1);
  EXPECT_EQ(Exchange({wrong_round}).error_code(), StatusCode::FAILED_PRECONDITION);
  auto wrong_task = Open();
  wrong_task.mutable_open()->set_task_id("r1-c99");
  EXPECT_EQ(Exchange({wrong_task}).error_code(), StatusCode::FAILED_PRECONDITION);
  // None of that touched the task: the real stream still works, and only once.
  EXPECT_TRUE(Exchange({Open(), Batch(1, 8, 8)}).ok());
  EXPECT_EQ(Exchange({Open()}).error_code(), StatusCode::ALREADY_EXISTS);
}

struct BadBatch {
  std::string name;
  std::function<v1::SplitUp()> make;
  std::string message;
};

TEST_F(SplitValidationTest, BadMicroBatchesAreRejected) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<BadBatch> cases = {
      {"replayed", [] { return Batch(1, 8, 8); }, "expected 2"},
      {"skipped", [] { return Batch(3, 8, 8); }, "expected 2"},
      {"NaN", [&] { return Batch(2, 8, 8, nan); }, "is not finite"},
      {"too large", [] { return Batch(2, 9, 9); }, "expected 1..8"},
      {"too few labels", [] { return Batch(2, 8, 7); }, "7 labels for 8 samples"},
      {"label out of range",
       [] {
         auto m = Batch(2, 8, 8);
         m.mutable_batch()->set_labels(0, 10);
         return m;
       },
       "label 10"},
      {"wrong shape",
       [] {
         auto m = Batch(2, 8, 8);
         m.mutable_batch()->mutable_activations()->set_shape(1, 8);
         m.mutable_batch()->mutable_activations()->set_shape(2, 8);
         return m;
       },
       "expected [B,16,4,4]"},
      {"short data",
       [] {
         auto m = Batch(2, 8, 8);
         m.mutable_batch()->mutable_activations()->mutable_data()->resize(100);
         return m;
       },
       "does not match its shape"},
      {"oversized dimension",
       [] {
         auto m = Batch(2, 8, 8);
         m.mutable_batch()->mutable_activations()->set_shape(0, int64_t{1} << 40);
         return m;
       },
       "oversized"},
      {"a loss share over 1",
       [] {
         auto m = Batch(2, 8, 8);
         m.mutable_batch()->set_loss_weight(1.5);
         return m;
       },
       "loss_weight must be in [0, 1]"},
      {"a loss share that is not a number",
       [] {
         auto m = Batch(2, 8, 8);
         m.mutable_batch()->set_loss_weight(std::numeric_limits<double>::quiet_NaN());
         return m;
       },
       "loss_weight must be in [0, 1]"},
      {"a gradient in sfl",
       [] {
         v1::SplitUp m;
         m.mutable_grad()->set_seq(1);
         return m;
       },
       "only sent in U-shaped"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Start("sfl-v2");
    std::vector<v1::SplitDown> replies;
    auto s = Exchange({Open(), Batch(1, 8, 8), c.make()}, &replies);
    EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find(c.message), std::string::npos) << s.error_message();
    EXPECT_EQ(replies.size(), 2u) << "the good micro-batch is answered, the bad one not";
    TearDown();
  }
}

// A split upload's stats are checked, the pipeline's timeline included: a span that
// ends before it starts, or that is not finite, is refused with the reason.
TEST_F(SplitValidationTest, UploadsWithBadPipelineSpansAreRefused) {
  Start("sfl-v1");
  for (double end : {0.5, std::numeric_limits<double>::quiet_NaN()}) {
    v1::UploadHeader h = peer_->Header(task_, 10);
    h.set_total_size(task_.model_size());  // the client part's encoding, as the stats' check comes after
    v1::PipelineSpan* x = h.mutable_split()->add_spans();
    x->set_start_s(1.0);
    x->set_end_s(end);
    v1::UploadReply reply;
    const grpc::Status s = peer_->RawUpload(h, {}, &reply);
    EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("pipeline span"), std::string::npos) << s.error_message();
  }
}

TEST_F(SplitValidationTest, UShapedRefusesLabelsAndUnknownGradients) {
  Start("ushaped");
  auto s = Exchange({Open(), Batch(1, 8, 8)});
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("labels must not be sent"), std::string::npos);
  TearDown();

  Start("ushaped");
  std::vector<v1::SplitDown> replies;
  v1::SplitUp grad;
  grad.mutable_grad()->set_seq(7);
  s = Exchange({Open(), Batch(1, 8, 0), grad}, &replies);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not pending"), std::string::npos) << s.error_message();
  ASSERT_EQ(replies.size(), 2u);
  ASSERT_TRUE(replies[1].has_forward()) << "the middle's output comes back";
  EXPECT_EQ(replies[1].forward().activations().shape(0), 8);
}

}  // namespace
}  // namespace cleave
