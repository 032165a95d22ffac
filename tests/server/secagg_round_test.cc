// The server's SecAgg+ stages driven by simulated clients doing the real cryptography:
// exact sums with dropouts at every stage, aborts below the threshold, and refused
// submissions that change nothing.
#include "server/modes/secagg_round.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace cleave {
namespace {

using secagg::SharesFor;

struct SimClient {
  std::string name;
  secagg::ClientKeys keys;
  int index = -1;
  std::map<int, crypto::Bytes> mask_pks, enc_pks;
  std::map<int, SharesFor> held;
  std::vector<uint64_t> q;  // quantized input
  secagg::Slices slices;    // per-slice masking: its own and its neighbours' positions
};

class SecAggRoundTest : public ::testing::Test {
 protected:
  static constexpr int64_t kLength = 50;

  // `rates`: per-slice masking, client i holding the first kLength * rates[i] positions
  // of one shuffled order, listed in an order of its own.
  void Init(int n, int k = 4, int t = 3, std::vector<double> rates = {}) {
    config_.k = k;
    config_.t = t;
    config_.modulus = (uint64_t{1} << 32) - 5;
    params_.k = config_.k;
    params_.t = config_.t;
    params_.clip = config_.clip;
    params_.bits = config_.bits;
    params_.modulus = config_.modulus;
    params_.context = "run-x|round 2";
    std::vector<std::string> names;
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal(0, 0.2f);
    clients_.assign(n, SimClient{});  // nothing of an earlier round
    unmask_.clear();
    for (int i = 0; i < n; ++i) {
      clients_[i].name = absl::StrCat("c", i);
      clients_[i].keys = *secagg::NewClientKeys();
      names.push_back(clients_[i].name);
    }
    round_ = std::make_unique<SecAggRound>(config_, params_.context, names, kLength, 100, 9);
    slices_.clear();
    if (!rates.empty()) {
      secagg::Positions order(kLength);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::map<std::string, std::shared_ptr<const SecAggSlice>> by_name;
      for (int i = 0; i < n; ++i) {
        auto slice = std::make_shared<SecAggSlice>();
        secagg::Positions mine(order.begin(), order.begin() + static_cast<int64_t>(kLength * rates[i]));
        std::shuffle(mine.begin(), mine.end(), rng);
        v1::SubmodelPlacement& p = slice->placement.emplace_back();  // one tensor of kLength
        p.add_shape(kLength);
        v1::IndexList* kept = p.add_dims();
        for (int64_t at : mine) kept->add_index(at);
        slice->positions = std::make_shared<const secagg::Positions>(std::move(mine));
        slices_.push_back(slice->positions);
        by_name[names[i]] = std::move(slice);
      }
      ASSERT_TRUE(round_->SetSlices(by_name).ok());
    }
    for (int i = 0; i < n; ++i) {
      std::vector<float> x(slices_.empty() ? kLength : slices_[i]->size());
      for (auto& v : x) v = normal(rng);
      clients_[i].q = secagg::Quantize(x, params_, rng);
    }
  }

  v1::SecAggKeys Keys(const SimClient& c) {
    v1::SecAggKeys k;
    k.set_mask_public_key(c.keys.mask_key.public_key);
    k.set_enc_public_key(c.keys.enc_key.public_key);
    return k;
  }

  // Handles the server's message for each client in the stage just closed.
  void Deliver(const std::map<std::string, v1::ServerMessage>& msgs) {
    for (auto& c : clients_) {
      auto it = msgs.find(c.name);
      if (it == msgs.end()) continue;
      const auto& m = it->second;
      if (m.has_secagg_neighbours()) {
        c.index = m.secagg_neighbours().index();
        for (const auto& p : m.secagg_neighbours().peers()) {
          c.mask_pks[p.index()] = p.mask_public_key();
          c.enc_pks[p.index()] = p.enc_public_key();
          if (!slices_.empty()) {  // one tensor: its kept list is the peer's positions
            ASSERT_EQ(p.placement_size(), 1);
            const auto& kept = p.placement(0).dims(0).index();
            c.slices[p.index()] = std::make_shared<const secagg::Positions>(kept.begin(), kept.end());
          }
        }
        if (!slices_.empty()) c.slices[c.index] = slices_[&c - clients_.data()];
      } else if (m.has_secagg_relay()) {
        for (const auto& s : m.secagg_relay().shares()) {
          auto opened = secagg::OpenShares(s.from(), c.index, s.sealed(),
                                           c.keys.enc_key.private_key, c.enc_pks[s.from()], params_);
          ASSERT_TRUE(opened.ok()) << opened.status();
          c.held[s.from()] = *opened;
        }
      } else if (m.has_secagg_unmask()) {
        unmask_[c.name] = m.secagg_unmask();
      }
    }
  }

