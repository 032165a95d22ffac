// The text source: plain-text files or folders and JSONL, tokenized and packed into
// fixed-length sequences, each file its own group (the natural partition).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "data/sources.h"
#include "data/tokenizer.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

// The documents of one file: the whole file, or each line's `field` for JSONL.
StatusOr<std::vector<std::string>> Documents(const fs::path& p, const std::string& field) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return absl::NotFoundError("text: cannot open " + p.string());
  if (p.extension() != ".jsonl") {
    std::stringstream ss;
    ss << in.rdbuf();
    return std::vector<std::string>{ss.str()};
  }
  std::vector<std::string> docs;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const auto where = absl::StrCat(p.string(), ":", n);
    if (j.is_discarded()) return absl::InvalidArgumentError(where + ": not a JSON value");
    if (!j.is_object() || !j.contains(field) || !j[field].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected an object with a string \"", field, "\""));
    }
    docs.push_back(j[field].get<std::string>());
  }
  return docs;
}

}  // namespace

// Fortunes' NAME.u8 links to NAME are skipped as links to files already listed, its
// .dat indexes as binary files.
StatusOr<std::vector<std::string>> TextFilesUnder(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return std::vector<std::string>{path};
  if (!fs::is_directory(path, ec)) return absl::NotFoundError("text: no such file or folder " + path);
  std::vector<fs::path> all;
  for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file(ec)) all.push_back(it->path());
  }
  if (ec) return absl::InternalError(absl::StrCat("text: cannot list ", path, ": ", ec.message()));
  std::sort(all.begin(), all.end());
  std::vector<std::string> out;
  std::set<fs::path> seen;
  for (const fs::path& p : all) {
    if (!seen.insert(fs::canonical(p, ec)).second) continue;
    std::ifstream in(p, std::ios::binary);
    char head[8192];
    in.read(head, sizeof(head));
    if (std::memchr(head, 0, static_cast<size_t>(in.gcount())) != nullptr) continue;
    out.push_back(p.string());
  }
  if (out.empty()) return absl::NotFoundError("text: no text files in " + path);
  return out;
}

namespace {

// `file`'s documents (`field` of JSONL records) tokenized one at a time, so that an error
// names its document, and joined by `separator`; their bytes added to *bytes when given.
StatusOr<std::vector<int32_t>> FileIds(const Tokenizer& tokenizer, const std::string& file, const std::string& field,
                                       const std::vector<int32_t>& separator, int64_t* bytes) {
  ASSIGN_OR_RETURN(std::vector<std::string> docs, Documents(file, field));
  std::vector<int32_t> ids;
  for (size_t i = 0; i < docs.size(); ++i) {
    auto encoded = tokenizer.Encode({docs[i]});
    if (!encoded.ok()) {
      return Status(encoded.status().code(), absl::StrCat("text: ", file, ", document ", i + 1, " of ", docs.size(),
                                                          ": ", encoded.status().message()));
    }
    if (!ids.empty()) ids.insert(ids.end(), separator.begin(), separator.end());
    ids.insert(ids.end(), (*encoded)[0].begin(), (*encoded)[0].end());
    if (bytes) *bytes += static_cast<int64_t>(docs[i].size());
  }
  return ids;
}

}  // namespace

// With a part to keep, the files are tokenized twice: once for the index (each
// window's group), then again only for the files that hold a kept window.
StatusOr<Dataset> LoadText(const std::string& path, bool train, SpecOptions& o) {
  const std::string tokenizer_spec = o.String("tokenizer", "byte");
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::Create(tokenizer_spec));
  ASSIGN_OR_RETURN(int64_t context, o.Int("context", 128, 1, 1 << 20));
  ASSIGN_OR_RETURN(double test, o.Double("test", 0.1, 0, 0.9));
  const std::string field = o.String("field", "text");
  ASSIGN_OR_RETURN(std::vector<std::string> files, TextFilesUnder(path));
  const std::vector<int32_t> separator = tokenizer->DocumentSeparator();
  const fs::path root = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  int64_t text_bytes = 0, tokens = 0;
  auto file_ids = [&](const std::string& file, int64_t* bytes) {
    return FileIds(*tokenizer, file, field, separator, bytes);
  };

  Dataset d;
  d.type = ExampleType::kToken;
  d.shape = {context + 1};
  d.num_classes = tokenizer->vocab_size();
  d.tokenizer = tokenizer_spec;
  const int64_t window_bytes = (context + 1) * static_cast<int64_t>(sizeof(int32_t));
  std::vector<std::pair<size_t, int64_t>> windows_at;  // with a part: each example's file, window
  for (size_t f = 0; f < files.size(); ++f) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, file_ids(files[f], &text_bytes));
    tokens += static_cast<int64_t>(ids.size());
    // Windows of context + 1 tokens, `context` apart: every token but the first is a
    // target exactly once. The file's last `test` fraction of windows is its test part.
    const int64_t windows = ids.empty() ? 0 : (static_cast<int64_t>(ids.size()) - 1) / context;
    if (windows == 0) continue;
    const int64_t held = windows < 2 || test == 0 ? 0
                         : std::clamp<int64_t>(std::llround(test * windows), 1, windows - 1);
    const int64_t first = train ? 0 : windows - held, last = train ? windows - held : windows;
    // Every file with a window is a group on both sides (train and test number the
    // groups alike), named by its path under the root as listed (links not followed).
    const int32_t group = static_cast<int32_t>(d.group_names.size());
    const fs::path name = fs::path(files[f]).lexically_normal().lexically_relative(root.lexically_normal());
    d.group_names.push_back(name.empty() || name == "." ? fs::path(files[f]).filename().string()
                                                         : name.string());
    for (int64_t w = first; w < last; ++w) {
      if (o.part) {
        windows_at.emplace_back(f, w);
      } else {
        const auto* begin = reinterpret_cast<const uint8_t*>(&ids[w * context]);
        d.bytes.insert(d.bytes.end(), begin, begin + window_bytes);
      }
      d.groups.push_back(group);
      ++d.size;
    }
  }
  if (d.size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text: ", path, " holds no ", train ? "training" : "test", " sequence of ", context + 1,
        " tokens (", tokens, " tokens in ", files.size(), " files; lower context= or test=)"));
  }
  d.labels.assign(d.size, 0);
  d.bytes_per_token = tokens > 0 ? static_cast<double>(text_bytes) / tokens : 1;
  if (!o.part) return d;
  size_t held_file = files.size();  // the file whose ids are held
  std::vector<int32_t> ids;
  return ReadPart(o, std::move(d), [&](int64_t example, std::vector<uint8_t>& out) -> Status {
    const auto [f, w] = windows_at[example];
    if (f != held_file) {
      ASSIGN_OR_RETURN(ids, file_ids(files[f], nullptr));
      held_file = f;
    }
    const auto* begin = reinterpret_cast<const uint8_t*>(&ids[w * context]);
    out.assign(begin, begin + window_bytes);
    return absl::OkStatus();
  });
}

}  // namespace cleave
