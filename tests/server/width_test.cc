// Width-scaled submodels through a real server (job section width): each device's task
// carries its rate and the submodel's values, its upload is the submodel's delta, and the
// round's model is the per-element mean over the devices that hold each element; an
// upload in another shape is refused and changes nothing.
#include <gtest/gtest.h>

#include "client/transfer.h"
#include "server/server.h"
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

TEST_F(WidthTest, EachElementIsTheMeanOfTheDevicesThatHoldIt) {
  ServerOptions o;
  o.config = TestConfig(R"(
run: {rounds: 1}
model: {name: mlp, input: [4], classes: 3}
data: {test: ""}
clients: {min: 2, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120, final_evaluation: false, evaluate: false}
width: {clients: [{name: a, rate: 0.5}]}
)");
  StartServerWith(std::move(o));
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

}  // namespace
}  // namespace cleave
