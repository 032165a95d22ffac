// Every kind of bad upload gets a clear status and leaves the round's aggregate alone;
// the round then commits exactly the FedAvg of the good uploads.
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include "client/client.h"
#include "client/transfer.h"
#include "compression/codec.h"
#include "server/server.h"
#include "tests/deadline.h"
#include "tests/server/running_server.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

using grpc::StatusCode;

class ServerFixture : public RunningServerTest {
 protected:
  void StartServer(const std::string& yaml, std::optional<ParameterSet> initial = std::nullopt,
                   std::shared_ptr<Clock> clock = nullptr) {
    ServerOptions o;
    o.config = TestConfig(yaml);
    o.initial_model = std::move(initial);
    o.clock = std::move(clock);
    StartServerWith(std::move(o));
  }
};

// A delta with the global model's layout: value(i) = scale * ((i % 7) - 3).
ParameterSet Delta(const ParameterSet& layout, float scale) {
  ParameterSet d = layout.ZerosLike();
  for (auto& t : d.mutable_tensors()) {
    for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = scale * ((i % 7) - 3.0f);
  }
  return d;
}

std::vector<std::string> Chunks(const std::string& bytes, size_t n = 1 << 20) {
  std::vector<std::string> out;
  for (size_t off = 0; off < bytes.size(); off += n) out.push_back(bytes.substr(off, n));
  return out;
}

constexpr char kTwoClients[] = R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 2, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120}
)";

