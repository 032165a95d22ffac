// In-memory image-classification datasets (uint8 pixels, int64 labels) and the
// partitioners that make reproducible federated splits of them. No LibTorch here;
// models/ turns a Dataset into tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace cleave {

struct Dataset {
  int64_t size = 0;
  int channels = 1;
  int height = 28;
  int width = 28;
  int num_classes = 10;
  float mean = 0.0f;  // normalisation applied to pixel/255
  float stddev = 1.0f;
  std::vector<uint8_t> images;  // size * channels * height * width
  std::vector<int64_t> labels;  // size

  int64_t example_bytes() const { return int64_t{channels} * height * width; }
  // The examples at `indices`, in that order. Indices must be < size.
  Dataset Subset(const std::vector<int64_t>& indices) const;
};

// Reads Fashion-MNIST (IDX files, gzip) from `dir`: train-*.gz when `train`, else
// t10k-*.gz. `limit` > 0 keeps the first `limit` examples.
StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train, int64_t limit = 0);

// A data spec: "fmnist:DIR" or "fmnist:DIR,limit=N".
StatusOr<Dataset> LoadDataSpec(const std::string& spec, bool train);

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

}  // namespace cleave
