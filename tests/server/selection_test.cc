#include "server/rounds/selection.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"

namespace cleave {
namespace {

std::vector<std::string> Names(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(absl::StrCat("c", i));
  return out;
}

TEST(OortSelectorTest, ExploresFirstThenPrefersUsefulFastClients) {
  OortSelector oort(/*min_epsilon=*/0.0, /*alpha=*/2);
  std::mt19937_64 rng(1);
  const auto all = Names(10);
  // Nothing known: k distinct clients, all exploration.
  auto first = oort.Select(all, 4, 1, rng);
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(std::set<std::string>(first.begin(), first.end()).size(), 4u);
  // Every client tried once: c0..c6 fast (1 s), c7..c9 ten times slower; c0..c2 have
  // the highest loss.
  for (int i = 0; i < 10; ++i) {
    oort.Observe(all[i], 1, i < 3 ? 100.0 : 10.0, i < 7 ? 1.0 : 10.0);
  }
  std::map<std::string, int> picked;
  for (int round = 2; round < 200; ++round) {
    for (const auto& name : oort.Select(all, 3, round, rng)) ++picked[name];
  }
  EXPECT_NEAR(oort.epsilon(), 0.0, 0.02);
  for (int i = 0; i < 3; ++i) EXPECT_GT(picked[all[i]], 150) << all[i];
  for (int i = 7; i < 10; ++i) EXPECT_EQ(picked[all[i]], 0) << all[i] << " is slow";
}

TEST(OortSelectorTest, NewClientsGetTheExplorationShareAndMissesCountAsSlow) {
  OortSelector oort(/*min_epsilon=*/0.5, /*alpha=*/2);
  std::mt19937_64 rng(2);
  auto all = Names(20);
  for (int i = 0; i < 10; ++i) oort.Observe(all[i], 1, 10, 1);
  const std::set<std::string> tried(all.begin(), all.begin() + 10);
  int fresh = 0;
  for (const auto& name : oort.Select(all, 10, 2, rng)) fresh += !tried.count(name);
  // epsilon 0.9 of 10: nine of the ten never tried (c10..c19).
  EXPECT_EQ(fresh, 9);
  oort.MissedDeadline(all[0], 2, 300);
  EXPECT_EQ(oort.records().at(all[0]).duration_s, 300);
  EXPECT_EQ(oort.records().at(all[0]).last_round, 2);
  // The same seed, the same picks.
  OortSelector a(0.2, 2), b(0.2, 2);
  std::mt19937_64 ra(5), rb(5);
  EXPECT_EQ(a.Select(all, 5, 1, ra), b.Select(all, 5, 1, rb));
}

// The pacer: when the last W rounds' reported utility falls below the W before, the
// preferred duration moves up a tenth of the known durations, and the slow clients it
// penalised come back.
TEST(OortSelectorTest, ThePacerRelaxesThePreferredDurationWhenUtilityFalls) {
  OortSelector oort(/*min_epsilon=*/0.0, /*alpha=*/2, /*pacer_rounds=*/2);
  std::mt19937_64 rng(3);
  const auto all = Names(10);  // c0..c5 take 1 s, c6..c9 10 s
  auto observe = [&](int64_t round, double utility) {
    for (int i = 0; i < 10; ++i) oort.Observe(all[i], round, utility, i < 6 ? 1.0 : 10.0);
    oort.EndRound();
  };
  auto slow_picks = [&](int64_t round) {
    int slow = 0;
    for (int r = 0; r < 50; ++r) {
      for (const auto& name : oort.Select(all, 3, round, rng)) slow += name >= all[6];
    }
    return slow;
  };
  for (int64_t round = 1; round <= 4; ++round) observe(round, 10.0 * round);  // rising
  EXPECT_DOUBLE_EQ(oort.percentile(), 0.5);
  // T is the median duration, 1 s: the slow clients' utility is cut 100-fold.
  EXPECT_EQ(slow_picks(5), 0);
  observe(5, 4);  // rounds 5-6 report less than rounds 3-4
  observe(6, 2);
  EXPECT_DOUBLE_EQ(oort.percentile(), 0.6);
  observe(7, 1);  // and rounds 7-8 less than 5-6
  observe(8, 0.5);
  EXPECT_DOUBLE_EQ(oort.percentile(), 0.7);
  // T is now 10 s: nobody is penalised and the slow clients are picked again.
  EXPECT_GT(slow_picks(9), 30);
  double u = 0.5;
  for (int64_t round = 9; round <= 18; ++round) observe(round, u /= 2);
  EXPECT_DOUBLE_EQ(oort.percentile(), 1.0) << "capped at the slowest known duration";
}

// clients.oort_max_picks: a client picked that often rests while others fill the round.
TEST(OortSelectorTest, OverPickedClientsRestWhileOthersFillTheRound) {
  OortSelector oort(/*min_epsilon=*/0.0, /*alpha=*/2, /*pacer_rounds=*/0, /*max_picks=*/3);
  std::mt19937_64 rng(4);
  const auto all = Names(6);
  for (int i = 0; i < 6; ++i) oort.Observe(all[i], 1, i < 2 ? 1000.0 : 1.0, 1.0);
  // c0 and c1 would take every round on utility; they rest after 3 picks each.
  for (int64_t round = 2; round <= 4; ++round) {
    EXPECT_EQ(oort.Select(all, 2, round, rng), (std::vector<std::string>{all[0], all[1]}));
  }
  for (int64_t round = 5; round <= 6; ++round) {
    for (const auto& name : oort.Select(all, 2, round, rng)) {
      EXPECT_NE(name, all[0]);
      EXPECT_NE(name, all[1]);
    }
  }
  EXPECT_EQ(oort.Checkpoint()->picks.at(all[0]), 3);
  // With too few others the over-picked fill the round.
  EXPECT_EQ(oort.Select({all[0], all[1], all[2]}, 2, 7, rng).size(), 2u);
}

// A selector restored from another's state picks as the other would.
TEST(OortSelectorTest, ARestoredSelectorPicksAsTheOriginal) {
  OortSelector a(0.1, 2, 2, 4), b(0.1, 2, 2, 4);
  std::mt19937_64 rng(9);
  const auto all = Names(8);
  for (int round = 1; round <= 6; ++round) {
    for (const auto& name : a.Select(all, 3, round, rng)) {
      a.Observe(name, round, 10.0 / round, name < all[4] ? 1.0 : 5.0);
    }
    a.EndRound();
  }
  b.Resume(*a.Checkpoint());
  std::mt19937_64 ra = rng, rb = rng;
  for (int round = 7; round <= 12; ++round) {
    EXPECT_EQ(a.Select(all, 3, round, ra), b.Select(all, 3, round, rb)) << round;
  }
}

}  // namespace
}  // namespace cleave