// Downloads are hand-encoded chunks over the shared blob (FetchReactor): each a valid
// Chunk with its offset, the total size and server.chunk_bytes of data (the last one
// the rest), together the model's exact bytes.
TEST_F(ServerFixture, DownloadsArriveAsOrderedChunksOfTheBlob) {
  StartServer("run: {rounds: 1}\nmodel: {name: mlp}\n"
              "clients: {min: 2, quorum: 1.0, round_deadline_s: 60}\n"
              "server: {chunk_bytes: 1024, client_timeout_s: 120}\n");
  TestPeer a(address_, 100), b(address_, 300);
  ASSERT_TRUE(a.Join("a"));
  ASSERT_TRUE(b.Join("b"));
  auto task = a.NextTask();
  ASSERT_TRUE(task);
  const std::string expected = server_->GlobalModel().Encode();
  ASSERT_GT(expected.size(), 3 * 1024u);
  grpc::ClientContext ctx;
  ctx.set_deadline(testing::RpcDeadline(60));
  v1::FetchRequest req;
  req.set_client_id(a.welcome().client_id());
  req.set_session_token(a.welcome().session_token());
  req.set_digest(task->model_digest());
  auto reader = a.stub()->Fetch(&ctx, req);
  std::string got;
  v1::Chunk chunk;
  int chunks = 0;
  while (reader->Read(&chunk)) {
    EXPECT_EQ(chunk.offset(), static_cast<int64_t>(got.size()));
    EXPECT_EQ(chunk.total_size(), static_cast<int64_t>(expected.size()));
    EXPECT_EQ(chunk.data().size(), std::min<size_t>(1024, expected.size() - got.size()));
    got += chunk.data();
    ++chunks;
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(chunks, static_cast<int>((expected.size() + 1023) / 1024));
  EXPECT_EQ(got, expected);
}

TEST_F(ServerFixture, RejectsBadUploadsAndAggregatesOnlyGoodOnes) {
  StartServer(kTwoClients);
  const ParameterSet initial = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 300);
  ASSERT_TRUE(a.Join("a"));
  ASSERT_TRUE(b.Join("b"));
  auto ta = a.NextTask();
  auto tb = b.NextTask();
  ASSERT_TRUE(ta && tb);
  EXPECT_EQ(ta->round(), 1);

  // The model download is content-addressed and matches the server's model.
  auto blob = FetchBlob(a.stub(), a.welcome().client_id(), a.welcome().session_token(),
                        ta->model_digest());
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_EQ(*blob, initial.Encode());
  EXPECT_EQ(ta->model_digest(), tb->model_digest());
  EXPECT_EQ(FetchBlob(a.stub(), a.welcome().client_id(), "wrong", ta->model_digest())
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(FetchBlob(a.stub(), a.welcome().client_id(), a.welcome().session_token(),
                      std::string(64, '0'))
                .status()
                .code(),
            absl::StatusCode::kNotFound);

  const ParameterSet da = Delta(initial, 0.01f), db = Delta(initial, -0.02f);
  const std::string good = da.Encode();
  const int64_t size = static_cast<int64_t>(good.size());
  auto header = [&](auto edit) {
    v1::UploadHeader h = a.Header(*ta, 100);
    h.set_total_size(size);
    edit(h);
    return h;
  };
  auto expect = [&](const v1::UploadHeader& h, const std::vector<std::string>& chunks,
                    StatusCode code, const std::string& needle) {
    grpc::Status s = a.RawUpload(h, chunks);
    EXPECT_EQ(s.error_code(), code) << needle << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(needle), std::string::npos) << s.error_message();
  };
  const auto body = Chunks(good);

  expect(header([](auto& h) { h.set_client_id("c999"); }), body, StatusCode::UNAUTHENTICATED,
         "unknown client");
  expect(header([](auto& h) { h.set_session_token("forged"); }), body,
         StatusCode::UNAUTHENTICATED, "token");
  expect(header([](auto& h) { h.set_run_id("other-run"); }), body,
         StatusCode::FAILED_PRECONDITION, "run");
  expect(header([](auto& h) { h.set_round(2); }), body, StatusCode::FAILED_PRECONDITION,
         "round 2");
  expect(header([&](auto& h) { h.set_task_id(tb->task_id()); }), body,
         StatusCode::FAILED_PRECONDITION, "was not given");
  expect(header([](auto& h) { h.set_codec("int8"); }), body, StatusCode::INVALID_ARGUMENT,
         "codec");
  expect(header([](auto& h) { h.set_num_examples(0); }), body, StatusCode::INVALID_ARGUMENT,
         "num_examples");
  expect(header([](auto& h) { h.set_num_examples(101); }), body, StatusCode::INVALID_ARGUMENT,
         "num_examples");
  expect(header([](auto& h) { h.set_train_loss(std::numeric_limits<double>::quiet_NaN()); }),
         body, StatusCode::INVALID_ARGUMENT, "train_loss");
  expect(header([&](auto& h) { h.set_total_size(size * 1000); }), body,
         StatusCode::INVALID_ARGUMENT, "announces");
  expect(header([](auto&) {}), {good, "extra"}, StatusCode::INVALID_ARGUMENT, "larger than");
  expect(header([](auto&) {}), {good.substr(0, size - 4)}, StatusCode::INVALID_ARGUMENT,
         "upload ended after");
  expect(header([](auto&) {}), {std::string(size, 'x')}, StatusCode::INVALID_ARGUMENT,
         "bad magic");

  // Wrong shape with the same byte count: the first weight transposed.
  ParameterSet transposed = da;
  auto& shape = transposed.mutable_tensors()[0].shape;
  std::swap(shape[0], shape[1]);
  expect(header([](auto&) {}), Chunks(transposed.Encode()), StatusCode::INVALID_ARGUMENT,
         "expected shape");
  // A NaN anywhere.
  ParameterSet nan = da;
  nan.mutable_tensors()[2].values[5] = std::numeric_limits<float>::quiet_NaN();
  expect(header([](auto&) {}), Chunks(nan.Encode()), StatusCode::INVALID_ARGUMENT,
         "non-finite");
  // A data message before the header.
  {
    grpc::ClientContext ctx;
    v1::UploadReply r;
    auto w = a.stub()->Upload(&ctx, &r);
    v1::UploadChunk m;
    m.set_data("xx");
    w->Write(m);
    w->WritesDone();
    EXPECT_EQ(w->Finish().error_code(), StatusCode::INVALID_ARGUMENT);
  }

  // Nothing above touched the round.
  EXPECT_EQ(server_->committed_round(), 0);

  // Good uploads; a repeat is acknowledged once and not counted again.
  v1::UploadReply reply;
  ASSERT_TRUE(a.RawUpload(header([](auto&) {}), body, &reply).ok());
  EXPECT_FALSE(reply.duplicate());
  ASSERT_TRUE(a.RawUpload(header([](auto&) {}), body, &reply).ok());
  EXPECT_TRUE(reply.duplicate());
  v1::UploadHeader hb = b.Header(*tb, 300);
  auto rb = UploadPayload(b.stub(), hb, db.Encode());
  ASSERT_TRUE(rb.ok()) << rb.status();

  ASSERT_TRUE(a.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  ASSERT_EQ(server_->committed_round(), 1);
  auto history = server_->History();
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].participants, 2);
  EXPECT_EQ(history[0].failures, 0);
  EXPECT_DOUBLE_EQ(history[0].train_loss, 0.5);

  // global = initial + (100 * da + 300 * db) / 400
  ParameterSet after = server_->GlobalModel();
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after.tensors()[i].values.size(); ++j) {
      const double expected = initial.tensors()[i].values[j] +
                              (100.0 * da.tensors()[i].values[j] +
                               300.0 * db.tensors()[i].values[j]) / 400.0;
      ASSERT_NEAR(after.tensors()[i].values[j], expected, 1e-6) << i << "," << j;
    }
  }
}

