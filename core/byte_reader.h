// Reads fixed-size values (in the machine's byte order: the wire formats are
// little-endian, and so are the machines this runs on) and runs of bytes from a buffer,
// never past its end: the decoders of the wire formats (core/parameter_set.h,
// compression/quantized_set.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace cleave {

class ByteReader {
 public:
  explicit ByteReader(std::string_view b) : b_(b) {}
  // False, and nothing read, when fewer than sizeof(T) bytes remain.
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // The next `n` bytes, as a view into the buffer; false when fewer remain.
  bool GetBytes(uint64_t n, std::string_view* out) {
    if (b_.size() - pos_ < n) return false;
    *out = b_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return b_.size() - pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

}  // namespace cleave