  v1::SecAggShares Shares(const SimClient& c) {
    std::set<int> neighbours;
    for (const auto& [v, pk] : c.enc_pks) neighbours.insert(v);
    auto shares = *secagg::ShareSecrets(c.index, c.keys, neighbours, params_);
    v1::SecAggShares out;
    for (int v : neighbours) {
      auto* s = out.add_shares();
      s->set_from(c.index);
      s->set_to(v);
      s->set_sealed(*secagg::SealShares(c.index, v, shares[v], c.keys.enc_key.private_key,
                                        c.enc_pks.at(v), params_));
    }
    return out;
  }

  std::string Masked(const SimClient& c) {
    std::set<int> with;
    for (const auto& [v, s] : c.held) with.insert(v);
    auto y = *secagg::Mask(c.index, c.q, c.keys, with, c.mask_pks, params_, c.slices.empty() ? nullptr : &c.slices);
    std::string out;
    for (uint64_t v : y) {
      for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>(v >> (8 * b)));
    }
    return out;
  }

  v1::SecAggReveal Reveal(SimClient& c) {
    v1::SecAggReveal r;
    const auto& req = unmask_.at(c.name);
    auto put = [](int owner, const crypto::Share& s, v1::SecAggShare* out) {
      out->set_owner(owner);
      out->set_x(s.x);
      for (uint64_t y : s.y) out->add_y(y);
    };
    for (int v : req.survivors()) put(v, c.held[v].self_seed, r.add_self_seed());
    for (int v : req.dropped()) put(v, c.held[v].mask_key, r.add_mask_key());
    return r;
  }

  void Close() {
    auto msgs = round_->CloseStage();
    ASSERT_TRUE(msgs.ok()) << msgs.status();
    Deliver(*msgs);
  }

  // Runs all four stages; clients in drop[s] stop answering at stage s (0 keys, 1
  // shares, 2 masked input, 3 unmasking). Returns the dequantized sum.
  StatusOr<std::vector<double>> RunAll(std::array<std::set<int>, 4> drop) {
    std::set<int> gone;
    auto stage = [&](int s, const std::function<Status(SimClient&)>& answer) -> Status {
      gone.insert(drop[s].begin(), drop[s].end());
      for (int i = 0; i < static_cast<int>(clients_.size()); ++i) {
        if (!gone.count(i)) RETURN_IF_ERROR(answer(clients_[i]));
      }
      auto msgs = round_->CloseStage();
      if (!msgs.ok()) return msgs.status();
      Deliver(*msgs);
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(stage(0, [&](SimClient& c) { return round_->AddKeys(c.name, Keys(c)); }));
    RETURN_IF_ERROR(stage(1, [&](SimClient& c) { return round_->AddShares(c.name, Shares(c)); }));
    RETURN_IF_ERROR(stage(2, [&](SimClient& c) { return round_->AddMasked(c.name, Masked(c)); }));
    RETURN_IF_ERROR(stage(3, [&](SimClient& c) { return round_->AddReveal(c.name, Reveal(c)); }));
    EXPECT_EQ(round_->stage(), SecAggRound::Stage::kDone);
    ASSIGN_OR_RETURN(auto result, round_->Finish());
    return result.sum;
  }

  // The dequantized plain sum of the clients not in `absent`.
  std::vector<double> PlainSum(const std::set<int>& absent) {
    std::vector<uint64_t> sum(kLength, 0);
    std::vector<int> count(kLength, 0);
    for (int i = 0; i < static_cast<int>(clients_.size()); ++i) {
      if (absent.count(i)) continue;
      if (slices_.empty()) {
        secagg::AddMod(sum, clients_[i].q, params_.modulus);
        for (int& c : count) ++c;
      } else {
        secagg::AddMod(sum, clients_[i].q, *slices_[i], params_.modulus);
        for (int64_t at : *slices_[i]) ++count[at];
      }
    }
    return secagg::DequantizeSum(sum, count, params_);
  }

  SecureAggregationConfig config_;
  secagg::Params params_;
  std::vector<SimClient> clients_;
  std::unique_ptr<SecAggRound> round_;
  std::map<std::string, v1::SecAggUnmask> unmask_;
  std::vector<std::shared_ptr<const secagg::Positions>> slices_;  // by client, per-slice masking
};

TEST_F(SecAggRoundTest, TheSumIsExactWithoutDropouts) {
  Init(8);
  auto sum = RunAll({});
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, PlainSum({}));
}

