// A client's Peer service (client/gossip.h) against hostile and confused senders: only
// this round's neighbours, with their edge's secret, may deliver a model of this layout,
// once; anything else is refused with a status that says why and leaves nothing.
#include "client/gossip.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <thread>

#include "privacy/certs.h"
#include "tests/deadline.h"

namespace cleave {
namespace {

ParameterSet Model(float v) {
  ParameterSet p;
  EXPECT_TRUE(p.Add({"w", {3}, {v, v, v}}).ok());
  EXPECT_TRUE(p.Add({"b", {1}, {v}}).ok());
  return p;
}

class PeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto p = PeerServer::Start("127.0.0.1:0", "", "", "");
    ASSERT_TRUE(p.ok()) << p.status();
    peer_ = *std::move(p);
    address_ = "127.0.0.1:" + std::to_string(peer_->port());
  }
  Status Send(const std::string& run, int64_t round, const std::string& sender,
              const std::string& token, const std::string& bytes, double timeout_s = 10) {
    return SendModel(address_, "me", run, round, sender, token, bytes, "", "", "", timeout_s,
                     nullptr);
  }
  std::unique_ptr<PeerServer> peer_;
  std::string address_;
};

TEST_F(PeerTest, OnlyThisRoundsNeighboursDeliverOnce) {
  peer_->Expect("run-1", 3, {{"a", "secret-a"}, {"b", "secret-b"}}, Model(0));
  const std::string good = Model(1).Encode();
  struct Bad {
    std::string run;
    int64_t round;
    std::string sender, token, bytes;
    absl::StatusCode code;
  };
  ParameterSet nan = Model(1);
  nan.mutable_tensors()[0].values[1] = std::nanf("");
  ParameterSet other;
  ASSERT_TRUE(other.Add({"w", {4}, {1, 1, 1, 1}}).ok());
  const std::vector<Bad> bad = {
      {"run-2", 3, "a", "secret-a", good, absl::StatusCode::kFailedPrecondition},
      {"run-1", 2, "a", "secret-a", good, absl::StatusCode::kFailedPrecondition},
      {"run-1", 3, "c", "secret-a", good, absl::StatusCode::kPermissionDenied},
      {"run-1", 3, "a", "secret-b", good, absl::StatusCode::kPermissionDenied},
      {"run-1", 3, "a", "secret-a", good.substr(0, good.size() - 4),
       absl::StatusCode::kInvalidArgument},
      {"run-1", 3, "a", "secret-a", nan.Encode(), absl::StatusCode::kInvalidArgument},
      {"run-1", 3, "a", "secret-a", other.Encode(), absl::StatusCode::kInvalidArgument},
  };
  for (const Bad& b : bad) {
    const Status s = Send(b.run, b.round, b.sender, b.token, b.bytes);
    EXPECT_EQ(s.code(), b.code) << b.run << " " << b.round << " " << b.sender << ": " << s;
  }
  ASSERT_TRUE(Send("run-1", 3, "a", "secret-a", good).ok());
  EXPECT_EQ(Send("run-1", 3, "a", "secret-a", good).code(), absl::StatusCode::kAlreadyExists);
  // b never sends: Collect returns a's at the deadline.
  auto got = peer_->Collect(3, std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got.at("a").tensors()[0].values, Model(1).tensors()[0].values);
  EXPECT_EQ(peer_->bytes_received(), static_cast<int64_t>(good.size()));
  // The round is over: b's late model is refused.
  EXPECT_EQ(Send("run-1", 3, "b", "secret-b", good).code(), absl::StatusCode::kPermissionDenied);
}