// Model-sized work runs outside the coordinator's lock: while one upload is being
// validated and added, the server answers other calls and refuses a second upload of the
// same task, and the round does not close, even past its deadline, before the upload is
// counted.
TEST_F(ServerFixture, UploadsAreAddedOutsideTheLockAndTheRoundWaitsForThem) {
  auto clock = std::make_shared<FakeClock>();
  std::mutex mu;
  std::condition_variable cv;
  int entered = 0;
  bool release = false;
  ServerOptions o;
  o.config = TestConfig("run: {rounds: 1}\nmodel: {name: mlp}\n"
                        "clients: {min: 1, quorum: 1.0, round_deadline_s: 60}\n"
                        "server: {client_timeout_s: 100000}\n");
  o.clock = clock;
  o.before_accumulate = [&] {
    std::unique_lock<std::mutex> l(mu);
    ++entered;
    cv.notify_all();
    cv.wait(l, [&] { return release; });
  };
  StartServerWith(std::move(o));
  const ParameterSet initial = server_->GlobalModel();
  TestPeer a(address_, 100);
  ASSERT_TRUE(a.Join("a"));
  auto task = a.NextTask();
  ASSERT_TRUE(task);
  const ParameterSet delta = Delta(initial, 0.01f);
  const std::string payload = delta.Encode();
  v1::UploadHeader header = a.Header(*task, 100);
  header.set_total_size(static_cast<int64_t>(payload.size()));
  grpc::Status first;
  std::thread upload([&] { first = a.RawUpload(header, Chunks(payload)); });
  bool in_hook = false;
  {
    std::unique_lock<std::mutex> l(mu);
    in_hook = cv.wait_for(l, std::chrono::seconds(60), [&] { return entered == 1; });
  }
  if (!in_hook) {
    upload.join();
    FAIL() << "the upload never reached the work outside the lock: " << first.error_message();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(testing::RpcDeadline(60));
  v1::StatusReply status;
  ASSERT_TRUE(a.stub()->GetStatus(&ctx, v1::StatusRequest(), &status).ok());
  EXPECT_EQ(status.round(), 1);
  const grpc::Status second = a.RawUpload(header, Chunks(payload));
  EXPECT_EQ(second.error_code(), StatusCode::ABORTED) << second.error_message();
  clock->AdvanceSeconds(120);  // past the round's deadline
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // time to close it, wrongly
  EXPECT_EQ(server_->committed_round(), 0);
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  upload.join();
  EXPECT_TRUE(first.ok()) << first.error_message();
  ASSERT_TRUE(a.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  auto history = server_->History();
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].participants, 1);
  EXPECT_EQ(history[0].failures, 0);
  EXPECT_EQ(entered, 1);
  const ParameterSet after = server_->GlobalModel();
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after.tensors()[i].values.size(); ++j) {
      ASSERT_NEAR(after.tensors()[i].values[j],
                  initial.tensors()[i].values[j] + delta.tensors()[i].values[j], 1e-6);
    }
  }
}

