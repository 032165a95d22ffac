// The names a job config can pick for one kind of thing: a strategy, a robust rule, an
// optimizer, a loss, a schedule, a split mode, an attack. Each table lives in a
// torch-free header of the module that implements the names (aggregation/names.h,
// models/names.h, split/names.h, client/names.h), and the config's validation, the
// module's factory, its error messages and the tests that hold docs/configuration.md to
// the names all read that one table, so they cannot drift apart. (Models and data
// sources have richer tables of their own: BuiltinModelNames, DataSourceNames; codecs
// are specs with parameters, parsed by MakeCodec.)
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

  bool Has(const std::string& name) const {
    return std::find(names.begin(), names.end(), name) != names.end();
  }
  // "fedavg, fedprox, ..." for messages.
  std::string List() const { return absl::StrJoin(names, ", "); }
  // OK, or INVALID_ARGUMENT "strategy.name: unknown 'x' (fedavg, fedprox, ...)".
  Status Check(const std::string& name) const {
    if (Has(name)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(key, ": unknown '", name, "' (", List(), ")"));
  }
};

}  // namespace cleave
