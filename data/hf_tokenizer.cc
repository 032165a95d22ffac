#include "data/hf_tokenizer.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>
#include <unicode/utf16.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "core/files.h"
#include "data/byte_level.h"

namespace cleave {
namespace {

using Json = nlohmann::json;

std::string ToUtf8(const icu::UnicodeString& u) {
  std::string s;
  u.toUTF8String(s);
  return s;
}

bool IsUtf8(const std::string& s) { return ToUtf8(icu::UnicodeString::fromUTF8(s)) == s; }

// Hugging Face's regexes run on Rust's engines, where \s is Unicode's White_Space (ICU's
// \s lacks U+000B and U+0085).
std::string WithRustSpaces(const std::string& p) {
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\' && i + 1 < p.size()) {
      if (p[i + 1] == 's' || p[i + 1] == 'S') {
        out += p[i + 1] == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
      } else {
        out += p.substr(i, 2);
      }
      ++i;
    } else {
      out.push_back(p[i]);
    }
  }
  return out;
}

using Regex = std::shared_ptr<icu::RegexPattern>;

StatusOr<Regex> Compile(const std::string& pattern, const std::string& what) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse;
  Regex re(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(WithRustSpaces(pattern)), 0, parse, status));
  if (U_FAILURE(status)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": regex ", pattern, " does not compile (",
                                                   u_errorName(status), " at offset ", parse.offset, ")"));
  }
  return re;
}

// The [begin, end) byte ranges of `re`'s matches in `s`.
std::vector<std::pair<size_t, size_t>> Matches(const icu::RegexPattern& re, const std::string& s) {
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  std::vector<size_t> byte_at(u.length() + 1, 0);  // UTF-16 index -> UTF-8 offset
  size_t bytes = 0;
  for (int32_t i = 0; i < u.length();) {
    const int32_t start = i;
    UChar32 c;
    U16_NEXT(u.getBuffer(), i, u.length(), c);
    for (int32_t k = start; k < i; ++k) byte_at[k] = bytes;
    bytes += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  }
  byte_at[u.length()] = bytes;
  std::vector<std::pair<size_t, size_t>> out;
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(re.matcher(u, status));
  while (U_SUCCESS(status) && m->find(status)) {
    const int32_t b = m->start(status), e = m->end(status);
    if (e > b) out.emplace_back(byte_at[b], byte_at[e]);
  }
  return out;
}

// Splits `s` at `matches`: the matches and the text between them (Isolated), or only the
// text between them (Removed).
std::vector<std::string> SplitAt(const std::string& s, const std::vector<std::pair<size_t, size_t>>& matches,
                                 bool keep_matches) {
  std::vector<std::string> out;
  size_t at = 0;
  for (const auto& [b, e] : matches) {
    if (b > at) out.push_back(s.substr(at, b - at));
    if (keep_matches) out.push_back(s.substr(b, e - b));
    at = e;
  }
  if (at < s.size()) out.push_back(s.substr(at));
  return out;
}

struct Step {
  std::string type;
  std::string a, b;                  // Prepend: a; Replace: a -> b; Metaspace: a = replacement
  Regex regex;                       // Replace / Split with a Regex pattern
  const icu::Normalizer2* unicode = nullptr;
  bool flag = false;                 // ByteLevel add_prefix_space; Digits individual; Metaspace split
  bool use_regex = false;            // ByteLevel
  bool keep_matches = true;          // Split: Isolated (true) or Removed
  std::string prepend_scheme = "always";  // Metaspace
  int start = 0, stop = 0;           // Strip
};

