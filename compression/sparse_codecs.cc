// The sparse and low-rank codecs with error feedback: topk (and EF21), randk, sign
// (signSGD with error feedback) and powersgd (compression/codec.h describes each).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compression/codec_internal.h"
#include "compression/kernels.h"

namespace cleave {
namespace codec_internal {
namespace {

// Codecs with error feedback: Encode adds the slot's residual to its input first, and
// keeps what the encoding does not carry.
class ErrorFeedbackCodec : public Codec {
 public:
  using Codec::Codec;
  std::vector<float> Residual(int slot) const override {
    auto it = residual_.find(slot);
    return it == residual_.end() ? std::vector<float>() : it->second;
  }
  bool stateful() const override { return true; }

 protected:
  // The slot's residual, n values.
  std::vector<float>& Slot(int slot, int64_t n) {
    std::vector<float>& v = residual_[slot];
    v.resize(n, 0.0f);
    return v;
  }
  // The slot's residual plus `in`: what is owed. The caller leaves in it what stays owed.
  std::vector<float>& Owed(int slot, const float* in, int64_t n) {
    std::vector<float>& v = Slot(slot, n);
    kernels::Add(v.data(), in, n);
    return v;
  }

 private:
  std::map<int, std::vector<float>> residual_;
};

int64_t KOf(double fraction, int64_t n) {
  return n == 0 ? 0 : std::clamp<int64_t>(static_cast<int64_t>(std::ceil(fraction * n)), 1, n);
}

// Adds `in` to `v` (what is owed) and returns the indices of the k values of largest
// magnitude in the sum, increasing. A threshold from a strided sample keeps the
// candidates few; if it keeps fewer than k, all values are candidates.
// `mask` is scratch space.
std::vector<uint32_t> AddAndFindTop(std::vector<float>& v, const float* in, int64_t k,
                                    std::vector<uint8_t>& mask) {
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<uint32_t> idx;
  if (n > (1 << 16) && 8 * k < n) {
    const int64_t m = 1 << 12, stride = n / m;
    std::vector<float> sample(m);
    for (int64_t j = 0; j < m; ++j) sample[j] = std::abs(v[j * stride] + in[j * stride]);
    // Aim for twice k candidates (and at least 64 sampled above the threshold).
    const int64_t want = std::min<int64_t>(m - 1, std::max<int64_t>(64, 2 * k * m / n));
    std::nth_element(sample.begin(), sample.begin() + want, sample.end(), std::greater<float>());
    mask.resize((n + 7) / 8);
    kernels::AddAboveMask(v.data(), in, n, sample[want], mask.data());
    idx.reserve(4 * k);
    for (int64_t b = 0; b < static_cast<int64_t>(mask.size()); ++b) {
      for (uint8_t bits = mask[b]; bits != 0; bits &= bits - 1) {
        idx.push_back(static_cast<uint32_t>(8 * b + __builtin_ctz(bits)));
      }
    }
  } else {
    kernels::Add(v.data(), in, n);
  }
  if (static_cast<int64_t>(idx.size()) < k) {
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), 0u);
  }
  if (k == 0) return {};
  // The k-th largest magnitude among the candidates; then, in index order, every
  // candidate above it and as many equal to it as make k.
  std::vector<float> mags(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) {
    const float m = std::abs(v[idx[j]]);
    mags[j] = m == m ? m : std::numeric_limits<float>::infinity();  // NaN first: it must show
  }
  std::vector<float> order = mags;
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), std::greater<float>());
  const float kth = order[k - 1];
  int64_t ties = k;
  for (float m : mags) ties -= m > kth;
  std::vector<uint32_t> top;
  top.reserve(k);
  for (size_t j = 0; j < idx.size(); ++j) {
    if (mags[j] > kth || (mags[j] == kth && ties-- > 0)) top.push_back(idx[j]);
  }
  return top;
}

// Top-k: u32 k, k u32 indices (increasing), k float32 values.
class TopKCodec : public ErrorFeedbackCodec {
 public:
  // How what is not sent is kept: classic error feedback, EF21's estimate, or not at all
  // (stateless: each call sends the top k of its input alone).
  enum class Feedback { kClassic, kEf21, kNone };
  TopKCodec(std::string name, double fraction, Feedback feedback)
      : ErrorFeedbackCodec(std::move(name)), fraction_(fraction), feedback_(feedback) {}
  bool stateful() const override { return feedback_ != Feedback::kNone; }
  int64_t EncodedSize(const Shape& shape) const override {
    return 4 + 8 * KOf(fraction_, NumElements(shape));
  }

