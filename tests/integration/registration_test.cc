// Extension by registration: a strategy, a codec, a data source and a round scheduler
// that exist only in this file are registered from it (no other file names them) and
// run federations through the real server, clients and job validation.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/numbers.h"

#include "aggregation/registry.h"
#include "compression/codec.h"
#include "data/source.h"
#include "job/job.h"
#include "server/rounds/round_registry.h"
#include "server/rounds/scheduler.h"
#include "tests/integration/federation.h"

namespace cleave {
namespace {

// "halfavg": FedAvg that moves the global model half-way to the clients' weighted mean.
class HalfAvg : public Strategy {
 public:
  explicit HalfAvg(const StrategyJob& c) : fit_(FitOf(c.train)) {}
  std::string name() const override { return "halfavg"; }
  RoundPlan ConfigureRound(int64_t, const std::vector<std::string>& available,
                           const ClientSampler&) override {
    RoundPlan plan;
    plan.fit = fit_;
    plan.clients = available;  // everyone, every round
    return plan;
  }
  RoundPlan ConfigureBuffer(int64_t) override { return RoundPlan{{}, fit_, {}, ""}; }
  void BeginRound(const ParameterSet& global, int shards) override {
    sums_.assign(shards, global.ZerosLike());
    weights_.assign(shards, 0);
    count_ = 0;
  }
  void Accumulate(const ClientUpdate& u, int shard) override {
    auto& ts = sums_[shard].mutable_tensors();
    std::vector<float> buf;
    for (size_t i = 0; i < ts.size(); ++i) {
      buf.resize(u.delta[i].numel);
      u.delta[i].Read(0, u.delta[i].numel, buf.data());
      for (size_t j = 0; j < buf.size(); ++j) ts[i].values[j] += u.weight * buf[j];
    }
    weights_[shard] += u.weight;
    ++count_;  // shards are added to concurrently, but each result is counted once
  }
  int accumulated() const override { return count_; }
  Status FinishRound(int, ParameterSet* global) override {
    double weight = 0;
    for (double w : weights_) weight += w;
    if (count_ == 0) return absl::FailedPreconditionError("no results");
    auto& xs = global->mutable_tensors();
    for (size_t i = 0; i < xs.size(); ++i) {
      for (size_t j = 0; j < xs[i].values.size(); ++j) {
        double sum = 0;
        for (const ParameterSet& s : sums_) sum += s.tensors()[i].values[j];
        xs[i].values[j] += static_cast<float>(0.5 * sum / weight);
      }
    }
    return absl::OkStatus();
  }
  ParameterSet State() const override { return ParameterSet(); }
  Status Restore(const ParameterSet&) override { return absl::OkStatus(); }

 private:
  FitSettings fit_;
  std::vector<ParameterSet> sums_;
  std::vector<double> weights_;
  std::atomic<int> count_{0};
};

// "f64": every value as a float64, twice fp32's bytes; lossless.
std::atomic<int64_t> f64_encoded{0};
class F64Codec : public Codec {
 public:
  F64Codec() : Codec("f64") {}
  void Encode(int, const float* in, const Shape& shape, std::string* out) override {
    for (int64_t i = 0; i < NumElements(shape); ++i) {
      const double d = in[i];
      out->append(reinterpret_cast<const char*>(&d), 8);
    }
    f64_encoded += NumElements(shape);
  }
  int64_t EncodedSize(const Shape& shape) const override { return 8 * NumElements(shape); }
  Status Check(std::string_view bytes, const Shape& shape) const override {
    if (static_cast<int64_t>(bytes.size()) != EncodedSize(shape)) {
      return absl::InvalidArgumentError("f64: wrong size");
    }
    for (size_t i = 0; i < bytes.size(); i += 8) {
      double d;
      std::memcpy(&d, bytes.data() + i, 8);
      if (!std::isfinite(d)) return absl::InvalidArgumentError("f64: not finite");
    }
    return absl::OkStatus();
  }
  void DecodeRange(std::string_view bytes, const Shape&, int64_t begin, int64_t count,
                   float* out) const override {
    for (int64_t i = 0; i < count; ++i) {
      double d;
      std::memcpy(&d, bytes.data() + 8 * (begin + i), 8);
      out[i] = static_cast<float>(d);
    }
  }
};

// "blobs:N[,seed=S]": N points of two Gaussian blobs in the plane, labelled by blob.
StatusOr<Dataset> LoadBlobs(const std::string& path, bool, SpecOptions& o) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(path, &n) || n < 2) return absl::InvalidArgumentError("blobs:N, N >= 2");
  ASSIGN_OR_RETURN(int64_t seed, o.Int("seed", 1, 0, 1 << 30));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0, 0.7f);
  Dataset d;
  d.size = n;
  d.type = ExampleType::kFloat32;
  d.shape = {2};
  d.num_classes = 2;
  d.bytes.resize(n * 2 * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(i % 2);
    const float xy[2] = {(label ? 1.5f : -1.5f) + noise(rng), (label ? -1.0f : 1.0f) + noise(rng)};
    std::memcpy(d.bytes.data() + i * sizeof(xy), xy, sizeof(xy));
    d.labels.push_back(label);
  }
  return d;
}

