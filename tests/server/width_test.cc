// Width-scaled submodels through a real server (job section width): each device's task
// carries its rate and the submodel's values, its upload is the submodel's delta, and the
// round's model is the per-element mean over the devices that hold each element; an
// upload in another shape is refused and changes nothing. Per-device LoRA ranks: a
// device's task is the leading block of the adapters at its rank, and the round is
// HetLoRA's zero-padded mean or FlexLoRA's factored mean product. With width.assign:
// profile, each device's Profile picks its rate, and one no rate fits is left out.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "aggregation/submodel.h"
#include "client/transfer.h"
#include "models/hf_folder.h"
#include "models/model.h"
#include "proto/edge_weights.h"
#include "server/server.h"
#include "split/cut_policy.h"
#include "tests/server/running_server.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

ParameterSet Filled(const ParameterSet& layout, float v) {
  ParameterSet d = layout.ZerosLike();
  for (auto& t : d.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), v);
  return d;
}

class WidthTest : public RunningServerTest {};

// A one-round job of a small mlp without test data, with `sections` (clients, server,
// width, ...) added.
JobConfig SmallJob(const std::string& sections) {
  return TestConfig("run: {rounds: 1}\nmodel: {name: mlp, input: [4], classes: 3}\ndata: {test: \"\"}\n" + sections);
}

// Two clients in one round, those named a at half width.
ServerOptions HalfWidthForA() {
  ServerOptions o;
  o.config = SmallJob(R"(
clients: {min: 2, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120, final_evaluation: false, evaluate: false}
width: {clients: [{name: a, rate: 0.5}]}
)");
  return o;
}