// A neighbour whose task came first sends before this client expects the round: its
// call waits for the round and is then taken; Collect returns as soon as all are in.
TEST_F(PeerTest, ASenderAheadWaitsForTheRound) {
  peer_->Expect("run-1", 1, {}, Model(0));
  Status early;
  std::thread sender([&] { early = Send("run-1", 2, "a", "t", Model(2).Encode()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  peer_->Expect("run-1", 2, {{"a", "t"}}, Model(0));
  auto got = peer_->Collect(2, std::chrono::steady_clock::now() + std::chrono::seconds(30));
  sender.join();
  EXPECT_TRUE(early.ok()) << early;
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got.at("a").tensors()[1].values[0], 2.0f);
}

// A neighbour that crashed: sending to it fails as UNAVAILABLE (its port is closed), and
// Collect, told to give up on it, returns at once with the models that came rather than
// at the round's deadline. Giving up on a sender whose model is in keeps its model.
TEST_F(PeerTest, ACrashedNeighbourIsNotWaitedFor) {
  std::string gone_address;
  {
    auto gone = PeerServer::Start("127.0.0.1:0", "", "", "");
    ASSERT_TRUE(gone.ok());
    gone_address = "127.0.0.1:" + std::to_string((*gone)->port());
  }
  const Status to_gone = SendModel(gone_address, "b", "run-1", 4, "me", "t-b", Model(1).Encode(),
                                   "", "", "", 10, nullptr);
  EXPECT_EQ(to_gone.code(), absl::StatusCode::kUnavailable) << to_gone;

  peer_->Expect("run-1", 4, {{"a", "t-a"}, {"b", "t-b"}}, Model(0));
  ASSERT_TRUE(Send("run-1", 4, "a", "t-a", Model(3).Encode()).ok());
  peer_->GiveUp(4, "a");  // already in: kept
  peer_->GiveUp(3, "b");  // another round: nothing
  std::map<std::string, ParameterSet> got;
  std::thread collector([&] {
    got = peer_->Collect(4, std::chrono::steady_clock::now() + std::chrono::minutes(10));
  });
  peer_->GiveUp(4, "b");
  collector.join();  // without GiveUp this waits the ten minutes
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got.at("a").tensors()[1].values[0], 3.0f);
  EXPECT_EQ(Send("run-1", 4, "b", "t-b", Model(1).Encode()).code(), absl::StatusCode::kPermissionDenied);
}

// A neighbour that took this client's model and then crashed: its port is closed, so
// watching it (PeerReachable each period) gives it up after three failures in a row, and
// Collect returns with the models that came instead of at the deadline. A live
// neighbour is probed for as long as its model is awaited, never given up, and its
// model is then taken; a watch ends as soon as nothing is awaited.
TEST_F(PeerTest, ANeighbourThatCrashesAfterTakingOurModelIsNotWaitedFor) {
  std::string gone_address;
  {
    auto gone = PeerServer::Start("127.0.0.1:0", "", "", "");
    ASSERT_TRUE(gone.ok());
    gone_address = "127.0.0.1:" + std::to_string((*gone)->port());
    (*gone)->Expect("run-1", 5, {{"me", "t-me"}}, Model(0));
    ASSERT_TRUE(SendModel(gone_address, "b", "run-1", 5, "me", "t-me", Model(1).Encode(), "", "", "",
                          10, nullptr).ok());
    EXPECT_TRUE(PeerReachable(gone_address, "b", "", "", "", 5));
  }  // b crashes before sending its own
  EXPECT_FALSE(PeerReachable(gone_address, "b", "", "", "", 5));

  peer_->Expect("run-1", 5, {{"a", "t-a"}, {"b", "t-b"}, {"c", "t-c"}}, Model(0));
  ASSERT_TRUE(Send("run-1", 5, "a", "t-a", Model(3).Encode()).ok());
  std::map<std::string, ParameterSet> got;
  std::thread collector([&] {
    got = peer_->Collect(5, std::chrono::steady_clock::now() + std::chrono::minutes(10));
  });
  int gone_probes = 0;
  std::atomic<int> live_probes{0};
  // a's model is in: nothing to watch.
  peer_->Watch(5, "a", [] { return false; }, std::chrono::milliseconds(1));
  std::thread live([&] {
    peer_->Watch(5, "c", [&] {
      ++live_probes;
      return PeerReachable(address_, "c", "", "", "", 5);
    }, std::chrono::milliseconds(20));
  });
  peer_->Watch(5, "b", [&] {
    ++gone_probes;
    return PeerReachable(gone_address, "b", "", "", "", 5);
  }, std::chrono::milliseconds(20));
  EXPECT_EQ(gone_probes, 3);
  while (live_probes < 5) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(Send("run-1", 5, "c", "t-c", Model(4).Encode()).ok());  // not given up
  live.join();
  collector.join();  // without the watch on b this waits the ten minutes
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got.at("a").tensors()[1].values[0], 3.0f);
  EXPECT_EQ(got.at("c").tensors()[1].values[0], 4.0f);
}

// The probe over mutual TLS connects as a send does: to the neighbour's certificate
// under its peer name, presenting this client's. A certificate that does not name the
// neighbour probed fails the handshake and counts as unreachable.
// A Gossip call held open on the Peer port: its header sent, waiting for the device's
// answer (raw gRPC, so that the test can cancel it).
struct OpenCall {
  OpenCall(v1::Peer::Stub* stub, const std::string& run, int64_t round, const std::string& sender,
           std::chrono::milliseconds deadline) {
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    writer = stub->Gossip(&ctx, &reply);
    v1::GossipChunk chunk;
    auto* h = chunk.mutable_header();
    h->set_run_id(run);
    h->set_round(round);
    h->set_sender(sender);
    h->set_token("t");
    h->set_total_size(4);
    writer->Write(chunk);
  }
  grpc::StatusCode Finish() {
    writer->WritesDone();
    return writer->Finish().error_code();
  }
  grpc::ClientContext ctx;
  v1::GossipReply reply;
  std::unique_ptr<grpc::ClientWriter<v1::GossipChunk>> writer;
};