// "pairs": synchronous rounds whose clients get their tasks two at a time, the next two
// once the two before are resolved. Counts the waves it sends.
std::atomic<int> pair_waves{0};

class PairRounds : public SyncRounds {
 public:
  using SyncRounds::SyncRounds;

 protected:
  std::vector<std::string> FirstWaveLocked(const std::vector<std::string>& clients) override {
    waiting_.assign(clients.begin(), clients.end());
    return TakeTwo();
  }
  bool NextWaveLocked(int64_t round, const RoundPlan& plan, int64_t deadline_ms) override {
    if (waiting_.empty()) return false;
    ctx_.SendTasksLocked(round, TakeTwo(), plan, deadline_ms);
    return true;
  }

 private:
  std::vector<std::string> TakeTwo() {
    ++pair_waves;
    const size_t n = std::min<size_t>(2, waiting_.size());
    std::vector<std::string> wave(waiting_.begin(), waiting_.begin() + n);
    waiting_.erase(waiting_.begin(), waiting_.begin() + n);
    return wave;
  }
  std::vector<std::string> waiting_;
};

// The four registrations: one statement each, in this file only.
const bool kRegistered = [] {
  bool ok = Strategies()
                .Add("halfavg", {[](const StrategyJob& c) -> StatusOr<std::unique_ptr<Strategy>> {
                   return std::unique_ptr<Strategy>(new HalfAvg(c));
                 }})
                .ok();
  ok &= Codecs()
            .Add("f64", [](const CodecSpec&) -> StatusOr<std::unique_ptr<Codec>> {
              return std::unique_ptr<Codec>(new F64Codec());
            })
            .ok();
  ok &= DataSources().Add("blobs", {{"seed"}, LoadBlobs}).ok();
  ok &= Schedulers()
            .Add("pairs", {[](RoundContext& ctx, RoundDriver& driver) -> std::unique_ptr<RoundScheduler> {
                   return std::make_unique<PairRounds>(ctx, driver);
                 }})
            .ok();
  return ok;
}();

std::string Job(const std::string& strategy, const std::string& codec) {
  return "run: {rounds: 3, seed: 5}\n"
         "model: {name: mlp, input: [2], classes: 2}\n"
         "data: {test: \"blobs:400,seed=9\"}\n"
         "clients: {min: 2, per_round: 2}\n"
         "train: {batch_size: 16, lr: 0.1, momentum: 0}\n"
         "strategy: {name: " + strategy + "}\n"
         "compression: {update: \"" + codec + "\"}\n";
}

std::vector<ClientOptions> BlobClients(int n = 2) {
  auto all = LoadDataSpec("blobs:600,seed=3", true);
  EXPECT_TRUE(all.ok()) << all.status();
  std::vector<ClientOptions> out;
  for (int c = 0; c < n; ++c) {
    std::vector<int64_t> part;
    for (int64_t i = c; i < all->size; i += n) part.push_back(i);
    ClientOptions o;
    o.train = all->Subset(part);
    out.push_back(std::move(o));
  }
  return out;
}