// A client lost at each stage: the result is exactly the sum of those whose masked
// input arrived (the one lost while unmasking had sent its input: it counts). With k = 6
// and t = 3 every client tolerates 3 lost neighbours.
TEST_F(SecAggRoundTest, TheSumIsExactWithDropoutsAtEveryStage) {
  Init(10, 6, 3);
  auto sum = RunAll({std::set<int>{1}, {4}, {7}, {9}});
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, PlainSum({1, 4, 7}));
}

// Per-slice masking: nine clients of three nested widths. Each uploads its slice alone;
// the graph joins each to at least k/2 clients that hold its whole slice (so pair masks
// cover all its values); the sum, per position over its survivors, is exact with
// dropouts at every stage.
TEST_F(SecAggRoundTest, SlicesOfThreeWidthsSumExactlyPerPosition) {
  const std::vector<double> rates = {1, 0.5, 0.25, 1, 0.5, 0.25, 1, 0.5, 0.25};
  Init(9, 4, 2, rates);
  EXPECT_EQ(round_->PayloadSize("c0"), 4 * kLength);
  EXPECT_EQ(round_->PayloadSize("c2"), 4 * 12);  // 12 of the 50 positions, 4 bytes each
  for (auto& c : clients_) ASSERT_TRUE(round_->AddKeys(c.name, Keys(c)).ok());
  Close();
  for (size_t i = 0; i < clients_.size(); ++i) {
    int holding = 0;
    for (const auto& [v, theirs] : clients_[i].slices) {
      if (v != clients_[i].index && rates[v] >= rates[i]) ++holding;
    }
    EXPECT_GE(holding, 2) << clients_[i].name;
    std::vector<const secagg::Positions*> others;
    for (const auto& [v, theirs] : clients_[i].slices) {
      if (v != clients_[i].index) others.push_back(theirs.get());
    }
    EXPECT_EQ(secagg::Uncovered(*slices_[i], others), 0) << clients_[i].name;
  }
  // A whole-length input from a client of a quarter slice is refused.
  for (auto& c : clients_) ASSERT_TRUE(round_->AddShares(c.name, Shares(c)).ok());
  Close();
  EXPECT_EQ(round_->AddMasked("c2", std::string(4 * kLength, '\0')).code(), absl::StatusCode::kInvalidArgument);
  for (auto& c : clients_) ASSERT_TRUE(round_->AddMasked(c.name, Masked(c)).ok());
  Close();
  for (auto& c : clients_) ASSERT_TRUE(round_->AddReveal(c.name, Reveal(c)).ok());
  Close();
  auto result = round_->Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->sum, PlainSum({}));

  Init(9, 4, 2, rates);
  auto sum = RunAll({std::set<int>{}, {5}, {7}, {}});
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, PlainSum({5, 7}));
}

TEST_F(SecAggRoundTest, TooFewSurvivorsAbortTheRound) {
  Init(6);
  auto sum = RunAll({std::set<int>{}, {}, {0, 1, 2, 3}, {}});
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kAborted) << sum.status();
  EXPECT_EQ(round_->stage(), SecAggRound::Stage::kDone);
  EXPECT_FALSE(round_->Finish().ok()) << "nothing of an aborted round is usable";
  Init(4);
  EXPECT_EQ(RunAll({std::set<int>{0}, {}, {}, {}}).status().code(), absl::StatusCode::kAborted)
      << "3 clients with t = 3: too few to share";
}

