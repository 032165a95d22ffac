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
#include "core/json.h"
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

// How long one search for a regex's next match may run, in ICU's steps of its match
// engine (about a millisecond each), and how much memory its backtracking may take: a
// pattern that backtracks without end, such as (a+)+$, fails instead of hanging.
constexpr int32_t kRegexTimeLimit = 2000;
constexpr int32_t kRegexStackLimit = 8 << 20;

// The [begin, end) byte ranges of `re`'s matches in `s`; INVALID_ARGUMENT naming `what`
// and the pattern when a search runs past the limits.
StatusOr<std::vector<std::pair<size_t, size_t>>> Matches(const icu::RegexPattern& re, const std::string& s,
                                                         const std::string& what) {
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
  if (U_SUCCESS(status)) m->setTimeLimit(kRegexTimeLimit, status);
  if (U_SUCCESS(status)) m->setStackLimit(kRegexStackLimit, status);
  while (U_SUCCESS(status) && m->find(status)) {
    const int32_t b = m->start(status), e = m->end(status);
    if (e > b) out.emplace_back(byte_at[b], byte_at[e]);
  }
  if (U_FAILURE(status)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": regex ", ToUtf8(re.pattern()), " failed on a text of ", s.size(), " bytes (", u_errorName(status),
        status == U_REGEX_TIME_OUT ? ": it backtracks past the time limit" : "", ")"));
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
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