TEST(RegistrationTest, TheTablesAndTheJobSeeWhatATestRegistered) {
  ASSERT_TRUE(kRegistered);
  EXPECT_TRUE(StrategyNames().Has("halfavg"));
  const auto families = SupportedCodecFamilies();
  EXPECT_NE(std::find(families.begin(), families.end(), "f64"), families.end());
  EXPECT_TRUE(ParseJob(Job("halfavg", "f64")).ok());
  auto unknown = ParseJob(Job("halfavgx", "none"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find(
                "strategy.name: unknown 'halfavgx'; choose one of fedavg, "),
            std::string::npos)
      << unknown.status();
  EXPECT_NE(unknown.status().message().find("halfavg"), std::string::npos);
  // A name twice is refused, and the first registration stays.
  EXPECT_EQ(Strategies().Add("halfavg", {}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(MakeCodec("f64:2").status().code(), absl::StatusCode::kOk);  // its factory's call
  auto blobs = LoadDataSpec("blobs:10,seed=2", true);
  ASSERT_TRUE(blobs.ok()) << blobs.status();
  EXPECT_EQ(blobs->size, 10);
  EXPECT_NE(LoadDataSpec("blobs:10,colour=red", true).status().message().find("colour"),
            std::string::npos);
  EXPECT_TRUE(SchedulerModeNames().Has("pairs"));
  EXPECT_TRUE(ParseJob(Job("fedavg", "none") + "scheduler: {mode: pairs}\n").ok());
  auto no_mode = ParseJob(Job("fedavg", "none") + "scheduler: {mode: threes}\n");
  ASSERT_FALSE(no_mode.ok());
  EXPECT_NE(no_mode.status().message().find("scheduler.mode: unknown 'threes'; choose one of sync"),
            std::string::npos)
      << no_mode.status();
  EXPECT_NE(no_mode.status().message().find("pairs"), std::string::npos);
}

// The scheduler the job names runs the rounds: four clients, two waves of two a round,
// every client's update in, and the federation learns.
TEST(RegistrationTest, ATestOnlySchedulerRunsTheRounds) {
  ASSERT_TRUE(kRegistered);
  const int waves_before = pair_waves;
  std::string job = Job("halfavg", "none") + "scheduler: {mode: pairs}\n";
  job.replace(job.find("clients: {min: 2, per_round: 2}"), 31, "clients: {min: 4, per_round: 4}");
  Federation f;
  f.Start(job, BlobClients(4));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  const auto history = f.server->History();
  ASSERT_EQ(history.size(), 3u);
  for (const RoundMetrics& m : history) EXPECT_EQ(m.participants, 4) << "round " << m.round;
  EXPECT_EQ(pair_waves - waves_before, 3 * 2) << "two waves of two in each of 3 rounds";
  EXPECT_GT(history.back().test_accuracy, 0.9);
}

// The three together run a federation that learns: every update travels as f64 (8
// bytes a value), and halfavg moves the model half as far as fedavg from the same
// round-1 updates.
TEST(RegistrationTest, ATestOnlyStrategyCodecAndDataSourceRunAFederation) {
  ASSERT_TRUE(kRegistered);
  const int64_t encoded_before = f64_encoded;
  Federation half;
  half.Start(Job("halfavg", "f64"), BlobClients());
  half.Join();
  ASSERT_TRUE(half.server_status.ok()) << half.server_status;
  const auto history = half.server->History();
  ASSERT_EQ(history.size(), 3u);
  int64_t numel = 0;
  const ParameterSet model = half.server->GlobalModel();
  for (const auto& t : model.tensors()) numel += t.numel();
  for (const RoundMetrics& m : history) {
    EXPECT_EQ(m.participants, 2);
    EXPECT_EQ(m.update_bytes, 2 * 8 * numel) << "round " << m.round;
  }
  EXPECT_EQ(f64_encoded - encoded_before, 3 * 2 * numel);
  EXPECT_GT(history.back().test_accuracy, 0.9) << "the blobs are separable";

  // One round of each from the same start: halfavg's step is half of fedavg's.
  auto one_round = [](const std::string& strategy, ParameterSet* start) {
    Federation f;
    std::string job = Job(strategy, "f64");
    job.replace(job.find("rounds: 3"), 9, "rounds: 1");
    f.Start(job, BlobClients());
    *start = f.initial;
    f.Join();
    EXPECT_TRUE(f.server_status.ok()) << f.server_status;
    return f.server->GlobalModel();
  };
  ParameterSet start_half, start_avg;
  const ParameterSet after_half = one_round("halfavg", &start_half);
  const ParameterSet after_avg = one_round("fedavg", &start_avg);
  double moved = 0;
  for (size_t i = 0; i < after_half.size(); ++i) {
    for (size_t j = 0; j < after_half.tensors()[i].values.size(); ++j) {
      const double s = start_half.tensors()[i].values[j];
      ASSERT_EQ(s, start_avg.tensors()[i].values[j]);
      const double full = after_avg.tensors()[i].values[j] - s;
      EXPECT_NEAR(after_half.tensors()[i].values[j] - s, 0.5 * full, 1e-5 + 1e-4 * std::abs(full));
      moved += std::abs(full);
    }
  }
  EXPECT_GT(moved, 0.1) << "the round trained";
}

}  // namespace
}  // namespace cleave