// Federated evaluation is the client's word, but within range: unknown metric names,
// fractions above 1, negative errors and impossible counts are refused, and so is an
// evaluation task's upload without an evaluation or with a model-sized payload. The
// final evaluation then leaves the committed model as it was.
TEST_F(ServerFixture, EvaluationsAreCheckedAndTheFinalOneOnlyMeasures) {
  StartServer(R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 1, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120}
)");
  const ParameterSet initial = server_->GlobalModel();
  TestPeer a(address_, 100);
  ASSERT_TRUE(a.Join("a"));
  auto task = a.NextTask();
  ASSERT_TRUE(task);
  const ParameterSet delta = Delta(initial, 0.01f);
  const std::string update = delta.Encode();
  auto upload = [&](const v1::Task& t, const std::string& payload,
                    const std::function<void(v1::ClientEvaluation*)>& edit) {
    v1::UploadHeader h = a.Header(t, 100);
    h.set_total_size(static_cast<int64_t>(payload.size()));
    if (edit) {
      v1::ClientEvaluation* e = h.mutable_evaluation();
      e->set_examples(20);
      e->set_accuracy(0.5);
      e->set_loss(0.7);
      e->set_seconds(0.01);
      edit(e);
    }
    return a.RawUpload(h, Chunks(payload));
  };
  const std::vector<std::pair<std::function<void(v1::ClientEvaluation*)>, std::string>> bad = {
      {[](auto* e) { (*e->mutable_metrics())["bo gus"] = 0.5; }, "metric 'bo gus' unknown"},
      {[](auto* e) { (*e->mutable_metrics())["accuracy_max"] = 0.5; }, "metric 'accuracy_max' unknown"},
      {[](auto* e) { (*e->mutable_metrics())["own"] = std::nan(""); }, "metric 'own' unknown"},
      {[](auto* e) {
         for (int i = 0; i < 17; ++i) (*e->mutable_metrics())["m" + std::to_string(i)] = i;
       },
       "17 metrics; at most 16"},
      {[](auto* e) { (*e->mutable_metrics())["f1"] = 1.5; }, "metric 'f1'"},
      {[](auto* e) { (*e->mutable_metrics())["rmse"] = -1; }, "metric 'rmse'"},
      {[](auto* e) { (*e->mutable_metrics())["mae"] = std::nan(""); }, "metric 'mae'"},
      {[](auto* e) { (*e->mutable_metrics())["perplexity"] = 0.5; }, "metric 'perplexity'"},
      {[](auto* e) { e->set_accuracy(2); }, "accuracy in [0, 1]"},
      {[](auto* e) { e->set_examples(901); }, "examples must be in [1, 900]"},
  };
  for (const auto& [edit, needle] : bad) {
    grpc::Status s = upload(*task, update, edit);
    EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << needle;
    EXPECT_NE(s.error_message().find(needle), std::string::npos) << s.error_message();
  }
  // A client's own metric (a Flower client's evaluate returns any) is taken as it is.
  ASSERT_TRUE(upload(*task, update, [](auto* e) {
                (*e->mutable_metrics())["f1"] = 0.8;
                (*e->mutable_metrics())["f1_macro"] = -3.5;
              }).ok());

  // The final evaluation: the committed round's model, an empty upload with the numbers.
  auto final_task = a.NextTask();
  ASSERT_TRUE(final_task);
  EXPECT_TRUE(final_task->evaluate_only());
  EXPECT_EQ(final_task->round(), 1);
  const std::string empty = ParameterSet().Encode();
  grpc::Status s = upload(*final_task, empty, nullptr);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("must carry its evaluation"), std::string::npos)
      << s.error_message();
  s = upload(*final_task, update, [](auto*) {});
  EXPECT_NE(s.error_message().find("announces " + std::to_string(update.size())),
            std::string::npos) << s.error_message();
  ASSERT_TRUE(upload(*final_task, empty, [](auto* e) { e->set_accuracy(0.75); }).ok());
  EXPECT_TRUE(a.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  const auto h = server_->History();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_FALSE(h[0].evaluation_only);
  EXPECT_DOUBLE_EQ(h[0].client_eval.metrics.at("f1"), 0.8);
  ASSERT_TRUE(h[1].evaluation_only);
  EXPECT_EQ(h[1].round, 1);
  EXPECT_DOUBLE_EQ(h[1].client_eval.accuracy, 0.75);
  // One client, its whole weight: the model is initial + delta, untouched since.
  const ParameterSet final_model = server_->GlobalModel();
  for (size_t i = 0; i < initial.size(); ++i) {
    for (size_t j = 0; j < initial.tensors()[i].values.size(); ++j) {
      ASSERT_NEAR(final_model.tensors()[i].values[j],
                  initial.tensors()[i].values[j] + delta.tensors()[i].values[j], 1e-6);
    }
  }
}

TEST_F(ServerFixture, ControlStreamMustStartWithJoin) {
  StartServer(kTwoClients);
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Control(&ctx);
  v1::ClientMessage m;
  m.mutable_heartbeat()->set_unix_ms(1);
  stream->Write(m);
  stream->WritesDone();
  v1::ServerMessage reply;
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_EQ(stream->Finish().error_code(), StatusCode::FAILED_PRECONDITION);

  grpc::ClientContext ctx2;
  auto s2 = stub->Control(&ctx2);
  m.mutable_join()->set_num_examples(10);
  m.mutable_join()->set_protocol_version(2);
  s2->Write(m);
  s2->WritesDone();
  EXPECT_FALSE(s2->Read(&reply));
  grpc::Status st = s2->Finish();
  EXPECT_EQ(st.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("protocol version"), std::string::npos);
}

