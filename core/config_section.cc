#include "core/config_section.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cleave {

struct ConfigSection::Node {
  // yaml-cpp's Node assignment rebinds shared state and throws on a missing key's node:
  // a Node here is only ever copy-constructed.
  Node(std::string name, YAML::Node yaml, std::string base_dir)
      : name(std::move(name)), yaml(std::move(yaml)), base_dir(std::move(base_dir)) {}

  const std::string name;  // "model.gpt"; "" for the root
  const YAML::Node yaml;   // undefined when the section is absent
  const std::string base_dir;
  std::vector<Key> keys;  // relative names, in the order first read
  std::vector<std::pair<std::string, std::shared_ptr<Node>>> children;  // by relative key
  Status error;           // the first type error

  bool given() const { return yaml.IsDefined(); }
  bool map() const { return yaml.IsMap(); }
  std::string Full(const std::string& key) const { return name.empty() ? key : name + "." + key; }
  // SECTION.KEY in messages about the YAML ("config.KEY" for a section's own name).
  std::string Named(const std::string& key) const { return (name.empty() ? "config" : name) + "." + key; }
  // The YAML value at `key`, undefined when absent (or when this is not a map: Finish
  // says so).
  YAML::Node At(const std::string& key) const {
    if (map()) {
      YAML::Node n = yaml[key];
      if (n.IsDefined()) return n;
    }
    return YAML::Node(YAML::NodeType::Undefined);
  }
  std::shared_ptr<Node> Child(const std::string& child_name, YAML::Node child) const {
    return std::make_shared<Node>(child_name, std::move(child), base_dir);
  }
  void Record(const std::string& key, std::string value, bool section = false) {
    for (Key& k : keys) {
      if (k.name == key) {
        k.value = std::move(value);
        return;
      }
    }
    keys.push_back(Key{key, std::move(value), section});
  }
  void Fail(Status s) {
    if (error.ok()) error = std::move(s);
  }
};

