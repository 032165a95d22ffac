#include "data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <set>

namespace cleave {
namespace {

const char* kFmnist = "/usr/share/datasets/fashion-mnist";

TEST(FashionMnistTest, LoadsTrainAndTest) {
  auto train = LoadFashionMnist(kFmnist, true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->size, 60000);
  EXPECT_EQ(train->bytes.size(), 60000u * 784);
  EXPECT_EQ(train->shape, (std::vector<int64_t>{1, 28, 28}));
  auto test = LoadFashionMnist(kFmnist, false, 500);
  ASSERT_TRUE(test.ok());
  EXPECT_EQ(test->size, 500);
  std::vector<int64_t> counts(10);
  for (int64_t l : train->labels) counts[l]++;
  for (int64_t c : counts) EXPECT_EQ(c, 6000);  // Fashion-MNIST is balanced
}

TEST(FashionMnistTest, DataSpecErrors) {
  EXPECT_EQ(LoadDataSpec("mnist:/x", true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadDataSpec("idx:", true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadDataSpec(std::string("fmnist:") + kFmnist + ",limt=5", true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadDataSpec("fmnist:/nonexistent", true).status().code(),
            absl::StatusCode::kNotFound);
  auto d = LoadDataSpec(std::string("fmnist:") + kFmnist + ",limit=100", true);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->size, 100);
}

// A client's part read on its own (only the kept examples' bytes) equals the part taken
// from the whole data set, for each scheme, with a limit, and for a filter that keeps an
// example twice; a file that ends early is an error naming it.
TEST(FashionMnistTest, APartReadAloneEqualsThePartTaken) {
  const std::string spec = std::string("fmnist:") + kFmnist;
  for (const char* partition : {"iid,client=3,of=10", "dirichlet:0.3,client=1,of=4,seed=7",
                                       "shards:2,client=9,of=10", "labels:2,client=0,of=5"}) {
    for (const char* options : {"", ",limit=7000"}) {
      auto whole = LoadDataSpec(spec + options, true);
      ASSERT_TRUE(whole.ok());
      ASSERT_TRUE(TakePartition(partition, &*whole).ok());
      auto filter = PartitionFilter(partition);
      ASSERT_TRUE(filter.ok());
      auto part = LoadDataSpecPart(spec + options, true, *filter);
      ASSERT_TRUE(part.ok()) << part.status();
      EXPECT_EQ(part->size, whole->size) << partition << options;
      EXPECT_EQ(part->labels, whole->labels) << partition << options;
      EXPECT_TRUE(part->bytes == whole->bytes) << partition << options;
      EXPECT_EQ(part->shape, whole->shape);
      EXPECT_EQ(part->mean, whole->mean);
    }
  }
  const PartFilter twice = [](const Dataset&) -> StatusOr<std::vector<int64_t>> {
    return std::vector<int64_t>{59999, 5, 5, 0};
  };
  auto all = LoadDataSpec(spec, true);
  auto odd = LoadDataSpecPart(spec, true, twice);
  ASSERT_TRUE(all.ok() && odd.ok()) << odd.status();
  ASSERT_EQ(odd->size, 4);
  EXPECT_EQ(odd->labels, (std::vector<int64_t>{all->labels[59999], all->labels[5], all->labels[5], all->labels[0]}));
  EXPECT_TRUE(std::equal(odd->bytes.begin() + 784, odd->bytes.begin() + 1568, all->bytes.begin() + 5 * 784));
  EXPECT_TRUE(std::equal(odd->bytes.begin() + 1568, odd->bytes.begin() + 2352, all->bytes.begin() + 5 * 784));
  EXPECT_TRUE(std::equal(odd->bytes.begin(), odd->bytes.begin() + 784, all->bytes.begin() + 59999 * 784));
  const PartFilter outside = [](const Dataset& d) -> StatusOr<std::vector<int64_t>> {
    return std::vector<int64_t>{d.size};
  };
  EXPECT_EQ(LoadDataSpecPart(spec, true, outside).status().code(), absl::StatusCode::kInvalidArgument);

  // A copy whose images end 100 bytes early, uncompressed (read as it is).
  const std::string dir = ::testing::TempDir() + "cleave_idx_short";
  std::filesystem::create_directories(dir);
  for (const char* name : {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    const std::string cmd = std::string("gzip -dc ") + kFmnist + "/" + name + ".gz > " + dir + "/" + name;
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  std::filesystem::resize_file(dir + "/t10k-images-idx3-ubyte", 16 + 10000 * 784 - 100);
  for (const PartFilter& f : {PartFilter(), *PartitionFilter("iid,client=0,of=2")}) {
    auto short_file = LoadDataSpecPart("idx:" + dir, false, f);
    EXPECT_EQ(short_file.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(short_file.status().message().find("t10k-images-idx3-ubyte: ends inside its images"), std::string::npos)
        << short_file.status();
  }
  std::filesystem::remove_all(dir);
}

// Labels 0..9, 100 each, in a scrambled order.
std::vector<int64_t> Labels() {
  std::vector<int64_t> l(1000);
  for (int i = 0; i < 1000; ++i) l[i] = (i * 7) % 10;
  return l;
}

void ExpectDisjoint(const std::vector<std::vector<int64_t>>& parts, size_t n, bool complete) {
  std::set<int64_t> seen;
  size_t total = 0;
  for (const auto& p : parts) {
    for (int64_t i : p) {
      EXPECT_TRUE(seen.insert(i).second) << "index " << i << " in two parts";
      EXPECT_LT(i, static_cast<int64_t>(n));
    }
    total += p.size();
  }
  if (complete) {
    EXPECT_EQ(total, n);
  }
}

TEST(PartitionTest, EverySchemeIsDisjointAndReproducible) {
  const auto labels = Labels();
  for (const std::string spec : {"iid", "dirichlet:0.5", "shards:2", "labels:2"}) {
    SCOPED_TRACE(spec);
    auto a = Partition(labels, 10, spec, 10, 7);
    auto b = Partition(labels, 10, spec, 10, 7);
    auto c = Partition(labels, 10, spec, 10, 8);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(*a, *b) << "same seed, same split";
    EXPECT_NE(*a, *c) << "another seed, another split";
    ExpectDisjoint(*a, labels.size(), spec != "labels:2");
  }
}

TEST(PartitionTest, IidGivesEqualShares) {
  auto p = Partition(Labels(), 10, "iid", 4, 1);
  ASSERT_TRUE(p.ok());
  for (const auto& part : *p) EXPECT_EQ(part.size(), 250u);
}

std::set<int64_t> LabelsOf(const std::vector<int64_t>& part, const std::vector<int64_t>& labels) {
  std::set<int64_t> s;
  for (int64_t i : part) s.insert(labels[i]);
  return s;
}

TEST(PartitionTest, LabelQuantityLimitsLabelsPerClient) {
  const auto labels = Labels();
  auto p = Partition(labels, 10, "labels:2", 10, 3);
  ASSERT_TRUE(p.ok());
  for (size_t c = 0; c < p->size(); ++c) {
    auto held = LabelsOf((*p)[c], labels);
    EXPECT_LE(held.size(), 2u);
    EXPECT_TRUE(held.count(static_cast<int64_t>(c % 10)));
  }
}

TEST(PartitionTest, ShardsGiveFewLabelsEach) {
  const auto labels = Labels();
  auto p = Partition(labels, 10, "shards:2", 10, 3);
  ASSERT_TRUE(p.ok());
  for (const auto& part : *p) {
    EXPECT_EQ(part.size(), 100u);
    EXPECT_LE(LabelsOf(part, labels).size(), 4u);  // 2 shards, each spans <= 2 labels
  }
}

TEST(PartitionTest, DirichletSkewsLabelsAndKeepsMinimumSize) {
  const auto labels = Labels();
  auto skewed = Partition(labels, 10, "dirichlet:0.1", 10, 42);
  ASSERT_TRUE(skewed.ok());
  size_t few_labels = 0;
  for (const auto& part : *skewed) {
    EXPECT_GE(part.size(), 10u);
    // Count labels that make up >= 5% of the part.
    std::vector<int> counts(10);
    for (int64_t i : part) counts[labels[i]]++;
    int major = 0;
    for (int c : counts) major += c * 20 >= static_cast<int>(part.size());
    few_labels += major <= 4;
  }
  EXPECT_GE(few_labels, 5u) << "alpha 0.1 should concentrate most clients on few labels";
}

TEST(PartitionTest, RejectsBadSpecs) {
  const auto labels = Labels();
  for (const std::string spec : {"dirichlet:0", "dirichlet:x", "shards:0", "shards:1000",
                                 "labels:11", "labels:0", "random", "iid:3"}) {
    EXPECT_EQ(Partition(labels, 10, spec, 10, 1).status().code(),
              absl::StatusCode::kInvalidArgument)
        << spec;
  }
  EXPECT_FALSE(Partition(labels, 10, "iid", 0, 1).ok());
}

TEST(DatasetTest, SubsetCopiesExamplesInOrder) {
  Dataset d;
  d.size = 3;
  d.shape = {1, 1, 2};
  d.bytes = {1, 2, 3, 4, 5, 6};
  d.labels = {7, 8, 9};
  d.groups = {0, 1, 0};
  Dataset s = d.Subset({2, 0});
  EXPECT_EQ(s.size, 2);
  EXPECT_EQ(s.bytes, (std::vector<uint8_t>{5, 6, 1, 2}));
  EXPECT_EQ(s.labels, (std::vector<int64_t>{9, 7}));
  EXPECT_EQ(s.groups, (std::vector<int32_t>{0, 0}));
}

// A client's part keeps what describes the data and holds only its own examples: it used
// to keep the capacity of the whole set's bytes (a partition of 10,000 clients then
// needed 10,000 copies of Fashion-MNIST).
TEST(DatasetTest, SubsetKeepsTheDescriptionAndOnlyItsOwnExamples) {
  Dataset d;
  d.size = 1000;
  d.type = ExampleType::kFloat32;
  d.shape = {3};
  d.num_classes = 4;
  d.mean = {1, 2, 3};
  d.stddev = {4, 5, 6};
  d.bytes.assign(d.size * d.example_bytes(), 7);
  d.labels.assign(d.size, 1);
  d.targets.assign(d.size, 0.5f);
  d.group_names = {"a"};
  d.groups.assign(d.size, 0);
  d.augment.flip = true;
  d.standardised = true;
  d.tokenizer = "byte";
  d.bytes_per_token = 1.5;
  Dataset s = d.Subset({3, 4});
  EXPECT_EQ(s.size, 2);
  EXPECT_EQ(s.type, d.type);
  EXPECT_EQ(s.shape, d.shape);
  EXPECT_EQ(s.num_classes, 4);
  EXPECT_EQ(s.mean, d.mean);
  EXPECT_EQ(s.stddev, d.stddev);
  EXPECT_EQ(s.group_names, d.group_names);
  EXPECT_EQ(s.groups.size(), 2u);
  EXPECT_EQ(s.targets, (std::vector<float>{0.5f, 0.5f}));
  EXPECT_TRUE(s.augment.flip);
  EXPECT_TRUE(s.standardised);
  EXPECT_EQ(s.tokenizer, "byte");
  EXPECT_EQ(s.bytes_per_token, 1.5);
  EXPECT_EQ(s.bytes.capacity(), 2 * static_cast<size_t>(d.example_bytes()));
  EXPECT_LE(s.labels.capacity(), 2u);
}

}  // namespace
}  // namespace cleave