// Bytes that do not decode as a ClientMessage end the control stream with
// INVALID_ARGUMENT, not OK.
TEST_F(ServerFixture, UndecodableControlMessageIsInvalidArgument) {
  StartServer(kTwoClients);
  grpc::GenericStub generic(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(&ctx, "/cleave.v1.Coordinator/Control", &cq);
  void* tag;
  bool ok;
  auto next = [&] { return cq.Next(&tag, &ok) && ok; };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(next());
  const std::string junk = "\xff\xff\xff\xff not a protobuf";
  grpc::Slice slice(junk);
  grpc::ByteBuffer buffer(&slice, 1);
  call->Write(buffer, reinterpret_cast<void*>(2));
  next();
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(3));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(3)) {
  }
  EXPECT_EQ(status.error_code(), StatusCode::INVALID_ARGUMENT) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

// A client that stops heartbeating is dropped after server.client_timeout_s and its task
// fails, long before the round deadline; the round commits with the client that did its
// work. Time is a FakeClock: 31 s pass when the test says so.
TEST_F(ServerFixture, SilentClientIsDroppedAndTheRoundCommits) {
  auto clock = std::make_shared<FakeClock>();
  StartServer(R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 2, quorum: 0.5, round_deadline_s: 600}
server: {heartbeat_s: 10, client_timeout_s: 30}
)",
              std::nullopt, clock);
  const ParameterSet initial = server_->GlobalModel();
  TestPeer worker(address_, 100), silent(address_, 100);  // neither heartbeats
  ASSERT_TRUE(worker.Join("worker") && silent.Join("silent"));
  auto tw = worker.NextTask(), ts = silent.NextTask();
  ASSERT_TRUE(tw && ts);
  ASSERT_TRUE(UploadPayload(worker.stub(), worker.Header(*tw, 100), Delta(initial, 0.01f).Encode())
                  .ok());
  clock->AdvanceSeconds(29);
  ASSERT_FALSE(silent.WaitRunEnded(0.2)) << "dropped before client_timeout_s";
  EXPECT_EQ(server_->committed_round(), 0);
  clock->AdvanceSeconds(2);
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  auto h = server_->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].participants, 1);
  EXPECT_EQ(h[0].failures, 1);
  EXPECT_NEAR(h[0].wall_s, 31, 1) << "the round ended when the silent client was dropped";
}

// An upload that sends its header and then stalls is cancelled when the round closes,
// instead of holding an upload slot for as long as its connection lives; the honest upload
// queued behind it is cancelled with the round. The round's deadline passes on a FakeClock.
TEST_F(ServerFixture, StalledUploadIsCancelledWhenTheRoundCloses) {
  auto clock = std::make_shared<FakeClock>();
  StartServer(R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 2, quorum: 0.5, round_deadline_s: 60}
server: {client_timeout_s: 1000, worker_threads: 1, upload_idle_timeout_s: 1000}
)",
              std::nullopt, clock);
  const ParameterSet initial = server_->GlobalModel();
  TestPeer staller(address_, 10), good(address_, 10);
  ASSERT_TRUE(staller.Join());
  ASSERT_TRUE(good.Join());
  auto ts = staller.NextTask();
  auto tg = good.NextTask();
  ASSERT_TRUE(ts && tg);
  const std::string payload = Delta(initial, 0.01f).Encode();

  grpc::ClientContext ctx;
  ctx.set_deadline(testing::RpcDeadline(60));
  v1::UploadReply reply;
  auto w = staller.stub()->Upload(&ctx, &reply);
  v1::UploadChunk m;
  *m.mutable_header() = staller.Header(*ts, 10);
  m.mutable_header()->set_total_size(static_cast<int64_t>(payload.size()));
  ASSERT_TRUE(w->Write(m));
  m.set_data(payload.substr(0, 1000));
  ASSERT_TRUE(w->Write(m));  // ... and nothing more: it holds the only upload slot
  ASSERT_TRUE(WaitForUploads(1, 0));

  // The honest upload waits behind it; both end when the round's deadline passes.
  Status good_status;
  std::thread t([&] {
    good_status = UploadPayload(good.stub(), good.Header(*tg, 10), payload).status();
  });
  ASSERT_TRUE(WaitForUploads(2, 1));
  clock->AdvanceSeconds(61);
  grpc::Status stalled = w->Finish();
  t.join();
  EXPECT_EQ(stalled.error_code(), StatusCode::CANCELLED) << stalled.error_message();
  EXPECT_FALSE(good_status.ok()) << "queued past the deadline: its round is gone";
  server_->Stop();  // it would retry the round below quorum
  runner_.join();
  // Below quorum (0 of 2 results): the round did not commit.
  EXPECT_EQ(server_->committed_round(), 0);
}