std::string Field(const Json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

// A pattern {"String": s} or {"Regex": r}.
Status ReadPattern(const Json& j, const std::string& what, Step& s) {
  if (!j.contains("pattern") || !j["pattern"].is_object()) return absl::InvalidArgumentError(what + ": pattern is missing");
  const Json& p = j["pattern"];
  if (p.contains("String")) {
    s.a = Field(p, "String");
  } else if (p.contains("Regex")) {
    ASSIGN_OR_RETURN(s.regex, Compile(Field(p, "Regex"), what));
  } else {
    return absl::InvalidArgumentError(what + ": pattern must be String or Regex");
  }
  return absl::OkStatus();
}

Status ReadSteps(const Json& j, const std::string& kind, const std::string& what, std::vector<Step>& out);

Status ReadStep(const Json& j, const std::string& kind, const std::string& what, std::vector<Step>& out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = Field(j, "type");
  const std::string where = absl::StrCat(what, ": ", kind, " ", type);
  if (type == "Sequence") {
    for (const char* key : {"normalizers", "pretokenizers", "decoders"}) {
      if (j.contains(key)) return ReadSteps(j[key], kind, what, out);
    }
    return absl::InvalidArgumentError(where + " has no list");
  }
  Step s;
  s.type = type;
  UErrorCode status = U_ZERO_ERROR;
  if (type == "NFC") s.unicode = icu::Normalizer2::getNFCInstance(status);
  if (type == "NFD") s.unicode = icu::Normalizer2::getNFDInstance(status);
  if (type == "NFKC") s.unicode = icu::Normalizer2::getNFKCInstance(status);
  if (type == "NFKD") s.unicode = icu::Normalizer2::getNFKDInstance(status);
  if (U_FAILURE(status)) return absl::InternalError(where + ": ICU has no such normalizer");
  const bool known =
      kind == "normalizer"
          ? (s.unicode != nullptr || type == "Prepend" || type == "Replace" || type == "Lowercase")
      : kind == "pre_tokenizer" ? (type == "Split" || type == "ByteLevel" || type == "Metaspace" || type == "Digits")
                                : (type == "ByteLevel" || type == "Replace" || type == "ByteFallback" ||
                                   type == "Fuse" || type == "Strip" || type == "Metaspace");
  if (!known) return absl::InvalidArgumentError(where + " is not supported");
  if (type == "Prepend") s.a = Field(j, "prepend");
  if (type == "Replace") {
    RETURN_IF_ERROR(ReadPattern(j, where, s));
    s.b = Field(j, "content");
  }
  if (type == "Split") {
    RETURN_IF_ERROR(ReadPattern(j, where, s));
    const std::string behavior = Field(j, "behavior");
    if ((behavior != "Isolated" && behavior != "Removed") || j.value("invert", false)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": behavior ", behavior,
                                                     " (Isolated or Removed, not inverted, are supported)"));
    }
    s.keep_matches = behavior == "Isolated";
  }
  if (type == "ByteLevel") {
    s.flag = j.value("add_prefix_space", false);
    s.use_regex = j.value("use_regex", true);
  }
  if (type == "Digits") s.flag = j.value("individual_digits", false);
  if (type == "Metaspace") {
    s.a = j.contains("replacement") ? Field(j, "replacement") : "\u2581";
    s.flag = j.value("split", true);
    s.prepend_scheme = j.contains("prepend_scheme") ? Field(j, "prepend_scheme")
                                                    : (j.value("add_prefix_space", true) ? "always" : "never");
  }
  if (type == "Strip") {
    s.a = Field(j, "content");
    s.start = j.value("start", 0);
    s.stop = j.value("stop", 0);
  }
  out.push_back(std::move(s));
  return absl::OkStatus();
}

Status ReadSteps(const Json& j, const std::string& kind, const std::string& what, std::vector<Step>& out) {
  if (!j.is_array()) return absl::InvalidArgumentError(absl::StrCat(what, ": a ", kind, " Sequence needs a list"));
  for (const Json& step : j) RETURN_IF_ERROR(ReadStep(step, kind, what, out));
  return absl::OkStatus();
}

const Regex& Gpt2Pattern() {
  static const Regex re = *Compile(
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "ByteLevel");
  return re;
}

std::vector<std::string> CodePoints(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    NextCodePoint(s, i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
};

}  // namespace

struct HfTokenizer::Impl {
  std::string what;
  std::vector<Step> normalizers, pre, decoders;
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> tokens;  // by id
  std::unordered_map<std::string, int> ranks;  // "a b" -> rank
  bool ignore_merges = false, byte_fallback = false, fuse_unk = false;
  int32_t unk = -1, eos = -1;
  std::vector<AddedToken> added;  // longest first
  std::vector<std::vector<const AddedToken*>> added_by_byte = std::vector<std::vector<const AddedToken*>>(256);
  std::vector<bool> special;      // by id
  std::vector<int32_t> prefix, suffix;  // EncodeText(special)
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // piece -> ids