// j[key] as a T (bool, int or string), `def` when absent or null; INVALID_ARGUMENT naming
// `where` and the key for a value of another type (a tokenizer file is data nobody
// vetted: "yes" is not true).
template <typename T>
StatusOr<T> Get(const Json& j, const char* key, T def, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return def;
  const Json& v = j[key];
  if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) return v.get<bool>();
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, " must be true or false, not ", v.dump()));
  } else if constexpr (std::is_same_v<T, int>) {
    if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT_MAX) return v.get<int>();
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, " must be a whole number >= 0, not ", v.dump()));
  } else {
    if (v.is_string()) return v.get<std::string>();
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, " must be a string, not ", v.dump()));
  }
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
    ASSIGN_OR_RETURN(const bool invert, Get(j, "invert", false, where));
    if ((behavior != "Isolated" && behavior != "Removed") || invert) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": behavior ", behavior,
                                                     " (Isolated or Removed, not inverted, are supported)"));
    }
    s.keep_matches = behavior == "Isolated";
  }
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(s.flag, Get(j, "add_prefix_space", false, where));
    ASSIGN_OR_RETURN(s.use_regex, Get(j, "use_regex", true, where));
  }
  if (type == "Digits") {
    ASSIGN_OR_RETURN(s.flag, Get(j, "individual_digits", false, where));
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(s.a, Get<std::string>(j, "replacement", "\u2581", where));
    // Hugging Face's replacement is one character; an empty one would split nowhere.
    if (s.a.empty()) return absl::InvalidArgumentError(where + ": replacement must not be empty");
    ASSIGN_OR_RETURN(s.flag, Get(j, "split", true, where));
    ASSIGN_OR_RETURN(const bool prefix, Get(j, "add_prefix_space", true, where));
    ASSIGN_OR_RETURN(s.prepend_scheme, Get<std::string>(j, "prepend_scheme", prefix ? "always" : "never", where));
  }
  if (type == "Strip") {
    ASSIGN_OR_RETURN(s.a, Get<std::string>(j, "content", "", where));
    ASSIGN_OR_RETURN(s.start, Get(j, "start", 0, where));
    ASSIGN_OR_RETURN(s.stop, Get(j, "stop", 0, where));
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

  StatusOr<std::string> Normalize(std::string s) const {
    for (const Step& n : normalizers) {
      if (n.unicode != nullptr) {
        UErrorCode status = U_ZERO_ERROR;
        s = ToUtf8(n.unicode->normalize(icu::UnicodeString::fromUTF8(s), status));
      } else if (n.type == "Prepend") {
        if (!s.empty()) s = n.a + s;
      } else if (n.type == "Replace") {
        ASSIGN_OR_RETURN(s, Replace(n, s, what));
      } else if (n.type == "Lowercase") {
        s = ToUtf8(icu::UnicodeString::fromUTF8(s).toLower(icu::Locale::getRoot()));
      }
    }
    return s;
  }

  static StatusOr<std::string> Replace(const Step& n, const std::string& s, const std::string& what) {
    if (!n.regex) return absl::StrReplaceAll(s, {{n.a, n.b}});
    std::string out;
    size_t at = 0;
    ASSIGN_OR_RETURN(const auto matches, Matches(*n.regex, s, what));
    for (const auto& [b, e] : matches) {
      out += s.substr(at, b - at) + n.b;
      at = e;
    }
    return out + s.substr(at);
  }

  StatusOr<std::vector<std::string>> PreTokenize(const std::string& s, size_t section) const {
    std::vector<std::string> pieces = {s};
    for (const Step& p : pre) {
      std::vector<std::string> next;
      for (std::string& piece : pieces) {
        ASSIGN_OR_RETURN(std::vector<std::string> parts, PreTokenizeOne(p, std::move(piece), section, what));
        for (std::string& q : parts) next.push_back(std::move(q));
      }
      pieces = std::move(next);
    }
    return pieces;
  }

  static StatusOr<std::vector<std::string>> PreTokenizeOne(const Step& p, std::string s, size_t section,
                                                          const std::string& what) {
    if (p.type == "Split") {
      if (p.regex) {
        ASSIGN_OR_RETURN(const auto matches, Matches(*p.regex, s, what));
        return SplitAt(s, matches, p.keep_matches);
      }
      std::vector<std::pair<size_t, size_t>> m;
      for (size_t at = s.find(p.a); !p.a.empty() && at != std::string::npos; at = s.find(p.a, at + p.a.size())) {
        m.emplace_back(at, at + p.a.size());
      }
      return SplitAt(s, m, p.keep_matches);
    }
    if (p.type == "ByteLevel") {
      if (p.flag && (s.empty() || s[0] != ' ')) s = " " + s;
      std::vector<std::string> parts = {s};
      if (p.use_regex) {
        ASSIGN_OR_RETURN(const auto matches, Matches(*Gpt2Pattern(), s, what));
        parts = SplitAt(s, matches, true);
      }
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
    if (!p.flag) return std::vector<std::string>{s};
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

  StatusOr<std::vector<std::string>> DecodeSteps(std::vector<std::string> t) const {
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
        for (std::string& token : t) {
          ASSIGN_OR_RETURN(token, Replace(d, token, what));
        }
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
  ASSIGN_OR_RETURN(t.ignore_merges, Get(m, "ignore_merges", false, where));
  ASSIGN_OR_RETURN(t.byte_fallback, Get(m, "byte_fallback", false, where));
  ASSIGN_OR_RETURN(t.fuse_unk, Get(m, "fuse_unk", false, where));
  const std::string unk = Field(m, "unk_token");
  if (!unk.empty() && t.vocab.count(unk)) t.unk = t.vocab[unk];
  return absl::OkStatus();
}

// The special tokens `special` adds: the post-processor's template for one sequence, or
// tokenizer_config.json's add_bos_token / add_eos_token.
Status ReadSpecials(const Json& post, const Json& config, HfTokenizer::Impl& t) {
  std::vector<Json> processors;
  if (Field(post, "type") == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (const Json& p : post["processors"]) processors.push_back(p);
  } else if (!post.is_null()) {
    processors.push_back(post);
  }
  for (const Json& p : processors) {
    if (Field(p, "type") != "TemplateProcessing" || !p.contains("single") || !p["single"].is_array()) continue;
    bool after = false;
    for (const Json& piece : p["single"]) {
      if (!piece.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(t.what, ": post_processor: single holds ", piece.dump()));
      }
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
  const std::string where = t.what + ": tokenizer_config.json";
  ASSIGN_OR_RETURN(const bool add_bos, Get(config, "add_bos_token", false, where));
  ASSIGN_OR_RETURN(const bool add_eos, Get(config, "add_eos_token", false, where));
  if (add_bos && t.Id(token_of("bos_token")) >= 0) t.prefix.push_back(t.Id(token_of("bos_token")));
  if (add_eos && t.Id(token_of("eos_token")) >= 0) t.suffix.push_back(t.Id(token_of("eos_token")));
  return absl::OkStatus();
}

}  // namespace

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& path) {
  namespace fs = std::filesystem;
  const bool dir = fs::is_directory(path);
  const std::string file = dir ? (fs::path(path) / "tokenizer.json").string() : path;
  ASSIGN_OR_RETURN(std::string json, ReadBoundedFile(file, kMaxTokenizerBytes));
  const std::string config_path = (fs::path(file).parent_path() / "tokenizer_config.json").string();
  std::string config;
  if (fs::exists(config_path)) {
    ASSIGN_OR_RETURN(config, ReadBoundedFile(config_path, kMaxTokenizerBytes));
  }
  return FromJson(json, config, file);
}

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(const std::string& json, const std::string& config_json,
                                                             const std::string& what) {
  ASSIGN_OR_RETURN(const Json j, ParseJsonObject(json, what));
  Json config = Json::object();
  if (!config_json.empty()) {
    const std::string config_what = (std::filesystem::path(what).parent_path() / "tokenizer_config.json").string();
    ASSIGN_OR_RETURN(config, ParseJsonObject(config_json, config_what));
  }
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
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() >= (1 << 24) || Field(a, "content").empty()) {
        return absl::InvalidArgumentError(what + ": added_tokens: each needs an id in [0, 2^24) and content");
      }
      ASSIGN_OR_RETURN(const bool special, Get(a, "special", false, what + ": added_tokens"));
      t->added.push_back({a["id"].get<int32_t>(), Field(a, "content"), special});
      size = std::max(size, t->added.back().id + 1);
    }
  }
  // Ids index a table as long as the largest: they must be (about) as many as it is long.
  const size_t count = t->vocab.size() + t->added.size();
  if (static_cast<size_t>(size) > 2 * count + 1024) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ids reach ", size - 1, " for ", count,
                                                   " tokens (ids must number the vocabulary from 0)"));
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
  if (!IsUtf8(text)) {
    const icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
    std::string valid;
    u.toUTF8String(valid);
    size_t at = 0;
    while (at < text.size() && at < valid.size() && text[at] == valid[at]) ++at;
    return absl::InvalidArgumentError(absl::StrCat("the text to encode is not UTF-8 (a bad byte near byte ", at, ")"));
  }
  std::vector<int32_t> ids;
  if (special) ids = impl_->prefix;
  size_t section = 0;
  for (const auto& [segment, id] : impl_->SplitAdded(text)) {
    if (id >= 0) {
      ids.push_back(id);
    } else {
      ASSIGN_OR_RETURN(std::string normal, impl_->Normalize(segment));
      ASSIGN_OR_RETURN(const std::vector<std::string> pieces, impl_->PreTokenize(normal, section));
      for (const std::string& piece : pieces) {
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
  ASSIGN_OR_RETURN(const std::vector<std::string> pieces, impl_->DecodeSteps(std::move(tokens)));
  for (const std::string& piece : pieces) out += piece;
  return out;
}

}  // namespace cleave
