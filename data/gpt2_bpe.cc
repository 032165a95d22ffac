#include "data/gpt2_bpe.h"

#include <nlohmann/json.hpp>

#include <climits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "data/byte_level.h"

namespace cleave {
namespace {

enum class Kind { kLetter, kNumber, kSpace, kOther };

Kind KindOf(uint32_t cp) {
  if (cp == ' ' || (cp >= '\t' && cp <= '\r') || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
      (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
      cp == 0x205F || cp == 0x3000) {
    return Kind::kSpace;
  }
  if (cp >= '0' && cp <= '9') return Kind::kNumber;
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp >= 0x80) return Kind::kLetter;
  return Kind::kOther;
}

}  // namespace

std::vector<std::string> Gpt2Bpe::PreTokenize(const std::string& text) {
  struct Char {
    size_t begin, end;
    Kind kind;
  };
  std::vector<Char> cs;
  for (size_t i = 0; i < text.size();) {
    const size_t b = i;
    const uint32_t cp = NextCodePoint(text, i);
    cs.push_back({b, i, KindOf(cp)});
  }
  std::vector<std::string> out;
  auto piece = [&](size_t from, size_t to) {  // characters [from, to)
    out.push_back(text.substr(cs[from].begin, cs[to - 1].end - cs[from].begin));
  };
  size_t i = 0;
  while (i < cs.size()) {
    // 's 't 're 've 'm 'll 'd
    if (text[cs[i].begin] == '\'' && i + 1 < cs.size()) {
      const std::string rest = text.substr(cs[i + 1].begin, 2);
      const size_t two = rest.size() == 2 && (rest == "re" || rest == "ve" || rest == "ll") ? 2 : 0;
      const size_t one = two == 0 && (rest[0] == 's' || rest[0] == 't' || rest[0] == 'm' ||
                                      rest[0] == 'd') ? 1 : 0;
      if (two + one > 0) {
        piece(i, i + 1 + two + one);
        i += 1 + two + one;
        continue;
      }
    }
    // An optional space, then a run of letters, of numbers, or of other characters.
    size_t j = i;
    if (text[cs[j].begin] == ' ' && j + 1 < cs.size() && cs[j + 1].kind != Kind::kSpace) ++j;
    const Kind k = cs[j].kind;
    if (k != Kind::kSpace) {
      size_t e = j + 1;
      while (e < cs.size() && cs[e].kind == k) ++e;
      piece(i, e);
      i = e;
      continue;
    }
    // Spaces: \s+(?!\S) leaves the last one to the next piece when a non-space follows.
    size_t e = i;
    while (e < cs.size() && cs[e].kind == Kind::kSpace) ++e;
    if (e < cs.size() && e - i > 1) --e;
    piece(i, e);
    i = e;
  }
  return out;
}

StatusOr<std::unique_ptr<Gpt2Bpe>> Gpt2Bpe::Load(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string vocab, ReadFile(dir + "/vocab.json"));
  ASSIGN_OR_RETURN(std::string merges, ReadFile(dir + "/merges.txt"));
  return FromStrings(vocab, merges, dir);
}

StatusOr<std::unique_ptr<Gpt2Bpe>> Gpt2Bpe::FromStrings(const std::string& vocab_json,
                                                        const std::string& merges,
                                                        const std::string& what) {
  auto bpe = std::make_unique<Gpt2Bpe>();
  const auto j = nlohmann::json::parse(vocab_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(what + "/vocab.json: not a JSON object of symbol: id");
  }
  for (const auto& [symbol, id] : j.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "/vocab.json: symbol \"", symbol, "\" has no id in [0, 2^24)"));
    }
    const auto n = id.get<int32_t>();
    bpe->ids_[symbol] = n;
    if (n >= static_cast<int32_t>(bpe->symbols_.size())) bpe->symbols_.resize(n + 1);
    bpe->symbols_[n] = symbol;
  }
  bpe->vocab_size_ = static_cast<int>(bpe->symbols_.size());
  if (auto it = bpe->ids_.find("<|endoftext|>"); it != bpe->ids_.end()) bpe->eos_ = it->second;
  std::istringstream in(merges);
  std::string line;
  int rank = 0;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "/merges.txt:", n, ": expected two symbols separated by a space"));
    }
    bpe->ranks_.emplace(std::make_pair(line.substr(0, space), line.substr(space + 1)), rank++);
  }
  return bpe;
}

std::vector<std::string> Gpt2Bpe::Bpe(const std::string& word) const {
  std::vector<std::string> parts;  // one symbol per UTF-8 character, to start
  for (size_t i = 0; i < word.size();) {
    const size_t b = i;
    NextCodePoint(word, i);
    parts.push_back(word.substr(b, i - b));
  }
  return MergeByRank(std::move(parts), [this](const std::string& a, const std::string& b) {
    const auto it = ranks_.find({a, b});
    return it == ranks_.end() ? -1 : it->second;
  });
}

StatusOr<std::vector<int32_t>> Gpt2Bpe::Encode(const std::string& text) const {
  const auto& table = ByteToCodePoint();
  std::vector<int32_t> ids;
  for (const std::string& piece : PreTokenize(text)) {
    std::string mapped;  // each byte as its GPT-2 symbol, UTF-8 encoded
    for (unsigned char b : piece) AppendUtf8(table[b], mapped);
    for (const std::string& symbol : Bpe(mapped)) {
      const auto it = ids_.find(symbol);
      if (it == ids_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the GPT-2 vocabulary has no symbol \"", symbol, "\""));
      }
      ids.push_back(it->second);
    }
  }
  return ids;
}

std::string Gpt2Bpe::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    const std::string& symbol = symbols_[id];
    if (symbol == "<|endoftext|>") continue;
    for (size_t i = 0; i < symbol.size();) {
      const int byte = ByteOfCodePoint(NextCodePoint(symbol, i));
      if (byte >= 0) out.push_back(static_cast<char>(byte));
    }
  }
  return out;
}

}  // namespace cleave