  int32_t Id(const std::string& token) const {
    for (const AddedToken& t : added) {
      if (t.content == token) return t.id;
    }
    const auto it = vocab.find(token);
    return it == vocab.end() ? -1 : it->second;
  }

  // The text cut at added tokens: (segment, -1) or ("", the token's id).
  std::vector<std::pair<std::string, int32_t>> SplitAdded(const std::string& text) const {
    std::vector<std::pair<std::string, int32_t>> out;
    size_t at = 0, start = 0;
    while (at < text.size()) {
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : added_by_byte[static_cast<unsigned char>(text[at])]) {
        if (text.compare(at, t->content.size(), t->content) == 0) {
          hit = t;  // longest first
          break;
        }
      }
      if (hit == nullptr) {
        ++at;
        continue;
      }
      if (at > start) out.emplace_back(text.substr(start, at - start), -1);
      out.emplace_back("", hit->id);
      at += hit->content.size();
      start = at;
    }
    if (start < text.size()) out.emplace_back(text.substr(start), -1);
    return out;
  }

  std::string Normalize(std::string s) const {
    for (const Step& n : normalizers) {
      if (n.unicode != nullptr) {
        UErrorCode status = U_ZERO_ERROR;
        s = ToUtf8(n.unicode->normalize(icu::UnicodeString::fromUTF8(s), status));
      } else if (n.type == "Prepend") {
        if (!s.empty()) s = n.a + s;
      } else if (n.type == "Replace") {
        s = Replace(n, s);
      } else if (n.type == "Lowercase") {
        s = ToUtf8(icu::UnicodeString::fromUTF8(s).toLower(icu::Locale::getRoot()));
      }
    }
    return s;
  }

  static std::string Replace(const Step& n, const std::string& s) {
    if (!n.regex) return absl::StrReplaceAll(s, {{n.a, n.b}});
    std::string out;
    size_t at = 0;
    for (const auto& [b, e] : Matches(*n.regex, s)) {
      out += s.substr(at, b - at) + n.b;
      at = e;
    }
    return out + s.substr(at);
  }

  std::vector<std::string> PreTokenize(const std::string& s, size_t section) const {
    std::vector<std::string> pieces = {s};
    for (const Step& p : pre) {
      std::vector<std::string> next;
      for (std::string& piece : pieces) {
        for (std::string& q : PreTokenizeOne(p, std::move(piece), section)) next.push_back(std::move(q));
      }
      pieces = std::move(next);
    }
    return pieces;
  }

  static std::vector<std::string> PreTokenizeOne(const Step& p, std::string s, size_t section) {
    if (p.type == "Split") {
      if (p.regex) return SplitAt(s, Matches(*p.regex, s), p.keep_matches);
      std::vector<std::pair<size_t, size_t>> m;
      for (size_t at = s.find(p.a); !p.a.empty() && at != std::string::npos; at = s.find(p.a, at + p.a.size())) {
        m.emplace_back(at, at + p.a.size());
      }
      return SplitAt(s, m, p.keep_matches);
    }
    if (p.type == "ByteLevel") {
      if (p.flag && (s.empty() || s[0] != ' ')) s = " " + s;
      std::vector<std::string> parts = p.use_regex ? SplitAt(s, Matches(*Gpt2Pattern(), s), true)
                                                   : std::vector<std::string>{s};
      for (std::string& part : parts) part = ToByteSymbols(part);
      return parts;
    }
    if (p.type == "Digits") {
      std::vector<std::string> out;
      for (size_t i = 0; i < s.size();) {
        const bool digit = s[i] >= '0' && s[i] <= '9';
        size_t j = i + 1;
        while (j < s.size() && (s[j] >= '0' && s[j] <= '9') == digit && !(digit && p.flag)) ++j;
        out.push_back(s.substr(i, j - i));
        i = j;
      }
      return out;
    }
    // Metaspace: spaces become the replacement, which each piece then starts with.
    s = absl::StrReplaceAll(s, {{" ", p.a}});
    const bool prepend = p.prepend_scheme == "always" || (p.prepend_scheme == "first" && section == 0);
    if (prepend && s.compare(0, p.a.size(), p.a) != 0) s = p.a + s;
    if (!p.flag) return {s};
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t at = s.find(p.a, 1); at != std::string::npos; at = s.find(p.a, at + p.a.size())) {
      if (at > start) out.push_back(s.substr(start, at - start));
      start = at;
    }
    out.push_back(s.substr(start));
    return out;
  }

  static std::string ToByteSymbols(const std::string& s) {
    std::string out;
    for (unsigned char b : s) AppendUtf8(ByteToCodePoint()[b], out);
    return out;
  }

  Status Bpe(const std::string& piece, std::vector<int32_t>& ids) const {
    if (ignore_merges) {
      const auto it = vocab.find(piece);
      if (it != vocab.end()) {
        ids.push_back(it->second);
        return absl::OkStatus();
      }
    }
    {
      std::lock_guard<std::mutex> l(cache_mu);
      const auto it = cache.find(piece);
      if (it != cache.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return absl::OkStatus();
      }
    }
    const std::vector<std::string> parts =
        MergeByRank(CodePoints(piece), [this](const std::string& a, const std::string& b) {
          const auto it = ranks.find(a + " " + b);
          return it == ranks.end() ? -1 : it->second;
        });
    std::vector<int32_t> out;
    bool last_unk = false;
    for (const std::string& symbol : parts) {
      const auto it = vocab.find(symbol);
      if (it != vocab.end()) {
        out.push_back(it->second);
        last_unk = false;
        continue;
      }
      if (byte_fallback) {
        std::vector<int32_t> bytes;
        for (unsigned char b : symbol) {
          const auto bt = vocab.find(absl::StrFormat("<0x%02X>", b));
          if (bt == vocab.end()) break;
          bytes.push_back(bt->second);
        }
        if (bytes.size() == symbol.size()) {
          out.insert(out.end(), bytes.begin(), bytes.end());
          last_unk = false;
          continue;
        }
      }
      if (unk < 0) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": the vocabulary has no \"", symbol,
                                                       "\" and no unk_token or byte fallback"));
      }
      if (!(fuse_unk && last_unk)) out.push_back(unk);
      last_unk = true;
    }
    std::lock_guard<std::mutex> l(cache_mu);
    if (cache.size() < 200000) cache.emplace(piece, out);
    ids.insert(ids.end(), out.begin(), out.end());
    return absl::OkStatus();
  }

  std::vector<std::string> DecodeSteps(std::vector<std::string> t) const {
    for (const Step& d : decoders) {
      if (d.type == "ByteLevel") {
        std::string bytes;
        for (const std::string& token : t) {
          for (size_t i = 0; i < token.size();) {
            const size_t start = i;
            const int byte = ByteOfCodePoint(NextCodePoint(token, i));
            if (byte >= 0) {
              bytes.push_back(static_cast<char>(byte));
            } else {
              bytes += token.substr(start, i - start);
            }
          }
        }
        t = {bytes};
      } else if (d.type == "Replace") {
        for (std::string& token : t) token = Replace(d, token);
      } else if (d.type == "ByteFallback") {
        t = FuseBytes(t);
      } else if (d.type == "Fuse") {
        std::string all;
        for (const std::string& token : t) all += token;
        t = {all};
      } else if (d.type == "Strip") {
        for (std::string& token : t) {
          for (int k = 0; k < d.start && token.compare(0, d.a.size(), d.a) == 0 && !d.a.empty(); ++k) {
            token.erase(0, d.a.size());
          }
          for (int k = 0; k < d.stop && !d.a.empty() && token.size() >= d.a.size() &&
                          token.compare(token.size() - d.a.size(), d.a.size(), d.a) == 0;
               ++k) {
            token.erase(token.size() - d.a.size());
          }
        }
      } else if (d.type == "Metaspace") {
        for (size_t i = 0; i < t.size(); ++i) {
          t[i] = absl::StrReplaceAll(t[i], {{d.a, " "}});
          if (i == 0 && d.prepend_scheme != "never" && !t[i].empty() && t[i][0] == ' ') t[i].erase(0, 1);
        }
      }
    }
    return t;
  }

  // Runs of <0xAB> tokens become their bytes (U+FFFD for each when not UTF-8).
  static std::vector<std::string> FuseBytes(const std::vector<std::string>& t) {
    std::vector<std::string> out;
    std::string bytes;
    int count = 0;
    auto flush = [&] {
      if (count == 0) return;
      if (IsUtf8(bytes)) {
        out.push_back(bytes);
      } else {
        std::string bad;
        for (int k = 0; k < count; ++k) bad += "\uFFFD";
        out.push_back(bad);
      }
      bytes.clear();
      count = 0;
    };
    for (const std::string& token : t) {
      int value = 0;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' &&
          absl::SimpleHexAtoi(token.substr(3, 2), &value)) {
        bytes.push_back(static_cast<char>(value));
        ++count;
      } else {
        flush();
        out.push_back(token);
      }
    }
    flush();
    return out;
  }
};

