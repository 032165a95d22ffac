// ConfigSection: one section of a job config as the module that owns it reads it. core
// knows no module: each module declares its section's options struct (a documented
// default on every field) beside itself, with two functions the job layer registers
// (job/job.cc):
//
//   void ReadX(ConfigSection& s, XConfig& c);   // s.Read("key", c.field) for every key
//   Status CheckX(XConfig& c);                  // ranges, names, value-dependent defaults
//
// A Read records the key as known whether or not the YAML holds it, so that running a
// Read function on an absent section lists its keys and their defaults (the docs test
// holds docs/configuration.md to both). A type error is kept, not returned: Finish()
// reports an unknown or duplicate key first, then the first type error, each naming
// SECTION.KEY. Reads never throw.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace YAML {
class Node;
}

namespace cleave {

class ConfigSection {
 public:
  // The document's root: its keys are the section names.
  static StatusOr<ConfigSection> Parse(const std::string& yaml_text, std::string base_dir);
  // An empty root, for listing keys and defaults.
  ConfigSection();

  // "model.gpt"; "" for the root.
  const std::string& name() const;
  // Whether the YAML holds this section.
  bool given() const;

  // Reads `key` into `out` when present. T: bool, int, int64_t, uint64_t, double,
  // std::string, std::vector<std::string>, std::vector<int64_t>, std::vector<double>.
  // Doubles must be finite (a list's, checked by its reader).
  template <typename T>
  void Read(const std::string& key, T& out);
  // Read, then resolves a relative path against the config file's directory.
  void ReadPath(const std::string& key, std::string& out);
  // Whether `key` is present (and records it as known).
  bool Has(const std::string& key);
  // A nested section ("model" → "model.gpt"); records `key`.
  ConfigSection Section(const std::string& key);
  // Records that `key`'s value cannot be taken: Finish reports "SECTION.KEY must be
  // RULE" (for a value read in one form and meant in another, as split.cut's "auto" or
  // a number).
  void Reject(const std::string& key, const std::string& rule);
  // A list of maps at `key` (section "local.profiles[]"): `each` runs on every item. On an
  // absent key it runs once on an empty item, so the item's keys are listed too.
  void ForEach(const std::string& key, const std::function<void(ConfigSection&)>& each);

  // OK when the YAML holds no key but those read, each once, and every value had its
  // type; else INVALID_ARGUMENT naming the key. Covers nested sections and items.
  Status Finish() const;

  // Every key read so far, as SECTION.KEY, with its value after the reads (the struct's
  // default when the YAML does not set it) rendered as YAML would write it: nested
  // sections' and items' keys too ("local.profiles[].slowdown"). A nested section's own
  // key is listed with an empty default.
  struct Key {
    std::string name;
    std::string value;
    bool section = false;  // a nested section or list of items, not a value
  };
  std::vector<Key> Keys() const;

 private:
  struct Node;
  ConfigSection(std::shared_ptr<Node> node);
  std::shared_ptr<Node> node_;
};

// OK when `ok`, else INVALID_ARGUMENT "KEY must be RULE".
Status Range(bool ok, const std::string& key, const std::string& rule);

}  // namespace cleave
