#include "split/record.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "core/printable.h"
#include "data/dataset.h"

namespace cleave {

SplitRecorder::~SplitRecorder() {
  if (!written_ && !record_.batches.empty()) {
    if (Status s = Write(); !s.ok()) spdlog::warn("split.record: {}", s.ToString());
  }
}

void SplitRecorder::Add(const ParameterSet& part, int cut, RecordedBatch batch) {
  if (!wants()) return;
  if (record_.batches.empty()) record_.part = part, record_.cut = cut;
  record_.batches.push_back(std::move(batch));
  if (static_cast<int>(record_.batches.size()) == limit_) {
    if (Status s = Write(); !s.ok()) spdlog::warn("split.record: {}", s.ToString());
  }
}

Status SplitRecorder::Write() {
  written_ = true;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create the folder of ", path_, ": ", ec.message()));
  return WriteFileAtomic(path_, EncodeSplitRecord(record_));
}

std::string EncodeSplitRecord(const SplitRecord& r) {
  ParameterSet out;
  for (const Tensor& t : r.part.tensors()) (void)out.Add(Tensor{"part/" + t.name, t.shape, t.values});
  if (r.cut > 0) (void)out.Add(Tensor{"cut", {1}, {static_cast<float>(r.cut)}});
  for (const Tensor& t : r.update.tensors()) (void)out.Add(Tensor{"update/" + t.name, t.shape, t.values});
  for (size_t k = 0; k < r.batches.size(); ++k) {
    const RecordedBatch& b = r.batches[k];
    (void)out.Add(Tensor{absl::StrCat("act/", k), b.activations.shape, b.activations.values});
    if (!b.labels.empty()) {
      std::vector<float> labels(b.labels.begin(), b.labels.end());
      (void)out.Add(Tensor{absl::StrCat("labels/", k), {static_cast<int64_t>(labels.size())}, std::move(labels)});
    }
    (void)out.Add(Tensor{absl::StrCat("grad/", k), b.gradient.shape, b.gradient.values});
    if (!b.reconstruction.shape.empty()) {
      (void)out.Add(Tensor{absl::StrCat("recon/", k), b.reconstruction.shape, b.reconstruction.values});
    }
  }
  return out.Encode();
}

StatusOr<SplitRecord> DecodeSplitRecord(const std::string& bytes) {
  ASSIGN_OR_RETURN(ParameterSet set, ParameterSet::Decode(bytes));
  SplitRecord r;
  const auto batch = [&](const std::string& name, size_t prefix) -> StatusOr<RecordedBatch*> {
    size_t k = 0;
    if (!absl::SimpleAtoi(name.substr(prefix), &k) || k > 100000) {
      return absl::InvalidArgumentError(absl::StrCat("a recorded tensor named ", Printable(name)));
    }
    if (r.batches.size() <= k) r.batches.resize(k + 1);
    return &r.batches[k];
  };
  for (Tensor& t : set.mutable_tensors()) {
    // What an attack scores must be numbers: a record is a file anyone may have altered.
    for (float v : t.values) {
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat("the recorded tensor ", Printable(t.name), " holds ", v));
      }
    }
    if (absl::StartsWith(t.name, "part/")) {
      RETURN_IF_ERROR(r.part.Add(Tensor{t.name.substr(5), t.shape, std::move(t.values)}));
    } else if (absl::StartsWith(t.name, "update/")) {
      RETURN_IF_ERROR(r.update.Add(Tensor{t.name.substr(7), t.shape, std::move(t.values)}));
    } else if (t.name == "cut") {
      if (t.values.size() != 1 || !(t.values[0] >= 1 && t.values[0] <= 100000)) {
        return absl::InvalidArgumentError("a recorded cut that is not one stage");
      }
      r.cut = static_cast<int>(t.values[0]);
    } else if (absl::StartsWith(t.name, "act/")) {
      ASSIGN_OR_RETURN(RecordedBatch * b, batch(t.name, 4));
      b->activations = std::move(t);
    } else if (absl::StartsWith(t.name, "labels/")) {
      ASSIGN_OR_RETURN(RecordedBatch * b, batch(t.name, 7));
      for (float v : t.values) {  // class or token ids, or a token without a target
        if ((v < 0 && v != kNoTarget) || v >= (1 << 24) || v != std::floor(v)) {
          return absl::InvalidArgumentError(
              absl::StrCat("the recorded ", t.name, " holds ", v, ", not a class or token id"));
        }
      }
      b->labels.assign(t.values.begin(), t.values.end());
    } else if (absl::StartsWith(t.name, "grad/")) {
      ASSIGN_OR_RETURN(RecordedBatch * b, batch(t.name, 5));
      b->gradient = std::move(t);
    } else if (absl::StartsWith(t.name, "recon/")) {
      ASSIGN_OR_RETURN(RecordedBatch * b, batch(t.name, 6));
      b->reconstruction = std::move(t);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("a recorded tensor named ", Printable(t.name)));
    }
  }
  for (const RecordedBatch& b : r.batches) {
    if (b.activations.shape.empty()) return absl::InvalidArgumentError("a recorded micro-batch without activations");
  }
  return r;
}

}  // namespace cleave
