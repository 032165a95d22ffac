// Every data source read back against the Fashion-MNIST IDX files it was written from,
// the sklearn tables Debian ships, and the errors bad data must get.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "data/dataset.h"
#include "tests/data/render.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
const std::string kFmnist = "/usr/share/datasets/fashion-mnist";
const std::string kSklearn = "/usr/lib/python3/dist-packages/sklearn/datasets/data";

class SourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cleave_sources_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto d = LoadDataSpec("idx:" + kFmnist + ",limit=60", /*train=*/true);
    ASSERT_TRUE(d.ok()) << d.status();
    fmnist_ = *std::move(d);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` to dir_/`name` and returns its path.
  std::string Write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }

  // The message of loading `spec`, which must fail with `code`.
  std::string Error(const std::string& spec, absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    auto d = LoadDataSpec(spec, true);
    EXPECT_FALSE(d.ok()) << spec;
    if (d.ok()) return "";
    EXPECT_EQ(d.status().code(), code) << d.status();
    return std::string(d.status().message());
  }

  fs::path dir_;
  Dataset fmnist_;
};

// Examples of `a` and `b` hold the same pixels and labels, in any order of classes
// (folders sort by class, then file name).
void ExpectSameExamples(const Dataset& a, const Dataset& b) {
  ASSERT_EQ(a.size, b.size);
  ASSERT_EQ(a.shape, b.shape);
  std::multiset<std::pair<int64_t, std::vector<uint8_t>>> ea, eb;
  const int64_t n = a.example_bytes();
  for (int64_t i = 0; i < a.size; ++i) {
    ea.emplace(a.labels[i], std::vector<uint8_t>(a.bytes.begin() + i * n, a.bytes.begin() + (i + 1) * n));
    eb.emplace(b.labels[i], std::vector<uint8_t>(b.bytes.begin() + i * n, b.bytes.begin() + (i + 1) * n));
  }
  EXPECT_TRUE(ea == eb);
}

TEST_F(SourcesTest, PngFolderReadsBackTheImagesExactly) {
  testing::WriteImageFolder(fmnist_, dir_ / "png");
  auto d = LoadDataSpec("folder:" + (dir_ / "png").string() + ",channels=1", true);
  ASSERT_TRUE(d.ok()) << d.status();
  // Folder names "class0".."class9" sort as the labels do.
  EXPECT_EQ(d->num_classes, static_cast<int>(std::set<int64_t>(fmnist_.labels.begin(), fmnist_.labels.end()).size()));
  ExpectSameExamples(fmnist_, *d);
}

TEST_F(SourcesTest, JpegFolderDecodesCloseToTheOriginal) {
  testing::WriteImageFolder(fmnist_, dir_ / "jpg", /*jpeg=*/true);
  auto d = LoadDataSpec("folder:" + (dir_ / "jpg").string() + ",channels=1", true);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size, fmnist_.size);
  std::multiset<int64_t> la(fmnist_.labels.begin(), fmnist_.labels.end()),
      lb(d->labels.begin(), d->labels.end());
  EXPECT_EQ(la, lb);
  // JPEG at quality 95 is lossy: the mean brightness stays within 2/255.
  int64_t sum_a = 0, sum_b = 0;
  for (uint8_t v : fmnist_.bytes) sum_a += v;
  for (uint8_t v : d->bytes) sum_b += v;
  const double total = std::abs(static_cast<double>(sum_a - sum_b)) / fmnist_.bytes.size();
  EXPECT_LT(total, 2.0) << "mean brightness moved by more than 2/255";
}

TEST_F(SourcesTest, FolderResizesAndConvertsToRgb) {
  testing::WriteImageFolder(fmnist_, dir_ / "png");
  auto d = LoadDataSpec("folder:" + (dir_ / "png").string() + ",size=32x32", true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->shape, (std::vector<int64_t>{3, 32, 32}));
  // Grey to RGB: the three planes are equal.
  const uint8_t* px = d->bytes.data();
  for (int i = 0; i < 1024; ++i) {
    ASSERT_EQ(px[i], px[1024 + i]);
    ASSERT_EQ(px[i], px[2048 + i]);
  }
}

TEST_F(SourcesTest, FolderTrainAndTestSubfoldersAndGroups) {
  Dataset a = fmnist_.Subset({0, 1, 2, 3, 4, 5}), b = fmnist_.Subset({6, 7, 8});
  testing::WriteImageFolder(a, dir_ / "sites" / "train" / "hospital-a");
  testing::WriteImageFolder(b, dir_ / "sites" / "train" / "hospital-b");
  testing::WriteImageFolder(b, dir_ / "sites" / "test" / "hospital-a");
  const std::string root = "folder:" + (dir_ / "sites").string() + ",channels=1,groups";
  auto train = LoadDataSpec(root, true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->size, 9);
  EXPECT_EQ(train->group_names, (std::vector<std::string>{"hospital-a", "hospital-b"}));
  auto test = LoadDataSpec(root, false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size, 3);

  // The natural partition: client 0 is hospital-a, client 1 hospital-b.
  Dataset c0 = *train, c1 = *train;
  ASSERT_TRUE(TakePartition("natural,client=0,of=2", &c0).ok());
  ASSERT_TRUE(TakePartition("natural,client=1,of=2", &c1).ok());
  EXPECT_EQ(c0.size, 6);
  EXPECT_EQ(c1.size, 3);
  for (int32_t g : c1.groups) EXPECT_EQ(train->group_names[g], "hospital-b");
  auto three = TakePartition("natural,client=0,of=3", &c0);
  EXPECT_NE(three.message().find("2 groups cannot feed 3 clients"), std::string::npos) << three;
  Dataset plain = fmnist_;
  EXPECT_NE(TakePartition("natural,client=0,of=2", &plain).message().find("no groups"),
            std::string::npos);
}

TEST_F(SourcesTest, FolderErrorsNameTheFile) {
  testing::WriteImageFolder(fmnist_.Subset({0, 1}), dir_ / "bad");
  const std::string bad = (dir_ / "bad").string();
  // A corrupt PNG.
  const fs::path corrupt = dir_ / "bad" / ("class" + std::to_string(fmnist_.labels[0])) / "zz.png";
  std::ofstream(corrupt) << "\x89PNG\r\n\x1a\nnot really";
  EXPECT_NE(Error("folder:" + bad, absl::StatusCode::kDataLoss).find("zz.png: cannot decode"),
            std::string::npos);
  fs::remove(corrupt);
  // Mixed sizes without size=.
  Dataset big;
  big.size = 1;
  big.shape = {1, 30, 30};
  big.bytes.assign(900, 7);
  big.labels = {fmnist_.labels[0]};
  testing::WriteImageFolder(big, dir_ / "bad");
  const std::string msg = Error("folder:" + bad + ",channels=1");
  EXPECT_NE(msg.find("is 30x30 but"), std::string::npos) << msg;
  EXPECT_NE(msg.find("size=HxW"), std::string::npos) << msg;
  EXPECT_TRUE(LoadDataSpec("folder:" + bad + ",channels=1,size=28", true).ok());
  // An empty class folder, no class folders, a missing folder.
  fs::create_directories(dir_ / "bad" / "empty-class");
  EXPECT_NE(Error("folder:" + bad).find("empty-class: no images"), std::string::npos);
  fs::create_directories(dir_ / "none");
  EXPECT_NE(Error("folder:" + (dir_ / "none").string()).find("no class folders"), std::string::npos);
  Error("folder:" + (dir_ / "missing").string(), absl::StatusCode::kNotFound);
  // Options that do not exist or do not parse.
  EXPECT_NE(Error("folder:" + bad + ",chanels=1").find("unknown option 'chanels'"), std::string::npos);
  EXPECT_NE(Error("folder:" + bad + ",size=0x5").find("size=HxW"), std::string::npos);
  EXPECT_NE(Error("folder:" + bad + ",channels=2").find("channels=1"), std::string::npos);
}

TEST_F(SourcesTest, CifarBinaryRoundTrip) {
  testing::WriteCifar10(fmnist_, dir_ / "cifar", /*train=*/true, /*per_file=*/25);
  auto d = LoadDataSpec("cifar10:" + (dir_ / "cifar").string(), true);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size, fmnist_.size);  // three batch files: 25 + 25 + 10 records
  EXPECT_EQ(d->shape, (std::vector<int64_t>{3, 32, 32}));
  EXPECT_EQ(d->labels, fmnist_.labels);
  EXPECT_EQ(d->mean.size(), 3u);
  for (int64_t i : {0, 37, 59}) {  // pixel (y, x) of the original is at (y + 2, x + 2)
    const uint8_t* px = d->bytes.data() + i * 3072;
    EXPECT_EQ(px[2048 + (5 + 2) * 32 + 9 + 2], fmnist_.bytes[i * 784 + 5 * 28 + 9]);
    EXPECT_EQ(px[0], 0);
  }
  // Truncated file; a label beyond the classes.
  fs::resize_file(dir_ / "cifar" / "data_batch_1.bin", 3073 * 2 + 5);
  EXPECT_NE(Error("cifar10:" + (dir_ / "cifar").string(), absl::StatusCode::kDataLoss)
                .find("data_batch_1.bin: 6151 bytes is not a whole number of 3073-byte"),
            std::string::npos);
  std::ofstream(dir_ / "cifar" / "data_batch_1.bin", std::ios::binary) << std::string(1, 12) << std::string(3072, 0);
  EXPECT_NE(Error("cifar10:" + (dir_ / "cifar").string(), absl::StatusCode::kDataLoss)
                .find("record 0: label 12 is not in [0, 10)"),
            std::string::npos);
}

TEST_F(SourcesTest, CsvReadsBackTheImagesAsFeatures) {
  testing::WriteCsv(fmnist_, dir_ / "fmnist.csv");
  auto d = LoadDataSpec("csv:" + (dir_ / "fmnist.csv").string() + ",label=label", true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->type, ExampleType::kFloat32);
  EXPECT_EQ(d->shape, (std::vector<int64_t>{784}));
  EXPECT_EQ(d->labels, fmnist_.labels);
  std::vector<float> x(784);
  d->Normalised(17, x.data());  // no normalisation asked: the values as written
  for (int j = 0; j < 784; ++j) ASSERT_NEAR(x[j], fmnist_.bytes[17 * 784 + j] / 255.0, 1e-6);
}

TEST_F(SourcesTest, SklearnBreastCancerTable) {
  // sklearn's files: a first line "569,30,malignant,benign", then rows, label last.
  const std::string spec = "csv:" + kSklearn + "/breast_cancer.csv,header=0,skip=1,standardise";
  auto d = LoadDataSpec(spec, true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 569);
  EXPECT_EQ(d->shape, (std::vector<int64_t>{30}));
  EXPECT_EQ(d->num_classes, 2);
  int64_t benign = 0;
  for (int64_t l : d->labels) benign += l;
  EXPECT_EQ(benign, 357);  // the data set's documented class counts: 212 malignant, 357 benign
  // Standardised: every feature has mean 0 and stddev 1 over the data.
  std::vector<double> sum(30), sq(30);
  std::vector<float> x(30);
  for (int64_t i = 0; i < d->size; ++i) {
    d->Normalised(i, x.data());
    for (int j = 0; j < 30; ++j) {
      sum[j] += x[j];
      sq[j] += x[j] * x[j];
    }
  }
  for (int j = 0; j < 30; ++j) {
    EXPECT_NEAR(sum[j] / 569, 0, 1e-4);
    EXPECT_NEAR(sq[j] / 569, 1, 1e-3);
  }
  // A client's part is standardised with its own statistics.
  Dataset part = *d;
  ASSERT_TRUE(TakePartition("dirichlet:0.5,client=1,of=4,seed=3", &part).ok());
  EXPECT_TRUE(part.standardised);
  EXPECT_NE(part.mean, d->mean);
}

TEST_F(SourcesTest, SklearnRegressionTable) {
  // sklearn's Boston file: a line of counts, a line of names, then rows, the target MEDV
  // last. Its B column is a derived racial statistic that no model here should see.
  const std::string spec =
      "csv:" + kSklearn + "/boston_house_prices.csv,skip=1,label=MEDV,regression,drop=B";
  auto d = LoadDataSpec(spec, true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 506);
  EXPECT_EQ(d->shape, (std::vector<int64_t>{12}));
  EXPECT_EQ(d->num_classes, 1);
  ASSERT_EQ(d->targets.size(), 506u);
  EXPECT_FLOAT_EQ(d->targets[0], 24.0f);   // the file's first row
  EXPECT_FLOAT_EQ(d->targets[505], 11.9f); // and its last
  std::vector<float> x(12);
  d->Normalised(0, x.data());
  EXPECT_FLOAT_EQ(x[0], 0.00632f);  // CRIM
  EXPECT_FLOAT_EQ(x[11], 4.98f);    // LSTAT (B dropped before it)
  // Regression data has no classes to skew; a limit keeps targets with their rows.
  Dataset part = *d;
  EXPECT_NE(TakePartition("dirichlet:0.5,client=0,of=4", &part).message().find("regression"),
            std::string::npos);
  ASSERT_TRUE(TakePartition("iid,client=1,of=4,seed=2", &part).ok());
  EXPECT_EQ(part.targets.size(), static_cast<size_t>(part.size));
  auto limited = LoadDataSpec(spec + ",limit=7", true);
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ(limited->targets, std::vector<float>(d->targets.begin(), d->targets.begin() + 7));
  // offset leaves out the first rows, then limit keeps the next ones.
  auto later = LoadDataSpec(spec + ",offset=5,limit=7", true);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(later->targets, std::vector<float>(d->targets.begin() + 5, d->targets.begin() + 12));
  std::vector<float> row(d->example_bytes() / sizeof(float)), expected(row.size());
  later->Normalised(0, row.data());
  d->Normalised(5, expected.data());
  EXPECT_EQ(row, expected);
  const std::string bad = Write("r.csv", "a,y\n1,2.5\n2,inf\n");
  EXPECT_NE(Error("csv:" + bad + ",label=y,regression").find("r.csv:3: target 'inf' is not a finite number"),
            std::string::npos);
  EXPECT_NE(Error("csv:" + bad + ",label=y,regression,classes=2").find("no classes"),
            std::string::npos);
}

TEST_F(SourcesTest, CsvGroupColumnDropAndTsv) {
  const std::string p = Write("t.tsv",
                              "id\tsite\tage\t\"weight, kg\"\ty\n"
                              "1\tnorth\t50\t70.5\t1\n"
                              "2\tsouth\t60\t80\t0\n"
                              "\n"
                              "3\tnorth\t40\t65\t2\n");
  auto d = LoadDataSpec("tsv:" + p + ",label=y,group=site,drop=id", true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 3);
  EXPECT_EQ(d->shape, (std::vector<int64_t>{2}));  // age, "weight, kg"
  EXPECT_EQ(d->num_classes, 3);
  EXPECT_EQ(d->group_names, (std::vector<std::string>{"north", "south"}));
  EXPECT_EQ(d->groups, (std::vector<int32_t>{0, 1, 0}));
  std::vector<float> x(2);
  d->Normalised(2, x.data());
  EXPECT_EQ(x, (std::vector<float>{40, 65}));
  Dataset north = *d;
  ASSERT_TRUE(TakePartition("natural,client=0,of=2", &north).ok());
  EXPECT_EQ(north.labels, (std::vector<int64_t>{1, 2}));
}

TEST_F(SourcesTest, CsvErrorsNameTheLine) {
  const std::string missing = Write("m.csv", "a,b,label\n1,2,0\n3,,1\n");
  EXPECT_NE(Error("csv:" + missing).find("m.csv:3: column 'b' is empty"), std::string::npos);
  const std::string text = Write("n.csv", "a,b,label\n1,2,0\n3,x7,1\n");
  EXPECT_NE(Error("csv:" + text).find("n.csv:3: column 'b': 'x7' is not a finite number"),
            std::string::npos);
  const std::string nan = Write("nan.csv", "a,label\nnan,0\n");
  EXPECT_NE(Error("csv:" + nan).find("nan.csv:2"), std::string::npos);
  const std::string label = Write("l.csv", "a,label\n1,0\n2,5\n");
  EXPECT_NE(Error("csv:" + label + ",classes=3").find("l.csv:3: label '5' is not a class number in [0, 3)"),
            std::string::npos);
  const std::string neg = Write("neg.csv", "a,label\n1,-1\n");
  EXPECT_NE(Error("csv:" + neg).find("label '-1'"), std::string::npos);
  const std::string ragged = Write("r.csv", "a,b,label\n1,2,0\n1,0\n");
  EXPECT_NE(Error("csv:" + ragged).find("r.csv:3: 2 fields, the table has 3"), std::string::npos);
  EXPECT_NE(Error("csv:" + ragged + ",label=nope").find("no column 'nope'"), std::string::npos);
  const std::string empty = Write("e.csv", "a,label\n");
  EXPECT_NE(Error("csv:" + empty).find("no data rows"), std::string::npos);
  Error("csv:" + (dir_ / "absent.csv").string(), absl::StatusCode::kNotFound);
}

// Every source reads a client's part alone (only the kept examples' bytes) with the
// same result as the part taken from the whole set: for each scheme that applies, with a
// limit, and for a filter that keeps an example twice. A folder's image outside the part
// is never decoded.
TEST_F(SourcesTest, EverySourceReadsAPartAloneAsThePartTaken) {
  testing::WriteImageFolder(fmnist_, dir_ / "png");
  testing::WriteCifar10(fmnist_, dir_ / "cifar", /*train=*/true, /*per_file=*/25);
  testing::WriteCsv(fmnist_, dir_ / "fmnist.csv");
  const std::string tsv = Write("t.tsv", "site\tx\ty\n" "a\t1\t0\n" "b\t2\t1\n" "\n" "a\t3\t1\n"
                                         "c\t4\t0\n" "b\t5\t1\n");
  struct Case {
    std::string spec;
    std::vector<std::string> partitions;
    std::string limit;  // options that cut the set before the part is taken
  };
  const std::vector<Case> cases = {
      {"folder:" + (dir_ / "png").string() + ",channels=1",
       {"iid,client=1,of=3", "shards:2,client=0,of=4,seed=5", "labels:3,client=2,of=4"},
       ",offset=7,limit=41"},
      {"cifar10:" + (dir_ / "cifar").string(), {"iid,client=2,of=3", "dirichlet:0.5,client=1,of=3"}, ",offset=30,limit=41"},
      {"csv:" + (dir_ / "fmnist.csv").string() + ",label=label", {"iid,client=0,of=4", "labels:2,client=3,of=5"}, ",offset=3,limit=41"},
      {"tsv:" + tsv + ",label=y,group=site,standardise", {"natural,client=1,of=2", "iid,client=0,of=2"}, ",offset=1,limit=3"},
      {"text:/usr/share/games/fortunes,context=256", {"natural,client=3,of=10", "iid,client=7,of=10"}, ",offset=500,limit=6000"},
  };
  for (const auto& [spec, partitions, limit] : cases) {
    for (const std::string& partition : partitions) {
      for (const std::string& options : {std::string(), limit}) {
        const std::string what = spec + options + " " + partition;
        auto whole = LoadDataSpec(spec + options, true);
        ASSERT_TRUE(whole.ok()) << what << whole.status();
        ASSERT_TRUE(TakePartition(partition, &*whole).ok()) << what;
        auto filter = PartitionFilter(partition);
        ASSERT_TRUE(filter.ok());
        auto part = LoadDataSpecPart(spec + options, true, *filter);
        ASSERT_TRUE(part.ok()) << what << part.status();
        EXPECT_EQ(part->size, whole->size) << what;
        EXPECT_EQ(part->shape, whole->shape) << what;
        EXPECT_EQ(part->labels, whole->labels) << what;
        EXPECT_EQ(part->groups, whole->groups) << what;
        EXPECT_EQ(part->group_names, whole->group_names) << what;
        EXPECT_EQ(part->num_classes, whole->num_classes) << what;
        EXPECT_EQ(part->mean, whole->mean) << what;
        EXPECT_EQ(part->stddev, whole->stddev) << what;
        EXPECT_EQ(part->bytes_per_token, whole->bytes_per_token) << what;
        EXPECT_TRUE(part->bytes == whole->bytes) << what;
      }
    }
    const PartFilter twice = [](const Dataset& d) -> StatusOr<std::vector<int64_t>> {
      return std::vector<int64_t>{d.size - 1, 3, 3, 0};
    };
    auto all = LoadDataSpec(spec, true);
    auto odd = LoadDataSpecPart(spec, true, twice);
    ASSERT_TRUE(all.ok() && odd.ok()) << spec << odd.status();
    EXPECT_TRUE(odd->bytes == all->Subset({all->size - 1, 3, 3, 0}).bytes) << spec;
  }
  // The regression table keeps each row's target with it.
  const std::string boston = "csv:" + kSklearn + "/boston_house_prices.csv,skip=1,label=MEDV,regression";
  auto whole = LoadDataSpec(boston, true);
  ASSERT_TRUE(whole.ok() && TakePartition("iid,client=2,of=5", &*whole).ok());
  auto part = LoadDataSpecPart(boston, true, *PartitionFilter("iid,client=2,of=5"));
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->targets, whole->targets);
  EXPECT_TRUE(part->bytes == whole->bytes);

  // An undecodable image kept by client 1 of 2 only: the whole set and client 1's part
  // fail on it, client 0's part never reads it.
  auto listing = LoadDataSpec("folder:" + (dir_ / "png").string() + ",channels=1", true);
  ASSERT_TRUE(listing.ok());
  std::vector<fs::path> images;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "png")) {
    if (e.is_regular_file()) images.push_back(e.path());
  }
  std::sort(images.begin(), images.end());  // the folder source's order: class, then name
  auto zero = PartitionDataset(*listing, "iid", 2, 42);
  ASSERT_TRUE(zero.ok());
  const int64_t theirs = (*zero)[1][0];
  std::ofstream(images[theirs], std::ios::binary | std::ios::trunc) << "not an image";
  const std::string folder = "folder:" + (dir_ / "png").string() + ",channels=1";
  EXPECT_NE(Error(folder, absl::StatusCode::kDataLoss).find("cannot decode"), std::string::npos);
  EXPECT_FALSE(LoadDataSpecPart(folder, true, *PartitionFilter("iid,client=1,of=2")).ok());
  auto mine = LoadDataSpecPart(folder, true, *PartitionFilter("iid,client=0,of=2"));
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->size, static_cast<int64_t>((*zero)[0].size()));
}

TEST_F(SourcesTest, CommonOptions) {
  auto d = LoadDataSpec("idx:" + kFmnist + ",limit=10,mean=0.5,std=0.25,crop=4,flip", true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 10);
  EXPECT_EQ(d->augment.crop_padding, 4);
  EXPECT_TRUE(d->augment.flip);
  std::vector<float> x(784);
  d->Normalised(0, x.data());
  EXPECT_FLOAT_EQ(x[100], (d->bytes[100] / 255.0f - 0.5f) / 0.25f);
  EXPECT_NE(Error("idx:" + kFmnist + ",mean=0.1/0.2").find("one value or 1"), std::string::npos);
  EXPECT_NE(Error("idx:" + kFmnist + ",std=0").find("positive"), std::string::npos);
  EXPECT_NE(Error("idx:" + kFmnist + ",limit=5,limit=6").find("given twice"), std::string::npos);
  const std::string table = Write("t.csv", "a,label\n1,0\n2,1\n");
  EXPECT_NE(Error("csv:" + table + ",flip").find("images only"), std::string::npos);
}

TEST(HoldoutTest, SplitsDisjointlyAndReproducibly) {
  Dataset d;
  d.size = 100;
  d.shape = {1};
  d.bytes.resize(100);
  d.labels.resize(100);
  for (int i = 0; i < 100; ++i) d.bytes[i] = static_cast<uint8_t>(i);
  Dataset a = d, b = d;
  Dataset ha = TakeHoldout(&a, 0.2, 7), hb = TakeHoldout(&b, 0.2, 7);
  EXPECT_EQ(ha.size, 20);
  EXPECT_EQ(a.size, 80);
  EXPECT_EQ(ha.bytes, hb.bytes);
  std::set<uint8_t> all(a.bytes.begin(), a.bytes.end());
  for (uint8_t v : ha.bytes) EXPECT_TRUE(all.insert(v).second) << "example in both";
  EXPECT_EQ(all.size(), 100u);
  Dataset c = d;
  EXPECT_EQ(TakeHoldout(&c, 0, 7).size, 0);
  EXPECT_EQ(c.size, 100);
}

}  // namespace
}  // namespace cleave
