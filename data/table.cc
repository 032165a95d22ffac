// CSV and TSV tables: numeric feature columns, an integer label column, optionally a
// group column (the natural partition key) and columns to drop.
#include <cmath>
#include <cstring>
#include <fstream>
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

// Reads one table: the options that shape it, which column is which, then its rows.
class TableReader {
 public:
  TableReader(const std::string& path, char sep) : path_(path), sep_(sep) {}

  Status ReadOptions(SpecOptions& o);
  // The columns, from line `at` (the header's names, or the column numbers).
  Status ReadColumns(absl::string_view line, size_t at);
  // Row `line` (number `at`, from 0, not blank): its label (or target) and group added
  // to the data set when `index`, its feature values appended to `values`.
  Status ReadRow(absl::string_view line, size_t at, bool index, std::vector<float>& values);
  // The data set: the rows read with `index`, and the values of `values` as its bytes
  // (none: an index for ReadPart).
  Dataset Finish(const std::vector<float>& values);

  int64_t skip() const { return skip_; }
  int64_t header() const { return header_; }
  std::string Where(size_t at) const { return absl::StrCat(path_, ":", at + 1); }

 private:
  StatusOr<int> Column(const std::string& name) const;
  StatusOr<std::vector<std::string>> Fields(absl::string_view line, size_t at) const {
    auto fields = SplitFields(line, sep_);
    if (!fields.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(Where(at), ": ", fields.status().message()));
    }
    return fields;
  }
  // A label (or, with regression, a target) field.
  Status AddLabel(const std::string& field, size_t at);

  const std::string path_;
  const char sep_;
  int64_t skip_ = 0, header_ = 1, classes_ = 0;
  bool regression_ = false;
  std::string label_name_, group_name_;
  std::vector<std::string> drop_;

  std::vector<std::string> names_;
  int label_col_ = -1, group_col_ = -1;
  std::vector<bool> feature_;

  Dataset d_;
  std::map<std::string, int32_t> group_index_;
  int64_t max_label_ = -1;
};

Status TableReader::ReadOptions(SpecOptions& o) {
  ASSIGN_OR_RETURN(skip_, o.Int("skip", 0, 0, INT64_MAX));
  ASSIGN_OR_RETURN(header_, o.Int("header", 1, 0, 1));
  ASSIGN_OR_RETURN(classes_, o.Int("classes", 0, 0, 1 << 20));
  regression_ = o.Has("regression");
  if (regression_ && classes_ > 0) return absl::InvalidArgumentError("regression data has no classes");
  label_name_ = o.String("label", "");
  group_name_ = o.String("group", "");
  if (o.Has("drop")) drop_ = absl::StrSplit(o.String("drop", ""), '/');
  return absl::OkStatus();
}

StatusOr<int> TableReader::Column(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat(path_, ": no column '", Printable(name), "'",
                                                 header_ ? "" : " (header=0: columns are 0, 1, ...)"));
}

Status TableReader::ReadColumns(absl::string_view line, size_t at) {
  ASSIGN_OR_RETURN(std::vector<std::string> fields, Fields(line, at));
  if (header_) {
    names_ = std::move(fields);
  } else {
    for (size_t i = 0; i < fields.size(); ++i) names_.push_back(std::to_string(i));
  }
  label_col_ = static_cast<int>(names_.size()) - 1;
  if (!label_name_.empty() && label_name_ != "last") {
    ASSIGN_OR_RETURN(label_col_, Column(label_name_));
  }
  if (!group_name_.empty()) {
    ASSIGN_OR_RETURN(group_col_, Column(group_name_));
  }
  if (group_col_ == label_col_) return absl::InvalidArgumentError("the group column cannot be the label");
  feature_.assign(names_.size(), true);
  feature_[label_col_] = false;
  if (group_col_ >= 0) feature_[group_col_] = false;
  for (const std::string& name : drop_) {
    ASSIGN_OR_RETURN(int c, Column(name));
    feature_[c] = false;
  }
  int64_t num_features = 0;
  for (bool f : feature_) num_features += f;
  if (num_features == 0) return absl::InvalidArgumentError(absl::StrCat(path_, ": no feature columns"));
  d_.type = ExampleType::kFloat32;
  d_.shape = {num_features};
  d_.mean.clear();
  d_.stddev.clear();
  return absl::OkStatus();
}

