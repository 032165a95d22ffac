// nf4: 4-bit NormalFloat (Dettmers et al. 2023, "QLoRA"), the codec of quantized frozen
// bases (model.quantize: nf4) and usable wherever a stateless codec is.
//
// A tensor's values, flattened, in blocks of 64: per block its absmax, and per value the
// index of the code (below) nearest to value / absmax, two indices a byte, the first in
// the low nibble. Encoding:
//   nf4     f32 absmax[blocks], u8 codes[ceil(n / 2)]
//   nf4:dq  double quantization of the absmax values (QLoRA section 3): f32 mean, per
//           group of 256 blocks an f32 scale (max |absmax - mean| / 127), per block an
//           int8 (absmax - mean) / scale rounded to nearest, then the codes. QLoRA stores
//           these as 8-bit floats; here they are linear int8 (0.127 bits a value fewer
//           than fp32 absmax, as in the paper: 32/64 -> 8/64 + 32/(64 * 256)).
#include <algorithm>
#include <array>
#include <cmath>

#include "compression/codec_internal.h"

namespace cleave {
namespace codec_internal {
namespace {

constexpr int64_t kBlock = 64;
constexpr int64_t kGroup = 256;  // blocks per second-level scale (nf4:dq)

// The NF4 data type: the quantiles of N(0, 1) normalised to [-1, 1] with an exact zero,
// as QLoRA and bitsandbytes define it (create_normal_map(offset=0.9677083)).
constexpr float kCodes[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f};

// The index of the code nearest to v (in [-1, 1]); a tie goes to the lower code.
uint8_t NearestCode(float v) {
  uint8_t lo = 0;
  for (uint8_t i = 1; i < 16; ++i) {
    if (v > 0.5f * (kCodes[i - 1] + kCodes[i])) lo = i;
  }
  return lo;
}

class Nf4Codec : public Codec {
 public:
  Nf4Codec(std::string name, bool double_quant) : Codec(std::move(name)), dq_(double_quant) {}

  static int64_t Blocks(const Shape& shape) { return (NumElements(shape) + kBlock - 1) / kBlock; }
  static int64_t Groups(int64_t blocks) { return (blocks + kGroup - 1) / kGroup; }
  // Bytes before the codes.
  int64_t ScalesSize(const Shape& shape) const {
    const int64_t b = Blocks(shape);
    return dq_ ? 4 + 4 * Groups(b) + b : 4 * b;
  }
  int64_t EncodedSize(const Shape& shape) const override {
    return ScalesSize(shape) + (NumElements(shape) + 1) / 2;
  }

