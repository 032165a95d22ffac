// Registry: the name-keyed table of one kind of extension (strategies, robust rules,
// codecs, data sources, ...). The module that defines the kind owns one Registry and
// fills it with its built-ins the first time it is asked for it; anyone else (a test, a
// library user) adds an entry with Add, from its own file, before the entry is used.
// The config's validation, the factory, its "unknown X; choose one of ..." error and the
// docs test all read the same table, so none of them can name something the others do
// not know.
//
// Contract:
//  - Add refuses an empty name or one already registered (ALREADY_EXISTS); entries keep
//    the order they were added in (built-ins first, in the module's order).
//  - Find returns the entry or null; the pointer stays valid for the process's life
//    (entries are never removed).
//  - Thread-safe: Add and Find may be called from any thread. Registration is expected
//    at start-up (a static initializer or main); a lookup never waits on a factory.
#pragma once

#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/names.h"
#include "core/status.h"

namespace cleave {

template <typename Entry>
class Registry {
 public:
  // `key`: the config key that picks an entry ("strategy.name"), named in errors.
  explicit Registry(std::string key) : key_(std::move(key)) {}
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  const std::string& key() const { return key_; }

  // Registers `entry` under `name`. `summary` is a one-line description for listings
  // ("topk:F[:ef21]"); empty means the name itself.
  Status Add(const std::string& name, Entry entry, std::string summary = "") {
    if (name.empty()) return absl::InvalidArgumentError(key_ + ": an entry needs a name");
    std::lock_guard<std::mutex> l(mu_);
    for (const Item& i : items_) {
      if (i.name == name) {
        return absl::AlreadyExistsError(absl::StrCat(key_, ": '", name, "' is registered already"));
      }
    }
    items_.push_back(Item{name, summary.empty() ? name : std::move(summary), std::move(entry)});
    return absl::OkStatus();
  }

  // Add for the module's own entries: a failure is a programming error (a name twice).
  void AddBuiltin(const std::string& name, Entry entry, std::string summary = "") {
    if (!Add(name, std::move(entry), std::move(summary)).ok()) std::abort();
  }

  // The entry registered as `name`, or null.
  const Entry* Find(const std::string& name) const {
    std::lock_guard<std::mutex> l(mu_);
    for (const Item& i : items_) {
      if (i.name == name) return &i.entry;
    }
    return nullptr;
  }
  bool Has(const std::string& name) const { return Find(name) != nullptr; }

  // The entry named `name`, or INVALID_ARGUMENT "KEY: unknown 'x'; choose one of ...".
  StatusOr<const Entry*> Get(const std::string& name) const {
    if (const Entry* e = Find(name)) return e;
    return Table().Unknown(name);
  }

  // The registered names, in registration order.
  std::vector<std::string> Names() const {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<std::string> out;
    for (const Item& i : items_) out.push_back(i.name);
    return out;
  }
  // The summaries, in the same order ("topk:F[:ef21]" where a name takes parameters).
  std::vector<std::string> Summaries() const {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<std::string> out;
    for (const Item& i : items_) out.push_back(i.summary);
    return out;
  }
  // A snapshot as a NameTable (Check's error lists the summaries).
  NameTable Table() const {
    std::lock_guard<std::mutex> l(mu_);
    NameTable t{key_, {}, {}};
    for (const Item& i : items_) {
      t.names.push_back(i.name);
      t.summaries.push_back(i.summary);
    }
    return t;
  }

 private:
  struct Item {
    std::string name;
    std::string summary;
    Entry entry;
  };
  const std::string key_;
  mutable std::mutex mu_;
  std::deque<Item> items_;  // a deque: Find's pointers survive later Adds
};

}  // namespace cleave
