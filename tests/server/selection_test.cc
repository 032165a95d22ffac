#include "server/selection.h"

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

}  // namespace
}  // namespace cleave