namespace {

Status ReadModel(const Json& m, HfTokenizer::Impl& t) {
  const std::string where = t.what + ": model";
  if (Field(m, "type") != "BPE") {
    return absl::InvalidArgumentError(absl::StrCat(where, ".type ", Field(m, "type"), " is not supported (BPE)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!Field(m, key).empty()) return absl::InvalidArgumentError(absl::StrCat(where, ".", key, " is not supported"));
  }
  if (!m.contains("vocab") || !m["vocab"].is_object()) return absl::InvalidArgumentError(where + ".vocab must be an object");
  for (const auto& [token, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".vocab: ", token, " has no id in [0, 2^24)"));
    }
    t.vocab[token] = id.get<int32_t>();
  }
  const Json& merges = m.contains("merges") ? m["merges"] : Json::array();
  int rank = 0;
  for (const Json& merge : merges) {
    std::string key;
    if (merge.is_string()) {
      key = merge.get<std::string>();
      if (key.find(' ') == std::string::npos) return absl::InvalidArgumentError(absl::StrCat(where, ".merges[", rank, "] is not \"a b\""));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      key = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ".merges[", rank, "] is not a pair"));
    }
    t.ranks.emplace(key, rank++);
  }
  t.ignore_merges = m.value("ignore_merges", false);
  t.byte_fallback = m.value("byte_fallback", false);
  t.fuse_unk = m.value("fuse_unk", false);
  const std::string unk = Field(m, "unk_token");
  if (!unk.empty() && t.vocab.count(unk)) t.unk = t.vocab[unk];
  return absl::OkStatus();
}