  void Encode(int slot, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape), k = KOf(fraction_, n);
    // Classic error feedback: v, the slot's state, is the residual, and the top k of
    // residual + in are sent. EF21: v is the estimate h of this client's update that the
    // server tracks too (the sum of all sent so far); the top k of in - h are sent and
    // added to h. Without feedback: the top k of in, and no state.
    std::vector<float>* v = stateful() ? &Slot(slot, n) : nullptr;
    std::vector<float>* owed = v;
    if (feedback_ == Feedback::kNone) {
      scratch_.assign(n, 0.0f);
      owed = &scratch_;
    } else if (feedback_ == Feedback::kEf21) {
      scratch_.resize(n);
      for (int64_t i = 0; i < n; ++i) scratch_[i] = -(*v)[i];
      owed = &scratch_;
    }
    const std::vector<uint32_t> idx = AddAndFindTop(*owed, in, k, mask_);
    char* p = Grow(out, 4 + 8 * k);
    const auto count = static_cast<uint32_t>(k);
    std::memcpy(p, &count, 4);
    std::memcpy(p + 4, idx.data(), 4 * k);
    for (int64_t j = 0; j < k; ++j) {
      const float sent = (*owed)[idx[j]];
      std::memcpy(p + 4 + 4 * k + 4 * j, &sent, 4);
      if (v == nullptr) continue;
      if (feedback_ == Feedback::kEf21) {
        (*v)[idx[j]] += sent;
      } else {
        (*v)[idx[j]] = 0.0f;  // sent: nothing of it is owed any more
      }
    }
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    const int64_t n = NumElements(shape);
    if (bytes.size() < 4) return absl::InvalidArgumentError(name() + " encoding without a count");
    const int64_t k = Get<uint32_t>(bytes.data());
    if (k > n) return absl::InvalidArgumentError(absl::StrCat(name(), " sends ", k, " of ", n, " values"));
    if (k != KOf(fraction_, n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), " sends ", k, " values, expected ", KOf(fraction_, n)));
    }
    RETURN_IF_ERROR(Length(bytes, 4 + 8 * k, name()));
    const char* p = bytes.data() + 4;
    for (int64_t j = 0; j < k; ++j) {
      const uint32_t i = Get<uint32_t>(p + 4 * j);
      if (i >= n || (j > 0 && i <= Get<uint32_t>(p + 4 * (j - 1)))) {
        return absl::InvalidArgumentError(absl::StrCat(
            name(), " index ", i, " is out of range or not increasing (n = ", n, ")"));
      }
    }
    return FiniteFloats(p + 4 * k, k, name() + " value");
  }

  void DecodeRange(std::string_view bytes, const Shape&, int64_t begin, int64_t count,
                   float* out) const override {
    const int64_t k = Get<uint32_t>(bytes.data());
    const char* idx = bytes.data() + 4;
    const char* values = idx + 4 * k;
    std::fill(out, out + count, 0.0f);
    // The first index >= begin (indices increase).
    int64_t lo = 0, hi = k;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (Get<uint32_t>(idx + 4 * mid) < begin) lo = mid + 1; else hi = mid;
    }
    for (int64_t j = lo; j < k; ++j) {
      const int64_t i = Get<uint32_t>(idx + 4 * j);
      if (i >= begin + count) break;
      out[i - begin] = Get<float>(values + 4 * j);
    }
  }

 private:
  const double fraction_;
  const Feedback feedback_;
  std::vector<uint8_t> mask_;   // scratch, kept across calls
  std::vector<float> scratch_;  // EF21: in - h; without feedback: in
};

// Random-k: u64 seed, then k float32 values, value j at Position(seed, j) in stride j.
class RandKCodec : public ErrorFeedbackCodec {
 public:
  RandKCodec(std::string name, double fraction, uint64_t seed)
      : ErrorFeedbackCodec(std::move(name)), fraction_(fraction), rng_(seed) {}
  int64_t EncodedSize(const Shape& shape) const override {
    return 8 + 4 * KOf(fraction_, NumElements(shape));
  }

  // Stride j is [j n / k, (j + 1) n / k); never empty since k <= n.
  static int64_t Position(uint64_t seed, int64_t j, int64_t n, int64_t k) {
    const int64_t start = j * n / k, len = (j + 1) * n / k - start;
    return start + static_cast<int64_t>(SplitMix64(seed ^ SplitMix64(j)) % len);
  }