TEST_F(ServerFixture, ReportsStatus) {
  StartServer(kTwoClients);
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  TestPeer a(address_, 10);
  ASSERT_TRUE(a.Join());
  // The server counts a client as connected just after its Welcome is queued, and its
  // run thread may not have left "starting" yet.
  v1::StatusReply reply;
  for (int i = 0; i < 100 && (reply.connected_clients() != 1 || reply.phase() == "starting"); ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->GetStatus(&ctx, v1::StatusRequest(), &reply).ok());
  }
  EXPECT_EQ(reply.run_id(), a.welcome().run_id());
  EXPECT_EQ(reply.total_rounds(), 1);
  EXPECT_EQ(reply.connected_clients(), 1);
  EXPECT_EQ(reply.phase(), "waiting for clients");
}

// More concurrent uploads than worker slots: the extra ones wait (flow control) and
// every update is still aggregated exactly once.
TEST_F(ServerFixture, QueuedUploadsAreAllAggregated) {
  StartServer(R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 6, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120, worker_threads: 1, chunk_bytes: 1024}
)");
  const ParameterSet initial = server_->GlobalModel();
  std::vector<std::unique_ptr<TestPeer>> peers;
  std::vector<v1::Task> tasks;
  for (int i = 0; i < 6; ++i) {
    peers.push_back(std::make_unique<TestPeer>(address_, 10 * (i + 1)));
    ASSERT_TRUE(peers.back()->Join());
  }
  for (auto& p : peers) {
    auto t = p->NextTask();
    ASSERT_TRUE(t);
    tasks.push_back(*t);
  }
  std::vector<std::thread> uploads;
  std::vector<Status> results(6);
  for (int i = 0; i < 6; ++i) {
    uploads.emplace_back([&, i] {
      auto r = UploadPayload(peers[i]->stub(), peers[i]->Header(tasks[i], 10 * (i + 1)),
                             Delta(initial, 0.001f * (i + 1)).Encode(), 1024);
      results[i] = r.status();
    });
  }
  for (auto& t : uploads) t.join();
  for (const auto& r : results) EXPECT_TRUE(r.ok()) << r;
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  // Weighted mean of scale (i+1)*0.001 with weights 10(i+1): sum k^2 / sum k * 0.001.
  const double scale = 0.001 * (1 + 4 + 9 + 16 + 25 + 36) / 21.0;
  ParameterSet expected = Delta(initial, 1.0f);
  ParameterSet after = server_->GlobalModel();
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after.tensors()[i].values.size(); j += 97) {
      ASSERT_NEAR(after.tensors()[i].values[j],
                  initial.tensors()[i].values[j] + scale * expected.tensors()[i].values[j], 1e-6);
    }
  }
}

// A 300 MB parameter set travels down and up in chunks below gRPC's 4 MiB limit.
TEST_F(ServerFixture, TransfersA300MegabyteModel) {
  ParameterSet big;
  const int64_t n = 75'000'000;  // 300 MB of float32
  Tensor t{"big", {n}, std::vector<float>(n)};
  for (int64_t i = 0; i < n; ++i) t.values[i] = static_cast<float>(i % 1000) * 1e-3f;
  ASSERT_TRUE(big.Add(std::move(t)).ok());
  StartServer(R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 1, quorum: 1.0, round_deadline_s: 300}
server: {client_timeout_s: 300}
)",
              big);
  TestPeer p(address_, 10);
  ASSERT_TRUE(p.Join());
  auto task = p.NextTask();
  ASSERT_TRUE(task);
  EXPECT_GT(task->model_size(), 300'000'000);
  auto blob = FetchBlob(p.stub(), p.welcome().client_id(), p.welcome().session_token(),
                        task->model_digest());
  ASSERT_TRUE(blob.ok()) << blob.status();
  auto global = ParameterSet::Decode(*blob);
  ASSERT_TRUE(global.ok());
  EXPECT_FLOAT_EQ(global->tensors()[0].values[999], 0.999f);
  blob->clear();
  ParameterSet delta = global->ZerosLike();
  delta.mutable_tensors()[0].values[12345] = 2.0f;
  auto reply = UploadPayload(p.stub(), p.Header(*task, 10), delta.Encode());
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(p.WaitRunEnded(120));
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  ParameterSet after = server_->GlobalModel();
  EXPECT_FLOAT_EQ(after.tensors()[0].values[12345], 0.345f + 2.0f);
  EXPECT_FLOAT_EQ(after.tensors()[0].values[12346], 0.346f);
}

