// Fuzzes the reassembly of chunked split tensors (proto/split_chunks.h) a server runs
// on every split stream: the input is a sequence of SplitUp messages, each a u16
// little-endian length and its bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "proto/split_chunks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cleave::ChunkAssembler<cleave::v1::SplitUp> in(1 << 16);
  size_t pos = 0;
  while (pos + 2 <= size) {
    const size_t n = data[pos] | (size_t{data[pos + 1]} << 8);
    pos += 2;
    if (n > size - pos) break;
    cleave::v1::SplitUp msg;
    if (!msg.ParseFromArray(data + pos, static_cast<int>(n))) break;
    pos += n;
    auto whole = in.Add(std::move(msg));
    if (!whole.ok()) break;  // the server ends the stream
    if (whole->has_value()) {
      int64_t seq = 0;
      const cleave::v1::TensorData* t = cleave::SplitTensor(**whole, &seq);
      if (t != nullptr && t->more()) std::abort();  // a whole message is never partial
    }
  }
  return 0;
}