// The special tokens `special` adds: the post-processor's template for one sequence, or
// tokenizer_config.json's add_bos_token / add_eos_token.
Status ReadSpecials(const Json& post, const Json& config, HfTokenizer::Impl& t) {
  std::vector<Json> processors;
  if (Field(post, "type") == "Sequence" && post.contains("processors")) {
    for (const Json& p : post["processors"]) processors.push_back(p);
  } else if (!post.is_null()) {
    processors.push_back(post);
  }
  for (const Json& p : processors) {
    if (Field(p, "type") != "TemplateProcessing" || !p.contains("single")) continue;
    bool after = false;
    for (const Json& piece : p["single"]) {
      if (piece.contains("Sequence")) {
        after = true;
      } else if (piece.contains("SpecialToken")) {
        const std::string name = Field(piece["SpecialToken"], "id");
        const int32_t id = t.Id(name);
        if (id < 0) return absl::InvalidArgumentError(absl::StrCat(t.what, ": post_processor names unknown token ", name));
        (after ? t.suffix : t.prefix).push_back(id);
      }
    }
    return absl::OkStatus();
  }
  auto token_of = [&](const char* key) -> std::string {
    if (!config.contains(key)) return "";
    const Json& v = config[key];
    return v.is_string() ? v.get<std::string>() : v.is_object() ? Field(v, "content") : "";
  };
  if (config.value("add_bos_token", false) && t.Id(token_of("bos_token")) >= 0) t.prefix.push_back(t.Id(token_of("bos_token")));
  if (config.value("add_eos_token", false) && t.Id(token_of("eos_token")) >= 0) t.suffix.push_back(t.Id(token_of("eos_token")));
  return absl::OkStatus();
}

}  // namespace

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& path) {
  namespace fs = std::filesystem;
  const bool dir = fs::is_directory(path);
  const std::string file = dir ? (fs::path(path) / "tokenizer.json").string() : path;
  ASSIGN_OR_RETURN(std::string json, ReadFile(file));
  const std::string config_path = (fs::path(file).parent_path() / "tokenizer_config.json").string();
  std::string config;
  if (fs::exists(config_path)) {
    ASSIGN_OR_RETURN(config, ReadFile(config_path));
  }
  return FromJson(json, config, file);
}

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(const std::string& json, const std::string& config_json,
                                                             const std::string& what) {
  const Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(what + ": not a JSON object");
  Json config = config_json.empty() ? Json::object() : Json::parse(config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object()) config = Json::object();
  auto t = std::make_unique<Impl>();
  t->what = what;
  if (!j.contains("model") || !j["model"].is_object()) return absl::InvalidArgumentError(what + ": model is missing");
  RETURN_IF_ERROR(ReadModel(j["model"], *t));
  RETURN_IF_ERROR(ReadStep(j.value("normalizer", Json()), "normalizer", what, t->normalizers));
  RETURN_IF_ERROR(ReadStep(j.value("pre_tokenizer", Json()), "pre_tokenizer", what, t->pre));
  RETURN_IF_ERROR(ReadStep(j.value("decoder", Json()), "decoder", what, t->decoders));
  int32_t size = 0;
  for (const auto& [token, id] : t->vocab) size = std::max(size, id + 1);
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const Json& a : j["added_tokens"]) {
      if (!a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() >= (1 << 24) || Field(a, "content").empty()) {
        return absl::InvalidArgumentError(what + ": added_tokens: each needs an id in [0, 2^24) and content");
      }
      t->added.push_back({a["id"].get<int32_t>(), Field(a, "content"), a.value("special", false)});
      size = std::max(size, t->added.back().id + 1);
    }
  }
  std::stable_sort(t->added.begin(), t->added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  t->tokens.assign(size, "");
  t->special.assign(size, false);
  for (const auto& [token, id] : t->vocab) t->tokens[id] = token;
  for (const AddedToken& a : t->added) {
    t->tokens[a.id] = a.content;
    t->special[a.id] = a.special;
    t->added_by_byte[static_cast<unsigned char>(a.content[0])].push_back(&a);
  }
  RETURN_IF_ERROR(ReadSpecials(j.value("post_processor", Json()), config, *t));
  const Json eos = config.value("eos_token", Json());
  t->eos = t->Id(eos.is_string() ? eos.get<std::string>() : eos.is_object() ? Field(eos, "content") : "");
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(t)));
}