// A job whose codecs cannot serve their direction is refused at start, saying which key.
TEST(ServerConfigTest, CodecsThatCannotServeTheirDirectionAreRefused) {
  for (const auto& [compression, needle] : std::vector<std::pair<std::string, std::string>>{
           {"{update: zip}", "compression.update: unknown codec"},
           {"{update: \"qsgd:500\"}", "compression.update"},
           {"{broadcast: \"topk:0.1\"}", "compression.broadcast: codec topk:0.1 keeps state"},
           {"{broadcast: sign}", "compression.broadcast"},
           {"{activations: \"powersgd:2\"}", "compression.activations"},
           {"{gradients: \"randk:0.5\"}", "compression.gradients"}}) {
    ServerOptions o;
    o.config = TestConfig("model: {name: mlp}\ncompression: " + compression + "\n");
    o.listen = "127.0.0.1:0";
    o.insecure = true;
    auto s = Server::Create(std::move(o));
    ASSERT_FALSE(s.ok()) << compression;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << compression;
    EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status();
  }
}

// compression.update: topk, compression.broadcast: int8. A client that cannot decode or
// encode either is refused at Join; the model comes down as a compressed set; a bad
// compressed update is refused before it touches the aggregate; a good one is read
// through its codec and averaged.
TEST_F(ServerFixture, CompressedUpdatesAreCheckedThenDecodedAndAveraged) {
  StartServer("run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: 1, round_deadline_s: 60}\n"
              "compression: {update: \"topk:0.1\", broadcast: int8}\n");
  const ParameterSet initial = server_->GlobalModel();
  TestPeer old(address_, 100);
  EXPECT_FALSE(old.Join("old", {"fp32", "int8"}));
  TestPeer no_int8(address_, 100);
  EXPECT_FALSE(no_int8.Join("no-int8", {"fp32", "topk"}));
  TestPeer a(address_, 100);
  ASSERT_TRUE(a.Join("a", {"fp32", "topk", "int8"}));
  auto task = a.NextTask();
  ASSERT_TRUE(task);
  EXPECT_EQ(task->update_codec(), "topk:0.1");
  EXPECT_EQ(task->model_codec(), "int8");

  // The model as it came down: int8, within half a step of the server's.
  auto blob = FetchBlob(a.stub(), a.welcome().client_id(), a.welcome().session_token(),
                        task->model_digest(), 10, nullptr);
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_LT(blob->size(), initial.EncodedSize() / 3.9);
  auto received = DecodeCompressedSet(*blob, "int8", 1 << 24);
  ASSERT_TRUE(received.ok()) << received.status();
  for (size_t i = 0; i < initial.size(); ++i) {
    const auto& v = initial.tensors()[i].values;
    float max = 0;
    for (float x : v) max = std::max(max, std::abs(x));
    for (size_t j = 0; j < v.size(); ++j) {
      ASSERT_LE(std::abs(received->tensors()[i].values[j] - v[j]), max / 127 / 2 * 1.0001f);
    }
  }

  const ParameterSet delta = Delta(initial, 0.01f);
  auto codec = *MakeCodec("topk:0.1");
  const std::string good = EncodeTensors(*codec, delta);
  EXPECT_EQ(static_cast<int64_t>(good.size()), EncodedTensorsSize(*codec, initial));
  auto upload = [&](const std::string& codec_name, const std::string& bytes) {
    v1::UploadHeader h = a.Header(*task, 100);
    h.set_codec(codec_name);
    h.set_total_size(static_cast<int64_t>(bytes.size()));
    return a.RawUpload(h, Chunks(bytes));
  };
  auto s = upload("fp32", initial.Encode());
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("the task asked for 'topk:0.1'"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(upload("topk:0.1", good.substr(1)).error_code(), StatusCode::INVALID_ARGUMENT);
  // The first tensor's encoding: [k][k increasing indices][k values].
  const uint32_t k = *reinterpret_cast<const uint32_t*>(good.data());
  std::string out_of_range = good;
  const uint32_t big = 1u << 30;
  std::memcpy(&out_of_range[4 + 4 * (k - 1)], &big, 4);
  s = upload("topk:0.1", out_of_range);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("out of range"), std::string::npos) << s.error_message();
  std::string nan_value = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&nan_value[4 + 4 * k], &nan, 4);
  s = upload("topk:0.1", nan_value);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not finite"), std::string::npos) << s.error_message();
  s = upload("topk:0.1", good);
  ASSERT_TRUE(s.ok()) << s.error_message();
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  // One update: the new model is the initial one (exact, not the int8 copy) plus the
  // decoded delta, exactly.
  auto decoded = DecodeTensors(*MakeCodec("topk:0.1").value(), good, initial);
  ASSERT_TRUE(decoded.ok());
  const ParameterSet after = server_->GlobalModel();
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after.tensors()[i].values.size(); ++j) {
      ASSERT_FLOAT_EQ(after.tensors()[i].values[j],
                      initial.tensors()[i].values[j] + decoded->tensors()[i].values[j]);
    }
  }
}

