// A client's Peer service (client/gossip.h) against hostile and confused senders: only
// this round's neighbours, with their edge's secret, may deliver a model of this layout,
// once; anything else is refused with a status that says why and leaves nothing.
#include "client/gossip.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <thread>

#include "privacy/certs.h"

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
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cleave