  void Encode(int slot, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape), k = KOf(fraction_, n);
    std::vector<float>& v = Owed(slot, in, n);
    const uint64_t seed = rng_();
    char* p = Grow(out, 8 + 4 * k);
    std::memcpy(p, &seed, 8);
    for (int64_t j = 0; j < k; ++j) {
      float& x = v[Position(seed, j, n, k)];
      std::memcpy(p + 8 + 4 * j, &x, 4);
      x = 0.0f;
    }
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    return FiniteFloats(bytes.data() + 8, KOf(fraction_, NumElements(shape)), name() + " value");
  }

  void DecodeRange(std::string_view bytes, const Shape& shape, int64_t begin, int64_t count,
                   float* out) const override {
    const int64_t n = NumElements(shape), k = KOf(fraction_, n);
    const uint64_t seed = Get<uint64_t>(bytes.data());
    std::fill(out, out + count, 0.0f);
    if (count == 0) return;
    // The strides that hold positions begin and begin + count - 1: stride j starts at or
    // before i when j <= ceil((i + 1) k / n) - 1.
    auto stride_of = [&](int64_t i) { return ((i + 1) * k + n - 1) / n - 1; };
    for (int64_t j = stride_of(begin); j <= stride_of(begin + count - 1); ++j) {
      const int64_t i = Position(seed, j, n, k);
      if (i >= begin && i < begin + count) out[i - begin] = Get<float>(bytes.data() + 8 + 4 * j);
    }
  }

 private:
  const double fraction_;
  std::mt19937_64 rng_;
};

// Scaled sign: float32 scale (mean |x| of what is owed), then one bit a value (1 =
// negative), the last byte zero-padded.
class SignCodec : public ErrorFeedbackCodec {
 public:
  SignCodec() : ErrorFeedbackCodec("sign") {}
  int64_t EncodedSize(const Shape& shape) const override {
    return 4 + PackedSize(NumElements(shape), 1);
  }

  void Encode(int slot, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape);
    std::vector<float>& v = Owed(slot, in, n);
    const float scale = n == 0 ? 0.0f : static_cast<float>(kernels::SumAbs(v.data(), n) / n);
    char* p = Grow(out, EncodedSize(shape));
    std::memcpy(p, &scale, 4);
    kernels::SignEncode(v.data(), n, scale, reinterpret_cast<uint8_t*>(p + 4));
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    RETURN_IF_ERROR(CheckScale(Get<float>(bytes.data()), 1.0f, name()));
    const int64_t n = NumElements(shape);
    return n == 0 ? absl::OkStatus() : PaddingIsZero(bytes.data() + 4, n, 1, bytes.size() - 4, name());
  }

  void DecodeRange(std::string_view bytes, const Shape&, int64_t begin, int64_t count,
                   float* out) const override {
    kernels::SignDecode(reinterpret_cast<const uint8_t*>(bytes.data() + 4), begin, count,
                        Get<float>(bytes.data()), out);
  }
};

// PowerSGD: P (rows x r, row-major) then Q^T (r x cols, row-major), float32; the tensor
// is P Q^T. Tensors where that is not smaller than rows x cols are float32.
class PowerSgdCodec : public ErrorFeedbackCodec {
 public:
  PowerSgdCodec(std::string name, int rank, uint64_t seed)
      : ErrorFeedbackCodec(std::move(name)), r_(rank), rng_(seed) {}

  bool LowRank(const Shape& shape) const {
    if (shape.size() < 2) return false;
    const int64_t rows = Rows(shape), cols = NumElements(shape) / std::max<int64_t>(rows, 1);
    return r_ * (rows + cols) < rows * cols;
  }
  int64_t EncodedSize(const Shape& shape) const override {
    if (!LowRank(shape)) return 4 * NumElements(shape);
    return 4 * r_ * (Rows(shape) + NumElements(shape) / Rows(shape));
  }