// Secure-aggregation stage messages pass the same gate as uploads: the session's
// identity, the run, the round, the task; a replay or a message out of stage is refused.
TEST_F(ServerFixture, SecureAggregationMessagesAreCheckedBeforeAnyState) {
  StartServer(R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 3, round_deadline_s: 30}
secure_aggregation: {k: 2, t: 2, stage_timeout_s: 20}
)");
  // A client that declares no count (Join.count_from_fit) cannot join: the weights are
  // fixed before anyone trains.
  TestPeer uncounted(address_, 0);
  uncounted.count_from_fit = true;
  EXPECT_FALSE(uncounted.Join("uncounted", {"fp32", "secagg"}));
  TestPeer a(address_, 100), b(address_, 100), c(address_, 100);
  ASSERT_TRUE(a.Join("a", {"fp32", "secagg"}));
  ASSERT_TRUE(b.Join("b", {"fp32", "secagg"}));
  ASSERT_TRUE(c.Join("c", {"fp32", "secagg"}));
  auto ta = a.NextTask();
  auto tb = b.NextTask();
  ASSERT_TRUE(ta && tb);
  ASSERT_TRUE(ta->has_secagg());
  EXPECT_EQ(ta->secagg().t(), 2);
  auto call = [&](TestPeer& p, const v1::Task& t, auto edit) {
    v1::SecAggRequest r;
    r.set_run_id(t.run_id());
    r.set_client_id(p.welcome().client_id());
    r.set_session_token(p.welcome().session_token());
    r.set_round(t.round());
    r.set_task_id(t.task_id());
    // 32-byte keys, distinct per peer (the server checks sizes and uniqueness only).
    const char id = p.welcome().client_id().back();
    r.mutable_keys()->set_mask_public_key(std::string(31, 'm') + id);
    r.mutable_keys()->set_enc_public_key(std::string(31, 'e') + id);
    edit(r);
    grpc::ClientContext ctx;
    v1::SecAggReply reply;
    return p.stub()->SecAgg(&ctx, r, &reply).error_code();
  };
  auto same = [](v1::SecAggRequest&) {};
  EXPECT_EQ(call(a, *ta, [](v1::SecAggRequest& r) { r.set_session_token("guess"); }),
            StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(a, *ta, [](v1::SecAggRequest& r) { r.set_round(r.round() + 1); }),
            StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(call(a, *ta, [](v1::SecAggRequest& r) { r.set_run_id("another-run"); }),
            StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(call(a, *ta, [&](v1::SecAggRequest& r) { r.set_task_id(tb->task_id()); }),
            StatusCode::FAILED_PRECONDITION)
      << "b's task";
  EXPECT_EQ(call(a, *ta, [](v1::SecAggRequest& r) { r.mutable_shares(); }),
            StatusCode::FAILED_PRECONDITION)
      << "shares while keys are due";
  EXPECT_EQ(call(a, *ta, [](v1::SecAggRequest& r) { r.clear_keys(); }),
            StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(call(a, *ta, same), StatusCode::OK);
  EXPECT_EQ(call(a, *ta, same), StatusCode::ALREADY_EXISTS) << "a replay";
  EXPECT_EQ(call(b, *tb, [&](v1::SecAggRequest& r) {
              *r.mutable_keys() = v1::SecAggKeys();
              r.mutable_keys()->set_mask_public_key(std::string(32, 'x'));
              r.mutable_keys()->set_enc_public_key(std::string(32, 'x'));
            }),
            StatusCode::INVALID_ARGUMENT)
      << "the same key twice";
  EXPECT_EQ(call(b, *tb, same), StatusCode::OK) << "refusals changed nothing";
}

}  // namespace
}  // namespace cleave