// Every refused submission leaves the round as it was: the protocol then completes
// with the exact sum.
TEST_F(SecAggRoundTest, RefusedSubmissionsChangeNothing) {
  Init(6);
  auto& c0 = clients_[0];
  EXPECT_EQ(round_->AddKeys("stranger", Keys(c0)).code(), absl::StatusCode::kFailedPrecondition);
  v1::SecAggKeys short_key = Keys(c0);
  short_key.set_mask_public_key("abc");
  EXPECT_EQ(round_->AddKeys(c0.name, short_key).code(), absl::StatusCode::kInvalidArgument);
  for (auto& c : clients_) ASSERT_TRUE(round_->AddKeys(c.name, Keys(c)).ok());
  EXPECT_EQ(round_->AddKeys(c0.name, Keys(c0)).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(round_->AddMasked(c0.name, std::string(4 * kLength, '\0')).code(),
            absl::StatusCode::kFailedPrecondition)
      << "out of stage";
  Close();

  // Shares: claiming another sender, a non-neighbour, a wrong size, a missing neighbour.
  v1::SecAggShares good = Shares(c0);
  auto bad = good;
  bad.mutable_shares(0)->set_from(1);
  EXPECT_EQ(round_->AddShares(c0.name, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.mutable_shares(0)->set_to(c0.index);
  EXPECT_EQ(round_->AddShares(c0.name, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.mutable_shares(0)->mutable_sealed()->push_back('x');
  EXPECT_EQ(round_->AddShares(c0.name, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = good;
  bad.mutable_shares()->RemoveLast();
  EXPECT_EQ(round_->AddShares(c0.name, bad).code(), absl::StatusCode::kInvalidArgument);
  for (auto& c : clients_) ASSERT_TRUE(round_->AddShares(c.name, Shares(c)).ok());
  EXPECT_EQ(round_->AddShares(c0.name, good).code(), absl::StatusCode::kAlreadyExists);
  Close();

  // Masked input: wrong size, a value outside Z_M.
  EXPECT_EQ(round_->AddMasked(c0.name, std::string(10, '\0')).code(),
            absl::StatusCode::kInvalidArgument);
  std::string outside = Masked(c0);
  for (int b = 0; b < 4; ++b) outside[b] = '\xff';
  EXPECT_EQ(round_->AddMasked(c0.name, outside).code(), absl::StatusCode::kInvalidArgument);
  const int lost = 5;  // drops after sharing: its mask-key shares will be asked for
  for (int i = 0; i < 6; ++i) {
    if (i != lost) {
      ASSERT_TRUE(round_->AddMasked(clients_[i].name, Masked(clients_[i])).ok());
    }
  }
  EXPECT_EQ(round_->AddMasked(c0.name, Masked(c0)).code(), absl::StatusCode::kAlreadyExists);
  round_->Drop(clients_[lost].name);
  Close();

  // Reveal: both secrets of one client, or shares not asked for, are refused.
  SimClient* holder = nullptr;  // a survivor that masked with the lost client
  for (auto& c : clients_) {
    if (unmask_.count(c.name) && unmask_[c.name].dropped_size() > 0) holder = &c;
  }
  ASSERT_NE(holder, nullptr);
  v1::SecAggReveal reveal = Reveal(*holder);
  auto both = reveal;
  auto* extra = both.add_self_seed();
  *extra = both.mask_key(0);  // the lost client's self seed as well as its mask key
  extra->set_x(extra->x());
  EXPECT_EQ(round_->AddReveal(holder->name, both).code(), absl::StatusCode::kInvalidArgument);
  auto missing = reveal;
  missing.mutable_mask_key()->Clear();
  EXPECT_EQ(round_->AddReveal(holder->name, missing).code(), absl::StatusCode::kInvalidArgument);
  for (auto& c : clients_) {
    if (unmask_.count(c.name)) {
      ASSERT_TRUE(round_->AddReveal(c.name, Reveal(c)).ok());
    }
  }
  EXPECT_EQ(round_->AddReveal(holder->name, reveal).code(), absl::StatusCode::kAlreadyExists);
  Close();
  auto result = round_->Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->sum, PlainSum({lost}));
  EXPECT_EQ(result->survivors.size(), 5u);
}

}  // namespace
}  // namespace cleave