TEST_F(WidthTest, EachElementIsTheMeanOfTheDevicesThatHoldIt) {
  StartServerWith(HalfWidthForA());
  const ParameterSet initial = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 300);
  ASSERT_TRUE(a.Join("a"));
  ASSERT_TRUE(b.Join("b"));
  auto ta = a.NextTask(), tb = b.NextTask();
  ASSERT_TRUE(ta && tb);
  EXPECT_DOUBLE_EQ(ta->model().width(), 0.5);
  EXPECT_DOUBLE_EQ(tb->model().width(), 1.0);
  // a's model: the leading half of each hidden layer, with the global model's values.
  auto blob = FetchBlob(a.stub(), a.welcome().client_id(), a.welcome().session_token(), ta->model_digest());
  ASSERT_TRUE(blob.ok()) << blob.status();
  const ParameterSet sub = *ParameterSet::Decode(*blob);
  ASSERT_EQ(sub.tensors()[0].shape, (std::vector<int64_t>{100, 4}));
  ASSERT_EQ(sub.tensors()[2].shape, (std::vector<int64_t>{100, 100}));
  ASSERT_EQ(sub.tensors()[4].shape, (std::vector<int64_t>{3, 100}));
  EXPECT_EQ(sub.tensors()[2].values[101], initial.tensors()[2].values[201]) << "row 1, column 1";
  // An upload of the whole model's shape is refused; nothing of it is kept.
  const std::string wrong = Filled(initial, 9.0f).Encode();
  v1::UploadHeader h = a.Header(*ta, 100);
  h.set_total_size(static_cast<int64_t>(wrong.size()));
  EXPECT_EQ(a.RawUpload(h, {wrong}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  for (auto [peer, task, delta, examples] : {std::tuple{&a, &*ta, Filled(sub, 1.0f), 100},
                                             std::tuple{&b, &*tb, Filled(initial, 3.0f), 300}}) {
    const std::string payload = delta.Encode();
    v1::UploadHeader up = peer->Header(*task, examples);
    up.set_total_size(static_cast<int64_t>(payload.size()));
    const grpc::Status s = peer->RawUpload(up, {payload});
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_TRUE(a.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  const ParameterSet next = server_->GlobalModel();
  auto shift = [&](size_t t, size_t i) { return next.tensors()[t].values[i] - initial.tensors()[t].values[i]; };
  EXPECT_NEAR(shift(0, 0), (100 * 1.0 + 300 * 3.0) / 400, 1e-6);  // row 0: both
  EXPECT_NEAR(shift(0, 4 * 150), 3.0, 1e-6);                       // row 150: b alone
  EXPECT_NEAR(shift(2, 200 + 99), 2.5, 1e-6);                      // row 1, column 99: both
  EXPECT_NEAR(shift(2, 200 + 100), 3.0, 1e-6);                     // column 100: b alone
  EXPECT_NEAR(shift(5, 0), 2.5, 1e-6);                             // the classes' bias: both
  const auto h1 = server_->History();
  ASSERT_EQ(h1.size(), 1u);
  EXPECT_EQ(h1[0].widths, (std::map<std::string, double>{{"a", 0.5}, {"b", 1.0}}));
}

// Two participants of one name (names are unique only under mutual TLS) are both in the
// round's widths: the second with its client id beside its name.
TEST_F(WidthTest, TwoParticipantsOfOneNameAreBothListed) {
  StartServerWith(HalfWidthForA());
  TestPeer first(address_, 100), second(address_, 100);
  ASSERT_TRUE(first.Join("a"));
  ASSERT_TRUE(second.Join("a"));
  for (TestPeer* peer : {&first, &second}) {
    auto task = peer->NextTask();
    ASSERT_TRUE(task);
    auto blob = FetchBlob(peer->stub(), peer->welcome().client_id(), peer->welcome().session_token(),
                          task->model_digest());
    ASSERT_TRUE(blob.ok()) << blob.status();
    const std::string payload = Filled(*ParameterSet::Decode(*blob), 1.0f).Encode();
    v1::UploadHeader up = peer->Header(*task, 100);
    up.set_total_size(static_cast<int64_t>(payload.size()));
    ASSERT_TRUE(peer->RawUpload(up, {payload}).ok());
  }
  ASSERT_TRUE(first.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  const auto h = server_->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].widths.size(), 2u);
  EXPECT_EQ(h[0].widths.count("a"), 1u);
}

// Width-scaled submodels in async buffers (scheduler.mode: async): a's half-width
// submodel delta and b's whole-model one are journaled into version 1's buffer; a server
// restarted on the run directory adds a's again in its own layout (the journal keeps its
// rate); c's whole-model upload completes the buffer, whose model is the per-element
// mean over the holders of each element, weighted by examples.
TEST_F(WidthTest, AsyncBuffersPlaceSubmodelsAndReplayThemAfterARestart) {
  const std::string run_dir = ::testing::TempDir() + "/cleave-width-async-" + std::to_string(::getpid());
  std::filesystem::remove_all(run_dir);
  auto options = [&] {
    ServerOptions o;
    o.config = SmallJob(R"(
clients: {min: 1, round_deadline_s: 60}
scheduler: {mode: async, buffer_size: 3, max_staleness: 2, staleness: constant}
server: {client_timeout_s: 120, final_evaluation: false, evaluate: false}
width: {clients: [{name: a, rate: 0.5}]}
)");
    o.run_dir = run_dir;
    return o;
  };
  StartServerWith(options());
  const ParameterSet initial = server_->GlobalModel();
  auto upload = [](TestPeer& peer, const v1::Task& task, const ParameterSet& delta, int64_t examples) {
    const std::string payload = delta.Encode();
    v1::UploadHeader up = peer.Header(task, examples);
    up.set_total_size(static_cast<int64_t>(payload.size()));
    return peer.RawUpload(up, {payload});
  };
  {
    TestPeer a(address_, 100), b(address_, 300);
    ASSERT_TRUE(a.Join("a"));
    ASSERT_TRUE(b.Join("b"));
    auto ta = a.NextTask(), tb = b.NextTask();
    ASSERT_TRUE(ta && tb);
    EXPECT_DOUBLE_EQ(ta->model().width(), 0.5);
    auto blob = FetchBlob(a.stub(), a.welcome().client_id(), a.welcome().session_token(), ta->model_digest());
    ASSERT_TRUE(blob.ok()) << blob.status();
    const ParameterSet sub = *ParameterSet::Decode(*blob);
    ASSERT_EQ(sub.tensors()[2].shape, (std::vector<int64_t>{100, 100}));
    ASSERT_TRUE(upload(a, *ta, Filled(sub, 1.0f), 100).ok());
    ASSERT_TRUE(upload(b, *tb, Filled(initial, 3.0f), 300).ok());
    EXPECT_EQ(server_->committed_round(), 0);
    server_->Stop();
    runner_.join();
  }
  server_.reset();
  StartServerWith(options());
  TestPeer c(address_, 200);
  ASSERT_TRUE(c.Join("c"));
  auto tc = c.NextTask();
  ASSERT_TRUE(tc);
  EXPECT_DOUBLE_EQ(tc->model().width(), 1.0);
  ASSERT_TRUE(upload(c, *tc, Filled(initial, 6.0f), 200).ok());
  ASSERT_TRUE(c.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  const ParameterSet next = server_->GlobalModel();
  auto shift = [&](size_t t, size_t i) { return next.tensors()[t].values[i] - initial.tensors()[t].values[i]; };
  EXPECT_NEAR(shift(0, 0), (100 * 1.0 + 300 * 3.0 + 200 * 6.0) / 600, 1e-5);  // row 0: all three
  EXPECT_NEAR(shift(0, 4 * 150), (300 * 3.0 + 200 * 6.0) / 500, 1e-5);         // row 150: not a
  const auto h = server_->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].participants, 3);
  EXPECT_EQ(h[0].widths.at("c"), 1.0);
  std::filesystem::remove_all(run_dir);
}

// An edge aggregator under width: its task is the whole model, and its upload is its mean
// followed by each element's share of its weight. A share outside [0, 1] is refused and
// changes nothing; a valid upload moves each element by the mean where its share is
// positive and leaves the elements no device below the edge held.
TEST_F(WidthTest, AnEdgeHandsUpItsMeanWithEachElementsShare) {
  ServerOptions o;
  o.config = SmallJob(R"(
clients: {min: 1, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120, final_evaluation: false, evaluate: false}
width: {}
)");
  StartServerWith(std::move(o));
  const ParameterSet initial = server_->GlobalModel();
  TestPeer e(address_, 100);
  e.edge = true;
  ASSERT_TRUE(e.Join("edge"));
  auto task = e.NextTask();
  ASSERT_TRUE(task);
  EXPECT_DOUBLE_EQ(task->model().width(), 1.0);
  auto upload = [&](float share) {
    ParameterSet up = Filled(initial, 2.0f);
    for (const Tensor& x : initial.tensors()) {
      Tensor w{x.name + kEdgeWeightSuffix, x.shape, std::vector<float>(x.values.size(), share)};
      w.values[0] = 0.0f;  // the first element of each tensor: nobody below held it
      EXPECT_TRUE(up.Add(std::move(w)).ok());
    }
    const std::string payload = up.Encode();
    v1::UploadHeader h = e.Header(*task, 100);
    h.set_total_size(static_cast<int64_t>(payload.size()));
    return e.RawUpload(h, {payload});
  };
  EXPECT_EQ(upload(1.5f).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->GlobalModel().tensors()[0].values, initial.tensors()[0].values);
  const grpc::Status ok = upload(0.5f);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  ASSERT_TRUE(e.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  const ParameterSet next = server_->GlobalModel();
  EXPECT_NEAR(next.tensors()[0].values[1] - initial.tensors()[0].values[1], 2.0, 1e-6);
  EXPECT_EQ(next.tensors()[0].values[0], initial.tensors()[0].values[0]) << "held by none below the edge";
}

// width.assign: profile. Each device's Profile picks the largest of width.rates it
// admits: a no limits gets 1; b's memory budget holds rate 1/4 but not 1/2; d's link
// (no compute time) moves rate 1/2's model and delta within width.max_task_s, not rate
// 1's; c's budget holds none, so it is left out and the round goes on without it.
TEST_F(WidthTest, ProfilesAssignTheLargestRateThatFits) {
  const std::string yaml = R"(
clients: {min: 3, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120, final_evaluation: false, evaluate: false, metrics_listen: "127.0.0.1:0"}
train: {local_steps: 5, batch_size: 8}
width: {assign: profile, rates: [0.25, 1, 0.5], max_task_s: 10}
)";
  ServerOptions o;
  o.config = SmallJob(yaml);
  const FitSettings fit = FitOf(o.config.train);
  auto spec = [](double rate) {
    ModelSpec s;
    s.name = "mlp";
    s.input_shape = {4};
    s.num_classes = 3;
    s.width = rate;
    return s;
  };
  auto need = [&](double rate) { return WholeModelCost(spec(rate), {4}, fit, 1)->memory_bytes; };
  auto bytes = [&](double rate) { return static_cast<double>((*Model::Create(spec(rate)))->Parameters().EncodedSize()); };
  ASSERT_LT(need(0.25), need(0.5));
  StartServerWith(std::move(o));
  auto profile = [](int64_t memory, double link) {
    v1::Profile p;
    for (int i = 0; i < 3; ++i) p.add_stage_seconds(0);
    p.set_batch_size(8);
    p.set_memory_limit_bytes(memory);
    p.set_uplink_bytes_per_s(link);
    p.set_downlink_bytes_per_s(link);
    return p;
  };
  TestPeer a(address_, 10), b(address_, 10), c(address_, 10), d(address_, 10);
  for (auto [peer, name] : {std::pair{&a, "a"}, {&b, "b"}, {&c, "c"}, {&d, "d"}}) ASSERT_TRUE(peer->Join(name));
  EXPECT_EQ(a.welcome().profile_batch_size(), 8) << "asked for a profile";
  ASSERT_TRUE(a.SendProfile(profile(0, 0)));
  ASSERT_TRUE(b.SendProfile(profile((need(0.25) + need(0.5)) / 2, 0)));
  ASSERT_TRUE(c.SendProfile(profile(need(0.25) / 2, 0)));
  // task_s = 2 bytes / link: 10 s between rate 1/2's and rate 1's.
  ASSERT_TRUE(d.SendProfile(profile(0, (bytes(0.5) + bytes(1)) / 10)));
  std::map<std::string, double> rates;
  // The operator sees c as unfit.
  httplib::Client http("127.0.0.1", server_->metrics_port());
  for (int i = 0; i < 500; ++i) {  // its profile may still be on its way
    auto state = http.Get("/api/state");
    ASSERT_TRUE(state);
    std::map<std::string, std::string> states;
    const nlohmann::json j = nlohmann::json::parse(state->body);
    for (const auto& client : j["clients"]) {
      states[client["name"].get<std::string>()] = client["state"].get<std::string>();
    }
    if (states["c"] == "unfit") break;
    ASSERT_LT(i, 499) << state->body;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto [peer, name] : {std::pair{&a, "a"}, {&b, "b"}, {&d, "d"}}) {
    auto t = peer->NextTask();
    ASSERT_TRUE(t) << name;
    rates[name] = t->model().width();
    const std::string payload = Filled(*ParameterSet::Decode(*FetchBlob(peer->stub(), peer->welcome().client_id(),
                                                                        peer->welcome().session_token(),
                                                                        t->model_digest())),
                                       0.0f)
                                    .Encode();
    v1::UploadHeader up = peer->Header(*t, 10);
    up.set_total_size(static_cast<int64_t>(payload.size()));
    ASSERT_TRUE(peer->RawUpload(up, {payload}).ok()) << name;
  }
  EXPECT_EQ(rates, (std::map<std::string, double>{{"a", 1.0}, {"b", 0.25}, {"d", 0.5}}));
  ASSERT_TRUE(a.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  EXPECT_EQ(server_->History()[0].widths, (std::map<std::string, double>{{"a", 1.0}, {"b", 0.25}, {"d", 0.5}}));
  EXPECT_FALSE(c.NextTask(0.1)) << "c is left out";
}

constexpr char kLoraRanks[] = R"(
run: {rounds: 1}
model: {name: gpt, gpt: {vocab: 256, context: 8, layers: 1, heads: 2, dim: 8}, lora: {rank: 4, alpha: 8}}
data: {test: ""}
clients: {min: 2, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120, final_evaluation: false, evaluate: false}
)";

// Device a trains rank 2 of 4 (weight 100), b rank 4 (weight 300). Returns the round's
// adapters before and after, with `deltas(sub, whole)` making a's and b's uploads.
struct LoraRound {
  ParameterSet before, after, a_part;
};

class LoraRanksTest : public RunningServerTest {
 protected:
  LoraRound Run(const std::string& method, const std::function<ParameterSet(const ParameterSet&)>& delta) {
    ServerOptions o;
    o.config = TestConfig(std::string(kLoraRanks) + "width: {method: " + method + ", clients: [{name: a, rate: 0.5}]}\n");
    StartServerWith(std::move(o));
    LoraRound r;
    r.before = server_->GlobalModel();
    TestPeer a(address_, 100), b(address_, 300);
    EXPECT_TRUE(a.Join("a"));
    EXPECT_TRUE(b.Join("b"));
    auto ta = a.NextTask(), tb = b.NextTask();
    EXPECT_TRUE(ta && tb);
    if (!ta || !tb) return r;
    EXPECT_EQ(ta->model().lora().rank(), 2);
    EXPECT_DOUBLE_EQ(ta->model().lora().alpha(), 4.0) << "the federation's scale, 8 / 4";
    EXPECT_EQ(tb->model().lora().rank(), 4);
    EXPECT_DOUBLE_EQ(ta->model().width(), 0.0) << "no width-scaled layers";
    auto part = [](TestPeer& p, const v1::Task& t) {
      auto blob = FetchBlob(p.stub(), p.welcome().client_id(), p.welcome().session_token(), t.model_digest());
      EXPECT_TRUE(blob.ok()) << blob.status();
      return blob.ok() ? *ParameterSet::Decode(*blob) : ParameterSet();
    };
    r.a_part = part(a, *ta);
    const ParameterSet b_part = part(b, *tb);
    // b's rank-4 adapters from a, a device claiming a rank it was not given: refused.
    const std::string wrong = b_part.Encode();
    v1::UploadHeader h = a.Header(*ta, 100);
    h.set_total_size(static_cast<int64_t>(wrong.size()));
    EXPECT_EQ(a.RawUpload(h, {wrong}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    for (auto [peer, task, sub, examples] : {std::tuple{&a, &*ta, static_cast<const ParameterSet*>(&r.a_part), 100}, std::tuple{&b, &*tb, &b_part, 300}}) {
      const std::string payload = delta(*sub).Encode();
      v1::UploadHeader up = peer->Header(*task, examples);
      up.set_total_size(static_cast<int64_t>(payload.size()));
      const grpc::Status s = peer->RawUpload(up, {payload});
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    EXPECT_TRUE(a.WaitRunEnded());
    runner_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_;
    r.after = server_->GlobalModel();
    return r;
  }
};

TEST_F(LoraRanksTest, HetLoraAveragesZeroPaddedAdapters) {
  const LoraRound r = Run("hetlora", [](const ParameterSet& sub) {
    return Filled(sub, sub.tensors()[0].shape[1] == 2 ? 1.0f : 3.0f);  // a's A is [8, 2]
  });
  // a's task: the leading 2 columns of A [8, 4], the leading 2 rows of B [4, 24].
  const Tensor& a_a = *r.a_part.Find("1.attn.c_attn.lora_A");
  ASSERT_EQ(a_a.shape, (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(a_a.values[3], r.before.Find("1.attn.c_attn.lora_A")->values[5]) << "row 1, column 1";
  EXPECT_EQ(r.a_part.Find("1.attn.c_attn.lora_B")->shape, (std::vector<int64_t>{2, 24}));
  const Tensor& before = *r.before.Find("1.attn.c_attn.lora_A");
  const Tensor& after = *r.after.Find("1.attn.c_attn.lora_A");
  // Column 1, both devices: start + (100 x 1 + 300 x 3) / 400. Column 3, b's alone,
  // padded with a's zero: (300 x (start + 3)) / 400.
  EXPECT_NEAR(after.values[1], before.values[1] + 2.5f, 1e-5);
  EXPECT_NEAR(after.values[3], 0.75f * (before.values[3] + 3.0f), 1e-5);
  EXPECT_EQ(r.after.Find("1.attn.c_attn.weight")->values, r.before.Find("1.attn.c_attn.weight")->values)
      << "the frozen base";
  const auto h = server_->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].widths, (std::map<std::string, double>{{"a", 0.5}, {"b", 1.0}}));
}

TEST_F(LoraRanksTest, FlexLoraFactorsTheMeanProduct) {
  // Deltas on B only (A stays the start's), so the mean product lies in A's column
  // space and rank 4 holds it exactly.
  const LoraRound r = Run("flexlora", [](const ParameterSet& sub) {
    ParameterSet d = sub.ZerosLike();
    for (Tensor& t : d.mutable_tensors()) {
      if (t.name.find("lora_B") == std::string::npos) continue;
      for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = 0.01f * static_cast<float>(i % 7) - (t.shape[0] == 2 ? 0.02f : 0.0f);
    }
    return d;
  });
  const std::vector<float>& a = r.before.Find("1.mlp.c_fc.lora_A")->values;  // [8, 4]
  const int64_t out = r.before.Find("1.mlp.c_fc.lora_B")->shape[1];           // [4, 32]
  // The devices' trained B: 0 (the start) plus the delta above; a's rows 0-1, b's 0-3.
  const auto b_of = [&](int64_t rows, int64_t k, int64_t j) {
    return 0.01f * static_cast<float>((k * out + j) % 7) - (rows == 2 ? 0.02f : 0.0f);
  };
  const std::vector<float>& na = r.after.Find("1.mlp.c_fc.lora_A")->values;
  const std::vector<float>& nb = r.after.Find("1.mlp.c_fc.lora_B")->values;
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      double pa = 0, pb = 0, got = 0;
      for (int64_t k = 0; k < 2; ++k) pa += a[i * 4 + k] * b_of(2, k, j);
      for (int64_t k = 0; k < 4; ++k) pb += a[i * 4 + k] * b_of(4, k, j);
      for (int64_t k = 0; k < 4; ++k) got += double{na[i * 4 + k]} * nb[k * out + j];
      EXPECT_NEAR(got, (100 * pa + 300 * pb) / 400, 1e-5) << i << "," << j;
    }
  }
}

}  // namespace
// A decoder's submodel gathered from the whole model (DecoderPositions at `roll`) is the
// whole model with the other heads and features switched off: with its projections back
// into the residual stream (named by `residual`) multiplied by sqrt(1/2), which its
// scaler divides out again, its logits equal the whole model's whose other heads' and
// features' columns of those projections are zero; and they are not the whole model's.
void ExpectSubmodelIsTheWholeModelWithTheRestOff(const ModelSpec& spec, int64_t head_dim, int64_t group,
                                                 int64_t roll, const std::vector<std::string>& residual) {
  auto whole = Model::Create(spec);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ModelSpec half = spec;
  half.width = 0.5;
  auto sub = Model::Create(half);
  ASSERT_TRUE(sub.ok()) << sub.status();
  const ParameterSet all = (*whole)->Parameters();
  const ParameterSet layout = (*sub)->Parameters();
  auto positions = DecoderPositions(all, layout, head_dim, group, roll);
  ASSERT_TRUE(positions.ok()) << positions.status();
  const auto is_residual = [&](const std::string& name) {
    for (const std::string& r : residual) {
      if (name.find(r) != std::string::npos) return true;
    }
    return false;
  };
  ParameterSet part = Gather(all, layout, *positions);
  for (auto& t : part.mutable_tensors()) {
    if (!is_residual(t.name)) continue;
    for (float& v : t.values) v *= std::sqrt(0.5f);
  }
  ASSERT_TRUE((*sub)->SetParameters(part).ok());
  ParameterSet off = all;
  for (size_t t = 0; t < off.size(); ++t) {
    Tensor& x = off.mutable_tensors()[t];
    if (!is_residual(x.name) || x.shape.size() != 2) continue;
    std::vector<bool> kept(x.values.size(), false);
    for (int64_t p : (*positions)[t]) kept[p] = true;
    for (size_t i = 0; i < x.values.size(); ++i) {
      if (!kept[i]) x.values[i] = 0;
    }
  }
  ASSERT_TRUE((*whole)->SetParameters(off).ok());
  const std::vector<int32_t> ids = {5, 17, 3, 60, 0, 9, 9, 41};
  auto a = (*sub)->Logits(ids);
  auto b = (*whole)->Logits(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  double worst = 0;
  for (size_t i = 0; i < a->size(); ++i) worst = std::max(worst, std::abs(double((*a)[i]) - (*b)[i]));
  EXPECT_LT(worst, 1e-4);
  ASSERT_TRUE((*whole)->SetParameters(all).ok());
  auto c = (*whole)->Logits(ids);
  double moved = 0;
  for (size_t i = 0; i < a->size(); ++i) moved = std::max(moved, std::abs(double((*a)[i]) - (*c)[i]));
  EXPECT_GT(moved, 1e-3) << "the other heads matter";
}

// GPT-2's layout: width 1/2 of 4 heads and 128 MLP features, FedRolex's window at roll 3
// (heads 3 and 0, features 3..66): c_attn keeps those heads in each of q, k and v.
TEST(DecoderWidthTest, AGptSubmodelIsTheWholeModelWithTheOtherHeadsAndFeaturesOff) {
  ModelSpec spec;
  spec.name = "gpt";
  spec.seed = 7;
  spec.gpt = {/*vocab=*/61, /*context=*/16, /*layers=*/2, /*heads=*/4, /*dim=*/32, /*tie=*/false};
  auto sub = Model::Create([&] {
    ModelSpec half = spec;
    half.width = 0.5;
    return half;
  }());
  ASSERT_TRUE(sub.ok()) << sub.status();
  EXPECT_EQ((*sub)->Parameters().Find("1.attn.c_attn.weight")->shape, (std::vector<int64_t>{32, 48}));
  EXPECT_EQ((*sub)->Parameters().Find("1.mlp.c_proj.weight")->shape, (std::vector<int64_t>{64, 32}));
  ExpectSubmodelIsTheWholeModelWithTheRestOff(spec, 8, 1, 3, {"attn.c_proj", "mlp.c_proj"});
}

// The Llama family's layout with grouped-query attention (4 query heads over 2 key/value
// heads, qwen2's q/k/v biases): width 1/2 keeps one key/value head and its two
// query heads, at roll 1 the second group.
TEST(DecoderWidthTest, AnHfSubmodelKeepsWholeGroupsOfQueryHeads) {
  ModelSpec spec;
  spec.name = "hf";
  spec.seed = 7;
  ASSERT_TRUE(SetHfModel(spec,
                         R"({"model_type": "qwen2", "vocab_size": 61, "hidden_size": 32, "intermediate_size": 48,
                             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "max_position_embeddings": 16, "tie_word_embeddings": false})",
                         "config.json")
                  .ok());
  ModelSpec half = spec;
  half.width = 0.5;
  auto sub = Model::Create(half);
  ASSERT_TRUE(sub.ok()) << sub.status();
  const ParameterSet p = (*sub)->Parameters();
  EXPECT_EQ(p.Find("1.self_attn.q_proj.weight")->shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(p.Find("1.self_attn.k_proj.weight")->shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(p.Find("1.self_attn.o_proj.weight")->shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(p.Find("1.mlp.down_proj.weight")->shape, (std::vector<int64_t>{32, 24}));
  ExpectSubmodelIsTheWholeModelWithTheRestOff(spec, 8, 2, 1, {"o_proj", "down_proj"});
}

}  // namespace cleave