Status TableReader::AddLabel(const std::string& field, size_t at) {
  if (regression_) {
    double target = 0;
    if (!absl::SimpleAtod(field, &target) || !std::isfinite(target)) {
      return absl::InvalidArgumentError(absl::StrCat(Where(at), ": target '", Printable(field),
                                                     "' is not a finite number"));
    }
    d_.targets.push_back(static_cast<float>(target));
    d_.labels.push_back(0);
    return absl::OkStatus();
  }
  int64_t label = 0;
  if (!absl::SimpleAtoi(field, &label) || label < 0 || (classes_ > 0 && label >= classes_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(at), ": label '", Printable(field), "' is not a class number in [0, ",
        classes_ > 0 ? std::to_string(classes_) : "inf", ")"));
  }
  d_.labels.push_back(label);
  max_label_ = std::max(max_label_, label);
  return absl::OkStatus();
}

Status TableReader::ReadRow(absl::string_view line, size_t at, bool index,
                            std::vector<float>& values) {
  ASSIGN_OR_RETURN(std::vector<std::string> fields, Fields(line, at));
  if (fields.size() != names_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(at), ": ", fields.size(),
                                                   " fields, the table has ", names_.size()));
  }
  for (size_t c = 0; c < names_.size(); ++c) {
    const std::string& field = fields[c];
    if (c == static_cast<size_t>(group_col_)) {
      if (!index) continue;
      auto [it, added] = group_index_.emplace(field, static_cast<int32_t>(group_index_.size()));
      if (added) d_.group_names.push_back(field);
      d_.groups.push_back(it->second);
      continue;
    }
    if (!feature_[c] && c != static_cast<size_t>(label_col_)) continue;
    if (field.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(at), ": column '", Printable(names_[c]), "' is empty (missing value)"));
    }
    if (c == static_cast<size_t>(label_col_)) {
      if (index) RETURN_IF_ERROR(AddLabel(field, at));
      continue;
    }
    double v = 0;
    if (!absl::SimpleAtod(field, &v) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat(Where(at), ": column '", Printable(names_[c]),
                                                     "': '", Printable(field),
                                                     "' is not a finite number"));
    }
    values.push_back(static_cast<float>(v));
  }
  if (index) ++d_.size;
  return absl::OkStatus();
}

Dataset TableReader::Finish(const std::vector<float>& values) {
  d_.num_classes = regression_ ? 1
                   : classes_ > 0 ? static_cast<int>(classes_)
                                  : static_cast<int>(max_label_ + 1);
  d_.bytes.resize(values.size() * sizeof(float));
  std::memcpy(d_.bytes.data(), values.data(), d_.bytes.size());
  return std::move(d_);
}

}  // namespace

// Read line by line. With a part to keep, the first pass checks every row and keeps
// only labels, groups and where each row starts; ReadPart then reads the kept rows again.
StatusOr<Dataset> LoadTable(const std::string& path, char sep, SpecOptions& o) {
  TableReader table(path, sep);
  RETURN_IF_ERROR(table.ReadOptions(o));
  ASSIGN_OR_RETURN(std::ifstream in, OpenForReading(path));
  const size_t skip = static_cast<size_t>(table.skip());
  std::vector<float> values;  // the whole table's, or one row's with a part
  std::vector<std::pair<int64_t, size_t>> rows;  // where each data row starts, its line
  int64_t offset = 0;
  bool columns = false, data_lines = false;
  std::string line;
  for (size_t at = 0; std::getline(in, line); ++at) {
    const int64_t start = offset;
    offset += static_cast<int64_t>(line.size()) + 1;
    if (at < skip) continue;
    if (!columns) {
      RETURN_IF_ERROR(table.ReadColumns(line, at));
      columns = true;
      if (table.header()) continue;
    }
    data_lines = true;
    if (absl::StripAsciiWhitespace(line).empty()) continue;  // blank lines
    if (o.part) values.clear();
    RETURN_IF_ERROR(table.ReadRow(line, at, /*index=*/true, values));
    rows.emplace_back(start, at);
  }
  if (in.bad()) return absl::DataLossError(path + ": read failed");
  if (!data_lines) return absl::InvalidArgumentError(absl::StrCat(path, ": no data rows"));
  if (!o.part) return table.Finish(values);
  in.clear();
  return ReadPart(o, table.Finish({}), [&](int64_t example, std::vector<uint8_t>& out) -> Status {
    in.seekg(rows[example].first);
    if (!std::getline(in, line)) return absl::DataLossError(path + ": read failed");
    values.clear();
    RETURN_IF_ERROR(table.ReadRow(line, rows[example].second, /*index=*/false, values));
    out.resize(values.size() * sizeof(float));
    std::memcpy(out.data(), values.data(), out.size());
    return absl::OkStatus();
  });
}

}  // namespace cleave
