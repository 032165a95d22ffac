// The checkpoint's codec: what is written reads back exactly, and a file whose selection
// state is out of range is refused as DATA_LOSS naming what is wrong.
#include "server/checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "cleave/v1/cleave.pb.h"

namespace cleave {
namespace {

Checkpoint WithOort() {
  Checkpoint ck;
  ck.run_id = "run-1";
  ck.round = 4;
  EXPECT_TRUE(ck.global.Add({"w", {2}, {1.0f, -2.0f}}).ok());
  OortState s;
  s.epsilon = 0.5;
  s.percentile = 0.7;
  s.utility = {10.0, 7.5};
  s.records["a"] = {40.0, 1.5, 3};
  s.records["b"] = {12.0, 9.0, 4};
  s.picks = {{"a", 3}, {"b", 1}, {"c", 1}};  // c was picked, never reported
  ck.oort = s;
  return ck;
}

TEST(CheckpointTest, TheSelectionStateReadsBackExactly) {
  auto back = DecodeCheckpoint(EncodeCheckpoint(WithOort()));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->oort);
  const OortState& s = *back->oort;
  EXPECT_EQ(s.epsilon, 0.5);
  EXPECT_EQ(s.percentile, 0.7);
  EXPECT_EQ(s.utility, (std::vector<double>{10.0, 7.5}));
  ASSERT_EQ(s.records.size(), 2u);
  EXPECT_EQ(s.records.at("a").utility, 40.0);
  EXPECT_EQ(s.records.at("a").duration_s, 1.5);
  EXPECT_EQ(s.records.at("b").last_round, 4);
  EXPECT_EQ(s.picks, (std::map<std::string, int64_t>{{"a", 3}, {"b", 1}, {"c", 1}}));
  Checkpoint plain;
  plain.global = WithOort().global;
  auto none = DecodeCheckpoint(EncodeCheckpoint(plain));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->oort) << "uniform selection writes none";
}

TEST(CheckpointTest, SelectionStateOutOfRangeIsDataLoss) {
  auto tamper = [](const std::function<void(v1::OortState*)>& f) {
    v1::Checkpoint p;
    EXPECT_TRUE(p.ParseFromString(EncodeCheckpoint(WithOort())));
    f(p.mutable_oort());
    return DecodeCheckpoint(p.SerializeAsString()).status();
  };
  auto expect = [](const Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
  };
  expect(tamper([](v1::OortState* o) { o->set_epsilon(1.5); }), "epsilon or percentile");
  expect(tamper([](v1::OortState* o) { o->set_percentile(NAN); }), "epsilon or percentile");
  expect(tamper([](v1::OortState* o) { o->add_utility(INFINITY); }), "non-finite utility");
  expect(tamper([](v1::OortState* o) { o->mutable_clients(0)->set_duration_s(-1); }),
         "out of range");
  expect(tamper([](v1::OortState* o) { o->mutable_clients(0)->set_last_round(5); }),
         "out of range");  // after the checkpoint's round 4
  expect(tamper([](v1::OortState* o) { o->mutable_clients(1)->set_picks(-2); }), "out of range");
  expect(tamper([](v1::OortState* o) { *o->add_clients() = o->clients(0); }), "a client twice");
}

// The async buffer's journal: complete records read back exactly; a last record cut
// short is left out (a crash while writing it), anything else wrong is DATA_LOSS.
TEST(BufferJournalTest, TornTailsAreDroppedAndCorruptionIsRefused) {
  BufferEntry e;
  e.version = 5;
  e.task_round = 4;
  e.staleness = 1;
  e.weight = 120;
  e.scale = 0.5f;
  e.train_loss = 0.25;
  e.steps = 7;
  e.width = 0.25;
  e.edge = true;
  e.client_name = "dev-3";
  e.codec = "fp32";
  e.payload = std::string(1000, 'x');
  const std::string one = EncodeBufferRecord(e);
  e.task_round = 5;
  e.staleness = 0;
  const std::string two = one + EncodeBufferRecord(e);
  size_t complete = 0;
  auto all = DecodeBufferJournal(two, &complete);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ(complete, two.size());
  EXPECT_EQ((*all)[0].task_round, 4);
  EXPECT_EQ((*all)[0].client_name, "dev-3");
  EXPECT_EQ((*all)[0].width, 0.25);
  EXPECT_TRUE((*all)[0].edge);
  EXPECT_EQ((*all)[0].payload, e.payload);
  EXPECT_EQ((*all)[1].staleness, 0);
  for (size_t cut : {one.size() + 3, one.size() + 20, two.size() - 1}) {
    auto torn = DecodeBufferJournal(std::string_view(two).substr(0, cut), &complete);
    ASSERT_TRUE(torn.ok()) << cut;
    EXPECT_EQ(torn->size(), 1u) << cut;
    EXPECT_EQ(complete, one.size()) << cut;
  }
  std::string flipped = two;
  flipped[two.size() - 5] ^= 1;  // the last record's body: torn, not corrupt
  ASSERT_TRUE(DecodeBufferJournal(flipped, &complete).ok());
  EXPECT_EQ(complete, one.size());
  flipped = two;
  flipped[20] ^= 1;  // the first record's body, with a record after it
  EXPECT_EQ(DecodeBufferJournal(flipped, &complete).status().code(),
            absl::StatusCode::kDataLoss);
  e.staleness = 3;  // does not add up to version - task_round
  EXPECT_EQ(DecodeBufferJournal(EncodeBufferRecord(e) + one, &complete).status().code(),
            absl::StatusCode::kDataLoss);
  e.staleness = 0;
  e.width = 1.5;  // no submodel is wider than the model
  EXPECT_EQ(DecodeBufferJournal(EncodeBufferRecord(e) + one, &complete).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace cleave