namespace {

std::string Render(bool v) { return v ? "true" : "false"; }
std::string Render(const std::string& v) { return v; }
template <typename T>
std::enable_if_t<std::is_arithmetic_v<T>, std::string> Render(T v) {
  return absl::StrCat(v);
}
template <typename T>
std::string Render(const std::vector<T>& v) {
  std::vector<std::string> parts;
  for (const T& x : v) parts.push_back(Render(x));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

}  // namespace

ConfigSection::ConfigSection()
    : node_(std::make_shared<Node>("", YAML::Node(YAML::NodeType::Undefined), "")) {}
ConfigSection::ConfigSection(std::shared_ptr<Node> node) : node_(std::move(node)) {}

StatusOr<ConfigSection> ConfigSection::Parse(const std::string& yaml_text, std::string base_dir) {
  try {
    const YAML::Node doc = YAML::Load(yaml_text);
    const bool empty = !doc.IsDefined() || doc.IsNull();
    return ConfigSection(std::make_shared<Node>(
        "", empty ? YAML::Node(YAML::NodeType::Undefined) : doc, std::move(base_dir)));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config is not valid YAML: ", e.msg));
  }
}

const std::string& ConfigSection::name() const { return node_->name; }
bool ConfigSection::given() const { return node_->given(); }

template <typename T>
void ConfigSection::Read(const std::string& key, T& out) {
  const YAML::Node n = node_->At(key);
  if (n.IsDefined()) {
    try {
      T v = n.as<T>();
      if constexpr (std::is_floating_point_v<T>) {
        if (!std::isfinite(v)) {
          node_->Fail(absl::InvalidArgumentError(
              absl::StrCat(node_->Full(key), " must be a finite number")));
        }
      }
      if (node_->error.ok()) out = std::move(v);
    } catch (const YAML::Exception& e) {
      node_->Fail(absl::InvalidArgumentError(absl::StrCat(node_->Full(key), ": ", e.msg)));
    }
  }
  node_->Record(key, Render(out));
}

template void ConfigSection::Read<bool>(const std::string&, bool&);
template void ConfigSection::Read<int>(const std::string&, int&);
template void ConfigSection::Read<int64_t>(const std::string&, int64_t&);
template void ConfigSection::Read<uint64_t>(const std::string&, uint64_t&);
template void ConfigSection::Read<double>(const std::string&, double&);
template void ConfigSection::Read<std::string>(const std::string&, std::string&);
template void ConfigSection::Read<std::vector<std::string>>(const std::string&, std::vector<std::string>&);
template void ConfigSection::Read<std::vector<int64_t>>(const std::string&, std::vector<int64_t>&);
template void ConfigSection::Read<std::vector<double>>(const std::string&, std::vector<double>&);

void ConfigSection::ReadPath(const std::string& key, std::string& out) {
  const bool present = node_->At(key).IsDefined();
  Read(key, out);
  if (present && !out.empty() && std::filesystem::path(out).is_relative() &&
      !node_->base_dir.empty()) {
    out = (std::filesystem::path(node_->base_dir) / out).string();
  }
}

bool ConfigSection::Has(const std::string& key) {
  node_->Record(key, "");
  return node_->At(key).IsDefined();
}

void ConfigSection::Reject(const std::string& key, const std::string& rule) {
  node_->Fail(Range(false, node_->Full(key), rule));
}

ConfigSection ConfigSection::Section(const std::string& key) {
  for (const auto& [k, child] : node_->children) {
    if (k == key) return ConfigSection(child);
  }
  auto child = node_->Child(node_->Full(key), node_->At(key));
  node_->children.emplace_back(key, child);
  node_->Record(key, "", /*section=*/true);
  return ConfigSection(child);
}

void ConfigSection::ForEach(const std::string& key, const std::function<void(ConfigSection&)>& each) {
  node_->Record(key, "", /*section=*/true);
  const YAML::Node list = node_->At(key);
  auto item = [&](YAML::Node yaml) {
    auto child = node_->Child(node_->Full(key) + "[]", yaml);
    node_->children.emplace_back(key, child);
    ConfigSection s(child);
    each(s);
  };
  if (!list.IsDefined()) return item(YAML::Node(YAML::NodeType::Undefined));
  if (!list.IsSequence()) {
    return node_->Fail(absl::InvalidArgumentError(node_->Full(key) + " must be a list"));
  }
  for (const YAML::Node& n : list) item(n);
}

Status ConfigSection::Finish() const {
  const Node& n = *node_;
  const std::string what = n.name.empty() ? "config" : n.name;
  if (n.given()) {
    if (!n.map()) return absl::InvalidArgumentError(what + " must be a map");
    std::set<std::string> known, seen;  // yaml-cpp keeps duplicate keys; a lookup sees one
    for (const Key& k : n.keys) known.insert(k.name);
    for (const auto& kv : n.yaml) {
      if (!kv.first.IsScalar()) return absl::InvalidArgumentError(what + ": keys must be plain names");
      const std::string key = kv.first.Scalar();
      if (!known.count(key)) {
        return absl::InvalidArgumentError(absl::StrCat("unknown config key ", n.Named(key)));
      }
      if (!seen.insert(key).second) {
        return absl::InvalidArgumentError(absl::StrCat("duplicate config key ", n.Named(key)));
      }
    }
  }
  for (const auto& [key, child] : n.children) RETURN_IF_ERROR(ConfigSection(child).Finish());
  return n.error;
}

std::vector<ConfigSection::Key> ConfigSection::Keys() const {
  std::vector<Key> out;
  std::set<std::string> listed;
  for (const Key& k : node_->keys) {
    out.push_back(Key{node_->Full(k.name), k.value, k.section});
    if (!k.section) continue;
    for (const auto& [key, child] : node_->children) {
      if (key != k.name) continue;
      for (Key& nested : ConfigSection(child).Keys()) {
        if (listed.insert(nested.name).second) out.push_back(std::move(nested));
      }
    }
  }
  return out;
}

Status Range(bool ok, const std::string& key, const std::string& rule) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " must be ", rule));
}

}  // namespace cleave
