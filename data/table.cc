// CSV and TSV tables: numeric feature columns, an integer label column, optionally a
// group column (the natural partition key) and columns to drop.
#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/files.h"
#include "core/printable.h"
#include "data/sources.h"

namespace cleave {
namespace {

// One line's fields. A field may be double-quoted ("a,b" and "say ""hi"""); the line
// ends at '\n' (a '\r' before it is dropped).
StatusOr<std::vector<std::string>> SplitFields(absl::string_view line, char sep) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"' && fields.back().empty()) {
      quoted = true;
    } else if (c == sep) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  if (quoted) return absl::InvalidArgumentError("unterminated quote");
  for (auto& f : fields) f = std::string(absl::StripAsciiWhitespace(f));
  return fields;
}

}  // namespace

StatusOr<Dataset> LoadTable(const std::string& path, char sep, SpecOptions& o) {
  ASSIGN_OR_RETURN(int64_t skip, o.Int("skip", 0, 0, INT64_MAX));
  ASSIGN_OR_RETURN(int64_t header, o.Int("header", 1, 0, 1));
  ASSIGN_OR_RETURN(int64_t classes, o.Int("classes", 0, 0, 1 << 20));
  const bool regression = o.Has("regression");
  if (regression && classes > 0) return absl::InvalidArgumentError("regression data has no classes");
  const std::string label_name = o.String("label", "");
  const std::string group_name = o.String("group", "");
  std::vector<std::string> drop;
  if (o.Has("drop")) drop = absl::StrSplit(o.String("drop", ""), '/');

  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  const auto where = [&](size_t line) { return absl::StrCat(path, ":", line + 1); };
  if (static_cast<int64_t>(lines.size()) <= skip + header) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no data rows"));
  }
  // Column names: the header's, or the column numbers.
  std::vector<std::string> names;
  size_t first_row = skip;
  if (header) {
    auto fields = SplitFields(lines[skip], sep);
    if (!fields.ok()) return absl::InvalidArgumentError(absl::StrCat(where(skip), ": ", fields.status().message()));
    names = *fields;
    ++first_row;
  } else {
    auto fields = SplitFields(lines[skip], sep);
    if (!fields.ok()) return absl::InvalidArgumentError(absl::StrCat(where(skip), ": ", fields.status().message()));
    for (size_t i = 0; i < fields->size(); ++i) names.push_back(std::to_string(i));
  }
  const auto column = [&](const std::string& name) -> StatusOr<int> {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return static_cast<int>(i);
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": no column '", Printable(name), "'",
                                                   header ? "" : " (header=0: columns are 0, 1, ...)"));
  };
  int label_col = static_cast<int>(names.size()) - 1;
  if (!label_name.empty() && label_name != "last") {
    ASSIGN_OR_RETURN(label_col, column(label_name));
  }
  int group_col = -1;
  if (!group_name.empty()) {
    ASSIGN_OR_RETURN(group_col, column(group_name));
  }
  if (group_col == label_col) return absl::InvalidArgumentError("the group column cannot be the label");
  std::vector<bool> feature(names.size(), true);
  feature[label_col] = false;
  if (group_col >= 0) feature[group_col] = false;
  for (const std::string& name : drop) {
    ASSIGN_OR_RETURN(int c, column(name));
    feature[c] = false;
  }
  int64_t num_features = 0;
  for (bool f : feature) num_features += f;
  if (num_features == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no feature columns"));

  Dataset d;
  d.type = ExampleType::kFloat32;
  d.shape = {num_features};
  d.mean.clear();
  d.stddev.clear();
  std::vector<float> values;
  std::map<std::string, int32_t> group_index;
  int64_t max_label = -1;
  for (size_t l = first_row; l < lines.size(); ++l) {
    if (absl::StripAsciiWhitespace(lines[l]).empty()) continue;  // blank lines
    auto fields = SplitFields(lines[l], sep);
    if (!fields.ok()) return absl::InvalidArgumentError(absl::StrCat(where(l), ": ", fields.status().message()));
    if (fields->size() != names.size()) {
      return absl::InvalidArgumentError(absl::StrCat(where(l), ": ", fields->size(),
                                                     " fields, the table has ", names.size()));
    }
    for (size_t c = 0; c < names.size(); ++c) {
      const std::string& field = (*fields)[c];
      if (c == static_cast<size_t>(group_col)) {
        auto [it, added] = group_index.emplace(field, static_cast<int32_t>(group_index.size()));
        if (added) d.group_names.push_back(field);
        d.groups.push_back(it->second);
        continue;
      }
      if (!feature[c] && c != static_cast<size_t>(label_col)) continue;
      if (field.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(l), ": column '", Printable(names[c]), "' is empty (missing value)"));
      }
      if (c == static_cast<size_t>(label_col) && regression) {
        double target = 0;
        if (!absl::SimpleAtod(field, &target) || !std::isfinite(target)) {
          return absl::InvalidArgumentError(absl::StrCat(where(l), ": target '", Printable(field),
                                                         "' is not a finite number"));
        }
        d.targets.push_back(static_cast<float>(target));
        d.labels.push_back(0);
        continue;
      }
      if (c == static_cast<size_t>(label_col)) {
        int64_t label = 0;
        if (!absl::SimpleAtoi(field, &label) || label < 0 || (classes > 0 && label >= classes)) {
          return absl::InvalidArgumentError(absl::StrCat(
              where(l), ": label '", Printable(field), "' is not a class number in [0, ",
              classes > 0 ? std::to_string(classes) : "inf", ")"));
        }
        d.labels.push_back(label);
        max_label = std::max(max_label, label);
        continue;
      }
      double v = 0;
      if (!absl::SimpleAtod(field, &v) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat(where(l), ": column '", Printable(names[c]),
                                                       "': '", Printable(field),
                                                       "' is not a finite number"));
      }
      values.push_back(static_cast<float>(v));
    }
    ++d.size;
  }
  d.num_classes = regression ? 1 : classes > 0 ? static_cast<int>(classes) : static_cast<int>(max_label + 1);
  d.bytes.resize(values.size() * sizeof(float));
  std::memcpy(d.bytes.data(), values.data(), d.bytes.size());
  return d;
}

}  // namespace cleave
