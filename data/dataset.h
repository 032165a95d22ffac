// In-memory datasets (examples of any shape, stored as 8-bit values, floats or token
// ids, with integer class labels or real-valued regression targets) and the partitioners
// that make reproducible federated splits of them. No LibTorch here; models/ turns a
// Dataset into tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace cleave {

enum class ExampleType {
  kUint8,    // pixels: a model sees value / 255, then normalised
  kFloat32,  // features: a model sees the value, then normalised
  // Text: each example is a sequence of shape[0] token ids (int32); a language model
  // reads the first shape[0] - 1 and predicts each next one. An id stored as -1 - id is
  // read but not predicted (an instruction's prompt, padding: kNoTarget). No
  // normalisation.
  kToken,
};

// Random augmentation applied by the client to each training batch (not to evaluation):
// a random crop after zero-padding (after normalisation, so the padding is the mean)
// and a random horizontal flip. Image examples ([C, H, W]) only.
struct Augmentation {
  int crop_padding = 0;  // 0 = no crop
  bool flip = false;

  bool enabled() const { return crop_padding > 0 || flip; }
};

// The target of a token that is read but not predicted (LibTorch's cross-entropy
// ignore_index): its loss is not counted.
constexpr int64_t kNoTarget = -100;

struct Dataset {
  int64_t size = 0;
  ExampleType type = ExampleType::kUint8;
  std::vector<int64_t> shape = {1, 28, 28};  // one example: [C, H, W] or [features]
  int num_classes = 10;  // labels are in [0, num_classes); text: the vocabulary's size
  // What a model sees is (x - mean[c]) / stddev[c], x the value (pixels / 255), c the
  // index along the example's first dimension (the channel, or the feature). Each holds
  // one value for all, or shape[0] values; empty = no normalisation.
  std::vector<float> mean, stddev;
  std::vector<uint8_t> bytes;   // size * example_bytes(), row-major, examples in order
  std::vector<int64_t> labels;  // size (all 0 for regression data)
  // Regression data (a table's `regression` option): the target of each example; empty
  // for classification. Only iid and natural partitions apply to it.
  std::vector<float> targets;
  // The natural partition key, where the data has one (a folder, a file, a column):
  // groups[i] indexes group_names. Empty when the source has none.
  std::vector<int32_t> groups;
  std::vector<std::string> group_names;
  Augmentation augment;
  // The normalisation is this data's own statistics (Standardise), to be recomputed
  // when a part of it is taken (TakePartition): statistics stay local to a client.
  bool standardised = false;
  // Text: the tokenizer's spec ("byte", "spm:PATH") and the mean number of text bytes a
  // token stands for (1 for bytes), which turns a loss per token into bits per byte.
  std::string tokenizer;
  double bytes_per_token = 0;

  int64_t example_elements() const;
  int64_t example_bytes() const;
  // Text: the id at `position` of sequence `example`, and what the model is trained to
  // predict there: the id, or kNoTarget.
  int32_t token(int64_t example, int64_t position) const;
  int64_t target(int64_t example, int64_t position) const;
  // The examples at `indices`, in that order. Indices must be < size.
  Dataset Subset(const std::vector<int64_t>& indices) const;
  // Writes example `i`'s normalised values (example_elements() floats) to `out`.
  void Normalised(int64_t i, float* out) const;
  // Sets mean and stddev per feature (or channel) from these examples' own values: the
  // local standardisation of a tabular data set (a feature with no spread gets stddev 1).
  void Standardise();
};

// Loads a data spec (docs/configuration.md, "Data sources"):
//   SOURCE:PATH[,OPTION...]  with SOURCE one of idx, fmnist (= idx), folder, cifar10,
//   cifar100, csv, tsv, text, instruct. `train` picks the training or the test part of sources that
//   have both (IDX train-* or t10k-*, CIFAR data_batch_* or test_batch, a folder's
//   train/ or test/ subfolder when it has them). Errors name the file and the entry.
StatusOr<Dataset> LoadDataSpec(const std::string& spec, bool train);
// Which examples of a data set a client keeps, decided from an index of it: a Dataset
// with the examples' count, labels, targets and groups but no bytes.
using PartFilter = std::function<StatusOr<std::vector<int64_t>>(const Dataset& index)>;
// A partition spec "SCHEME,client=I,of=N[,seed=S]" (SCHEME a PartitionDataset scheme, e.g.
// "dirichlet:0.5,client=3,of=10,seed=42") as a filter.
StatusOr<PartFilter> PartitionFilter(const std::string& spec);
// LoadDataSpec then PartOf the examples `part` keeps, with the same result; a source
// that can (idx) reads only those examples' bytes, so that the whole data set is never
// in memory at once.
StatusOr<Dataset> LoadDataSpecPart(const std::string& spec, bool train, const PartFilter& part);
// Keeps this client's part of `data` by a partition spec (PartitionFilter).
// Standardised data is standardised again on the part.
Status TakePartition(const std::string& spec, Dataset* data);
// Client `indices`'s part of `data`, as TakePartition keeps it (standardised data is
// standardised again on the part).
Dataset PartOf(const Dataset& data, const std::vector<int64_t>& indices);
// Moves a seeded random `fraction` of `data`'s examples (at least one when fraction > 0,
// never all) into the returned held-out set.
Dataset TakeHoldout(Dataset* data, double fraction, uint64_t seed);
// The text files the text source reads under `path` (itself, when a file): sorted, each
// once (a symbolic link to a file already listed is skipped), binary files (a NUL byte
// in the first 8 KiB) left out. NOT_FOUND when there are none.
StatusOr<std::vector<std::string>> TextFilesUnder(const std::string& path);
// The source names LoadDataSpec knows, for messages and docs.
std::vector<std::string> DataSourceNames();

// Reads Fashion-MNIST or MNIST (IDX files, gzip or not) from `dir`: train-*  when
// `train`, else t10k-*. `limit` > 0 keeps the first `limit` examples.
StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train, int64_t limit = 0);

// Splits example indices among `num_clients` clients. `spec` is one of
//   iid             shuffled, equal shares
//   dirichlet:A     per-class proportions ~ Dir(A) (the NIID-Bench scheme; every client
//                   gets at least 10 examples)
//   shards:S        sort by label, cut into num_clients*S shards, S random shards each
//   labels:K        each client holds K distinct labels; a label's examples are split
//                   evenly among the clients that hold it
// The same labels, spec, client count and seed always give the same split. Every index
// appears in at most one part; iid, dirichlet and shards use every index.
StatusOr<std::vector<std::vector<int64_t>>> Partition(const std::vector<int64_t>& labels,
                                                      int num_classes, const std::string& spec,
                                                      int num_clients, uint64_t seed);
// As above, plus `natural`: the data's own groups (Dataset::groups), in the order of
// their names, dealt to the clients in turn (client i gets groups i, i + n, ...).
// INVALID_ARGUMENT when the data has no groups or fewer groups than clients.
StatusOr<std::vector<std::vector<int64_t>>> PartitionDataset(const Dataset& data,
                                                             const std::string& spec,
                                                             int num_clients, uint64_t seed);

}  // namespace cleave