class PeerPortTest : public PeerTest {
 protected:
  void SetUp() override {
    PeerTest::SetUp();
    stub_ = v1::Peer::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  // Until `n` callers wait on the device (their calls reached it), within a limit.
  void WaitForWaiting(int n) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(testing::ScaledSeconds(30));
    while (peer_->waiting_callers() != n && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(peer_->waiting_callers(), n);
  }
  std::unique_ptr<v1::Peer::Stub> stub_;
};

// A caller whose round is far past this device's (10^15 took a thread for up to ten
// minutes), or of another run, is refused at once.
TEST_F(PeerPortTest, ARoundFarAheadIsRefusedAtOnce) {
  peer_->Expect("run-1", 3, {{"a", "secret-a"}}, Model(0));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Send("run-1", 1000000000000000, "a", "secret-a", Model(1).Encode(), 60).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Send("run-2", 4, "a", "secret-a", Model(1).Encode(), 60).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(testing::ScaledSeconds(20)));
}

// At most 16 callers wait for their round, at most 2 in one sender's name; a caller that
// cancels frees its place (its wait did not end before).
TEST_F(PeerPortTest, WaitingCallersAreBoundedAndFreedWhenTheyCancel) {
  std::vector<std::unique_ptr<OpenCall>> held;
  for (int i = 0; i < 16; ++i) {
    held.push_back(std::make_unique<OpenCall>(stub_.get(), "run-1", 9, "s" + std::to_string(i),
                                              std::chrono::minutes(5)));
  }
  WaitForWaiting(16);
  EXPECT_EQ(OpenCall(stub_.get(), "run-1", 9, "probe", std::chrono::minutes(5)).Finish(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  for (auto& call : held) call->ctx.TryCancel();
  for (auto& call : held) EXPECT_EQ(call->Finish(), grpc::StatusCode::CANCELLED);
  // The places are free again: a caller waits (until its short deadline) instead of
  // being refused for want of one.
  WaitForWaiting(0);
  EXPECT_NE(OpenCall(stub_.get(), "run-1", 9, "probe", std::chrono::milliseconds(300)).Finish(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  OpenCall one(stub_.get(), "run-1", 9, "same", std::chrono::minutes(5)),
      two(stub_.get(), "run-1", 9, "same", std::chrono::minutes(5));
  WaitForWaiting(2);
  EXPECT_EQ(OpenCall(stub_.get(), "run-1", 9, "same", std::chrono::minutes(5)).Finish(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  one.ctx.TryCancel();
  two.ctx.TryCancel();
  one.Finish();
  two.Finish();
}

// A device that stops while callers wait for a round ends their calls and exits (it did
// not, until their deadline).
TEST_F(PeerPortTest, StoppingEndsWaitingCalls) {
  OpenCall waiting(stub_.get(), "run-1", 9, "a", std::chrono::minutes(5));
  WaitForWaiting(1);
  const auto start = std::chrono::steady_clock::now();
  peer_.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(testing::ScaledSeconds(20)));
  const grpc::StatusCode code = waiting.Finish();
  EXPECT_TRUE(code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::CANCELLED) << code;
}

TEST(PeerReachableTest, ProbesOverMutualTlsAsASendConnects) {
  const std::string dir = ::testing::TempDir() + "/peer-reachable-fed";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(InitFederation(dir).ok());
  ASSERT_TRUE(IssueClientCert(dir, "b").ok());
  ASSERT_TRUE(IssueClientCert(dir, "me").ok());
  const std::string ca = dir + "/ca.crt";
  auto b = PeerServer::Start("127.0.0.1:0", ca, dir + "/clients/b.crt", dir + "/clients/b.key");
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string address = "127.0.0.1:" + std::to_string((*b)->port());
  const std::string cert = dir + "/clients/me.crt", key = dir + "/clients/me.key";
  EXPECT_TRUE(PeerReachable(address, "b", ca, cert, key, 10));
  EXPECT_FALSE(PeerReachable(address, "me", ca, cert, key, 10));  // b's certificate is not me's
  // A caller whose certificate is not the sender it claims is refused before it may wait
  // for a round (b expects none yet: it used to wait out the call's deadline first).
  const auto start = std::chrono::steady_clock::now();
  const Status s = SendModel(address, "b", "run-1", 5, "a", "t", Model(1).Encode(), ca, cert, key, 60, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(testing::ScaledSeconds(20)));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cleave