  void Encode(int, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape), blocks = Blocks(shape);
    char* p = Grow(out, EncodedSize(shape));
    std::vector<float> absmax(blocks);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
      float m = 0;
      for (int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(in[i]));
      absmax[b] = m;
    }
    if (dq_) {
      // The values are quantized against the absmax they will decode to.
      double sum = 0;
      for (float a : absmax) sum += a;
      const float mean = blocks > 0 ? static_cast<float>(sum / blocks) : 0.0f;
      std::memcpy(p, &mean, 4);
      const int64_t groups = Groups(blocks);
      auto* q = reinterpret_cast<int8_t*>(p + 4 + 4 * groups);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t begin = g * kGroup, end = std::min(blocks, begin + kGroup);
        float dev = 0;
        for (int64_t b = begin; b < end; ++b) dev = std::max(dev, std::fabs(absmax[b] - mean));
        const float scale = dev / 127.0f;
        std::memcpy(p + 4 + 4 * g, &scale, 4);
        for (int64_t b = begin; b < end; ++b) {
          const float level = scale > 0 ? std::nearbyint((absmax[b] - mean) / scale) : 0.0f;
          q[b] = static_cast<int8_t>(std::clamp(level, -127.0f, 127.0f));
          absmax[b] = q[b] * scale + mean;
        }
      }
    } else {
      std::memcpy(p, absmax.data(), 4 * blocks);
    }
    auto* codes = reinterpret_cast<uint8_t*>(p + ScalesSize(shape));
    std::fill(codes, codes + (n + 1) / 2, 0);
    for (int64_t i = 0; i < n; ++i) {
      const float a = absmax[i / kBlock];
      const uint8_t c = a > 0 ? NearestCode(std::clamp(in[i] / a, -1.0f, 1.0f)) : 7;
      codes[i / 2] |= i % 2 ? c << 4 : c;
    }
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    const int64_t n = NumElements(shape), blocks = Blocks(shape);
    if (n % 2 == 1 && (static_cast<uint8_t>(bytes.back()) >> 4) != 0) {
      return absl::InvalidArgumentError(name() + " padding bits are not zero");
    }
    if (!dq_) {
      for (int64_t b = 0; b < blocks; ++b) RETURN_IF_ERROR(CheckScale(Get<float>(bytes.data() + 4 * b), 1.0f, name()));
      return absl::OkStatus();
    }
    const float mean = Get<float>(bytes.data());
    if (!std::isfinite(mean)) return absl::InvalidArgumentError(name() + " mean is not a finite number");
    for (int64_t g = 0; g < Groups(blocks); ++g) {
      const float scale = Get<float>(bytes.data() + 4 + 4 * g);
      RETURN_IF_ERROR(CheckScale(scale, 127.0f, name()));
      if (!std::isfinite(127.0f * scale + std::fabs(mean))) {
        return absl::InvalidArgumentError(name() + " absmax is not finite");
      }
    }
    return absl::OkStatus();
  }

  void DecodeRange(std::string_view bytes, const Shape& shape, int64_t begin, int64_t count,
                   float* out) const override {
    // Each byte's two values at once, from a table of code pairs.
    static const auto* pairs = [] {
      auto* t = new std::array<std::array<float, 2>, 256>();
      for (int b = 0; b < 256; ++b) (*t)[b] = {kCodes[b & 15], kCodes[b >> 4]};
      return t;
    }();
    const int64_t blocks = Blocks(shape);
    const auto* codes = reinterpret_cast<const uint8_t*>(bytes.data() + ScalesSize(shape));
    for (int64_t i = begin; i < begin + count;) {
      const int64_t b = i / kBlock, end = std::min(begin + count, (b + 1) * kBlock);
      const float a = Absmax(bytes, blocks, b);
      if (i % 2 == 1) {
        out[i - begin] = kCodes[codes[i / 2] >> 4] * a;
        ++i;
      }
      for (; i + 1 < end; i += 2) {
        const auto& p = (*pairs)[codes[i / 2]];
        out[i - begin] = p[0] * a;
        out[i - begin + 1] = p[1] * a;
      }
      if (i < end) {
        out[i - begin] = kCodes[codes[i / 2] & 15] * a;
        ++i;
      }
    }
  }

 private:
  float Absmax(std::string_view bytes, int64_t blocks, int64_t b) const {
    if (!dq_) return Get<float>(bytes.data() + 4 * b);
    const float mean = Get<float>(bytes.data());
    const float scale = Get<float>(bytes.data() + 4 + 4 * (b / kGroup));
    const auto* q = reinterpret_cast<const int8_t*>(bytes.data() + 4 + 4 * Groups(blocks));
    return q[b] * scale + mean;
  }

  const bool dq_;
};

}  // namespace

StatusOr<std::unique_ptr<Codec>> MakeNf4(const CodecSpec& s) {
  if (!(s.arg.empty() || s.arg == "dq")) {
    return absl::InvalidArgumentError(absl::StrCat("codec ", s.spec, ": nf4 takes [:dq]"));
  }
  return std::unique_ptr<Codec>(new Nf4Codec(s.spec, s.arg == "dq"));
}

}  // namespace codec_internal
}  // namespace cleave