  void Encode(int slot, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape);
    if (!LowRank(shape)) {
      out->append(reinterpret_cast<const char*>(in), 4 * n);
      return;
    }
    const int64_t rows = Rows(shape), cols = n / rows;
    std::vector<float>& m = Owed(slot, in, n);
    std::vector<float>& qt = warm_[slot];  // Q^T, r x cols: the warm start
    if (qt.empty()) qt.assign(r_ * cols, 0.0f);
    std::normal_distribution<float> normal;
    for (int c = 0; c < r_; ++c) {  // a fresh start for columns that collapsed to zero
      float* q = qt.data() + c * cols;
      if (std::all_of(q, q + cols, [](float x) { return x == 0.0f; })) {
        for (int64_t j = 0; j < cols; ++j) q[j] = normal(rng_);
      }
    }
    // P = M Q, columns orthonormalised (Gram-Schmidt, in double); Q^T = P^T M.
    std::vector<double> pd(rows * r_);
    for (int64_t i = 0; i < rows; ++i) {
      for (int c = 0; c < r_; ++c) {
        pd[i * r_ + c] = kernels::Dot(m.data() + i * cols, qt.data() + c * cols, cols);
      }
    }
    for (int c = 0; c < r_; ++c) {
      for (int d = 0; d < c; ++d) {
        double dot = 0;
        for (int64_t i = 0; i < rows; ++i) dot += pd[i * r_ + c] * pd[i * r_ + d];
        for (int64_t i = 0; i < rows; ++i) pd[i * r_ + c] -= dot * pd[i * r_ + d];
      }
      double norm = 0;
      for (int64_t i = 0; i < rows; ++i) norm += pd[i * r_ + c] * pd[i * r_ + c];
      norm = std::sqrt(norm);
      for (int64_t i = 0; i < rows; ++i) pd[i * r_ + c] = norm > 1e-12 ? pd[i * r_ + c] / norm : 0.0;
    }
    std::vector<float> p(pd.begin(), pd.end());
    std::fill(qt.begin(), qt.end(), 0.0f);
    for (int64_t i = 0; i < rows; ++i) {
      for (int c = 0; c < r_; ++c) {
        kernels::Axpy(qt.data() + c * cols, p[i * r_ + c], m.data() + i * cols, cols);
      }
    }
    char* o = Grow(out, EncodedSize(shape));
    std::memcpy(o, p.data(), 4 * p.size());
    std::memcpy(o + 4 * p.size(), qt.data(), 4 * qt.size());
    // What the decoder will compute, exactly (the same kernel): the rest stays owed.
    std::vector<float> sent(cols);
    for (int64_t i = 0; i < rows; ++i) {
      Row(p.data() + i * r_, o + 4 * p.size(), cols, 0, cols, sent.data());
      kernels::Subtract(m.data() + i * cols, sent.data(), cols);
    }
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    if (kernels::AllFinite(bytes.data(), bytes.size() / 4)) return absl::OkStatus();
    return FiniteFloats(bytes.data(), bytes.size() / 4, name() + " value");
  }

  void DecodeRange(std::string_view bytes, const Shape& shape, int64_t begin, int64_t count,
                   float* out) const override {
    if (!LowRank(shape)) {
      std::memcpy(out, bytes.data() + 4 * begin, 4 * count);
      return;
    }
    const int64_t rows = Rows(shape), cols = NumElements(shape) / rows;
    const char* qt = bytes.data() + 4 * rows * r_;
    float p[64];
    for (int64_t k = begin; k < begin + count;) {
      const int64_t i = k / cols, j0 = k % cols, j1 = std::min(cols, j0 + (begin + count - k));
      std::memcpy(p, bytes.data() + 4 * i * r_, 4 * r_);
      Row(p, qt, cols, j0, j1, out + (k - begin));
      k += j1 - j0;
    }
  }

 private:
  // out[j - j0] = sum_c p[c] Q^T[c][j] for j in [j0, j1).
  void Row(const float* p, const char* qt, int64_t cols, int64_t j0, int64_t j1, float* out) const {
    std::fill(out, out + (j1 - j0), 0.0f);
    for (int c = 0; c < r_; ++c) kernels::AxpyUnaligned(out, p[c], qt + 4 * (c * cols + j0), j1 - j0);
  }

  const int r_;
  std::mt19937_64 rng_;
  std::map<int, std::vector<float>> warm_;  // each slot's last Q^T
};

}  // namespace

StatusOr<std::unique_ptr<Codec>> MakeTopK(const CodecSpec& s) {
  CodecSpec fraction = s;
  TopKCodec::Feedback feedback = TopKCodec::Feedback::kClassic;
  for (const auto& [suffix, kind] : {std::pair<const char*, TopKCodec::Feedback>{":ef21", TopKCodec::Feedback::kEf21},
                                     {":noef", TopKCodec::Feedback::kNone}}) {
    if (absl::EndsWith(s.arg, suffix)) {
      fraction.arg.resize(fraction.arg.size() - std::strlen(suffix));
      feedback = kind;
    }
  }
  ASSIGN_OR_RETURN(double f, fraction.Fraction());
  return std::unique_ptr<Codec>(new TopKCodec(s.spec, f, feedback));
}

StatusOr<std::unique_ptr<Codec>> MakeRandK(const CodecSpec& s) {
  ASSIGN_OR_RETURN(double f, s.Fraction());
  return std::unique_ptr<Codec>(new RandKCodec(s.spec, f, s.seed));
}

StatusOr<std::unique_ptr<Codec>> MakeSign(const CodecSpec& s) {
  if (!s.arg.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("codec ", s.spec, " takes no parameter"));
  }
  return std::unique_ptr<Codec>(new SignCodec());
}

StatusOr<std::unique_ptr<Codec>> MakePowerSgd(const CodecSpec& s) {
  ASSIGN_OR_RETURN(int rank, s.Integer(1, 64));
  return std::unique_ptr<Codec>(new PowerSgdCodec(s.spec, rank, s.seed));
}

}  // namespace codec_internal
}  // namespace cleave