int HfTokenizer::vocab_size() const { return static_cast<int>(impl_->tokens.size()); }
int HfTokenizer::eos_id() const { return impl_->eos; }

StatusOr<std::vector<int32_t>> HfTokenizer::EncodeText(const std::string& text, bool special) const {
  if (!IsUtf8(text)) return absl::InvalidArgumentError(impl_->what + ": the text is not UTF-8");
  std::vector<int32_t> ids;
  if (special) ids = impl_->prefix;
  size_t section = 0;
  for (const auto& [segment, id] : impl_->SplitAdded(text)) {
    if (id >= 0) {
      ids.push_back(id);
    } else {
      for (const std::string& piece : impl_->PreTokenize(impl_->Normalize(segment), section)) {
        if (!piece.empty()) RETURN_IF_ERROR(impl_->Bpe(piece, ids));
      }
    }
    ++section;
  }
  if (special) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

StatusOr<std::vector<std::vector<int32_t>>> HfTokenizer::Encode(const std::vector<std::string>& texts) const {
  std::vector<std::vector<int32_t>> out;
  for (const std::string& text : texts) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, EncodeText(text, false));
    out.push_back(std::move(ids));
  }
  return out;
}

StatusOr<std::string> HfTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || impl_->special[id]) continue;
    tokens.push_back(impl_->tokens[id]);
  }
  std::string out;
  for (const std::string& piece : impl_->DecodeSteps(std::move(tokens))) out += piece;
  return out;
}

}  // namespace cleave
