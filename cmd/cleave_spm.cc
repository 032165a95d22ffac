// cleave-spm: SentencePiece in a process of its own. Debian's libsentencepiece carries
// its own copy of protobuf-lite and exports it; loaded beside libprotobuf (gRPC,
// LibTorch) the two copies' symbols collide and the process crashes at start. So the
// data library runs this helper (data/spm_bridge.cc), which links nothing but
// SentencePiece.
//   cleave-spm info MODEL          prints "vocab N eos E"
//   cleave-spm encode MODEL IN OUT  IN: records (u64 length, bytes); OUT: per record
//                                   u64 count, then count int32 ids
//   cleave-spm decode MODEL IN OUT  IN: u64 count, int32 ids; OUT: the text
//   cleave-spm train FLAG...        SentencePieceTrainer with spm_train's flags
// Exit status 0 on success; errors go to stderr.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace {

int Fail(const std::string& message) {
  std::cerr << "cleave-spm: " << message << "\n";
  return 1;
}

bool ReadAll(const char* path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

bool ReadU64(const std::string& in, size_t* pos, uint64_t* v) {
  if (in.size() - *pos < 8) return false;
  std::memcpy(v, in.data() + *pos, 8);
  *pos += 8;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "train") {
    std::string args;
    for (int i = 2; i < argc; ++i) args += std::string(i > 2 ? " " : "") + argv[i];
    const auto status = sentencepiece::SentencePieceTrainer::Train(args);
    return status.ok() ? 0 : Fail(status.ToString());
  }
  if (argc < 3) return Fail("usage: cleave-spm info|encode|decode MODEL [IN OUT] | train FLAG...");
  sentencepiece::SentencePieceProcessor sp;
  if (const auto status = sp.Load(argv[2]); !status.ok()) return Fail(status.ToString());
  if (command == "info") {
    std::cout << "vocab " << sp.GetPieceSize() << " eos " << sp.eos_id() << "\n";
    return 0;
  }
  if (argc != 5 || (command != "encode" && command != "decode")) return Fail("unknown command");
  std::string in;
  if (!ReadAll(argv[3], &in)) return Fail(std::string("cannot read ") + argv[3]);
  std::ofstream out(argv[4], std::ios::binary);
  size_t pos = 0;
  uint64_t n = 0;
  if (command == "encode") {
    while (pos < in.size()) {
      if (!ReadU64(in, &pos, &n) || in.size() - pos < n) return Fail("truncated record");
      std::vector<int> ids;
      if (const auto s = sp.Encode(std::string_view(in.data() + pos, n), &ids); !s.ok()) {
        return Fail(s.ToString());
      }
      pos += n;
      const uint64_t count = ids.size();
      out.write(reinterpret_cast<const char*>(&count), 8);
      std::vector<int32_t> ids32(ids.begin(), ids.end());
      out.write(reinterpret_cast<const char*>(ids32.data()), ids32.size() * 4);
    }
  } else {
    if (!ReadU64(in, &pos, &n) || (in.size() - pos) / 4 < n) return Fail("truncated ids");
    std::vector<int> ids(n);
    for (uint64_t i = 0; i < n; ++i) {
      int32_t id;
      std::memcpy(&id, in.data() + pos + 4 * i, 4);
      ids[i] = id;
    }
    out << sp.DecodeIds(ids);
  }
  return out ? 0 : Fail(std::string("cannot write ") + argv[4]);
}
