// The names a job config can pick for one kind of thing: a strategy, a robust rule, an
// optimizer, a loss, a schedule, a split mode, an attack, a codec, a data source. Kinds
// that anyone may extend keep their names in a Registry (core/registry.h) of the module
// that implements them, whose Table() is a NameTable; fixed choices are a NameTable in
// a torch-free header of their module (models/names.h, split/names.h, the modules'
// options.h). The config's validation, the module's factory, its error messages and
// the tests that hold docs/configuration.md to the names all read that one table, so
// they cannot drift apart.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace cleave {

struct NameTable {
  std::string key;  // the config key that picks one: "strategy.name"
  std::vector<std::string> names;
  // How each name is written where it takes parameters ("topk:F[:ef21]"), for messages;
  // empty: the names themselves.
  std::vector<std::string> summaries = {};

  bool Has(const std::string& name) const {
    return std::find(names.begin(), names.end(), name) != names.end();
  }
  // "fedavg, fedprox, ..." for messages.
  std::string List() const { return absl::StrJoin(summaries.empty() ? names : summaries, ", "); }
  // OK, or INVALID_ARGUMENT "strategy.name: unknown 'x'; choose one of fedavg, fedprox, ...".
  Status Check(const std::string& name) const {
    if (Has(name)) return absl::OkStatus();
    return Unknown(name);
  }
  Status Unknown(const std::string& name) const {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": unknown '", name, "'; choose one of ", List()));
  }
};

}  // namespace cleave
