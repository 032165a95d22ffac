#include "service/site_policy.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "core/printable.h"
#include "service/yaml_error.h"

namespace cleave {
namespace {

// A scalar of type T at `n`, or an error naming `key` and what it must be.
template <typename T>
Status Scalar(const std::string& name, const YAML::Node& n, const std::string& key, const char* what, T* out) {
  try {
    if (!n.IsScalar()) throw YAML::Exception(n.Mark(), "");
    *out = n.as<T>();
  } catch (const YAML::Exception&) {
    return At(name, n, absl::StrCat(key, " is ", what));
  }
  return absl::OkStatus();
}

// A list of non-empty strings at `n`.
Status Strings(const std::string& name, const YAML::Node& n, const std::string& key,
               google::protobuf::RepeatedPtrField<std::string>* out) {
  if (!n.IsSequence()) return At(name, n, key + " is a list of names");
  for (const auto& item : n) {
    std::string s;
    RETURN_IF_ERROR(Scalar(name, item, key, "a list of names", &s));
    if (s.empty()) return At(name, item, key + ": an empty name");
    out->Add(std::move(s));
  }
  return absl::OkStatus();
}

Status ReadDatasets(const std::string& name, const YAML::Node& n, v1::SitePolicy* p) {
  if (!n.IsMap()) return At(name, n, "datasets is a map of dataset names to submitters");
  for (const auto& entry : n) {
    v1::DatasetGrant* g = p->add_datasets();
    RETURN_IF_ERROR(Scalar(name, entry.first, "a dataset", "a name", g->mutable_dataset()));
    RETURN_IF_ERROR(Strings(name, entry.second, "datasets." + g->dataset(), g->mutable_submitters()));
  }
  return absl::OkStatus();
}

// Each key's reader.
using KeyReader = std::function<Status(const std::string&, const YAML::Node&, v1::SitePolicy*)>;

// The reader of scalar `key` (a T, described as `what`), whose value `ok` must accept
// (else: "KEY is `range`"), stored by `set`.
template <typename T>
KeyReader Checked(std::string key, const char* what, bool (*ok)(T), std::string range,
                  void (v1::SitePolicy::*set)(T)) {
  return [=](const std::string& f, const YAML::Node& n, v1::SitePolicy* p) -> Status {
    T v{};
    RETURN_IF_ERROR(Scalar(f, n, key, what, &v));
    if (!ok(v)) return At(f, n, key + " is " + range);
    (p->*set)(v);
    return absl::OkStatus();
  };
}
const std::map<std::string, KeyReader>& Keys() {
  static const auto* keys = new std::map<std::string, KeyReader>{
      {"datasets", ReadDatasets},
      {"models", [](const std::string& f, const YAML::Node& n,
                    v1::SitePolicy* p) { return Strings(f, n, "models", p->mutable_models()); }},
      {"max_parameters", Checked<int64_t>("max_parameters", "a count", [](int64_t v) { return v >= 1; },
                                          "at least 1", &v1::SitePolicy::set_max_parameters)},
      {"max_rounds", Checked<int64_t>("max_rounds", "a count", [](int64_t v) { return v >= 1; }, "at least 1",
                                      &v1::SitePolicy::set_max_rounds)},
      {"require_secure_aggregation",
       Checked<bool>("require_secure_aggregation", "true or false", [](bool) { return true; }, "",
                     &v1::SitePolicy::set_require_secure_aggregation)},
      {"max_dp_epsilon", Checked<double>("max_dp_epsilon", "a number", [](double v) { return v > 0; }, "above 0",
                                         &v1::SitePolicy::set_max_dp_epsilon)},
      {"max_concurrent_jobs",
       Checked<int32_t>("max_concurrent_jobs", "a count", [](int32_t v) { return v >= 1 && v <= 64; }, "in [1, 64]",
                        &v1::SitePolicy::set_max_concurrent_jobs)},
      {"max_rounds_per_day", Checked<int64_t>("max_rounds_per_day", "a count", [](int64_t v) { return v >= 1; },
                                              "at least 1", &v1::SitePolicy::set_max_rounds_per_day)},
      {"max_training_hours_per_day",
       Checked<double>("max_training_hours_per_day", "a number", [](double v) { return v > 0 && v <= 24; },
                       "in (0, 24]", &v1::SitePolicy::set_max_training_hours_per_day)},
  };
  return *keys;
}

std::string KeyList() {
  std::vector<std::string> names;
  for (const auto& [key, read] : Keys()) names.push_back(key);
  return absl::StrJoin(names, ", ");
}

}  // namespace

StatusOr<v1::SitePolicy> ParseSitePolicy(const std::string& yaml, const std::string& name) {
  YAML::Node doc;
  try {
    doc = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return FileLineError(name, e.mark.line, "not YAML: " + e.msg);
  }
  if (!doc.IsMap()) return absl::InvalidArgumentError(absl::StrCat(name, ": a site policy is a map (", KeyList(), ")"));
  v1::SitePolicy p;
  p.set_given(true);
  for (const auto& entry : doc) {
    const std::string key = entry.first.as<std::string>("");
    auto it = Keys().find(key);
    if (it == Keys().end()) return At(name, entry.first, absl::StrCat("unknown key ", Printable(key), " (", KeyList(), ")"));
    RETURN_IF_ERROR(it->second(name, entry.second, &p));
  }
  return p;
}

StatusOr<v1::SitePolicy> LoadSitePolicy(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  return ParseSitePolicy(text, path);
}

std::string DatasetOf(const v1::JobSummary& job) { return job.dataset().empty() ? "default" : job.dataset(); }

int MaxConcurrentJobs(const v1::SitePolicy& policy) { return std::max(1, policy.max_concurrent_jobs()); }

Status SiteAccepts(const v1::PoolHello& hello, const v1::JobSummary& job) {
  auto refuse = [](auto&&... what) { return absl::PermissionDeniedError(absl::StrCat(what...)); };
  const std::string dataset = DatasetOf(job);
  const auto& exposed = hello.datasets();
  if (std::none_of(exposed.begin(), exposed.end(), [&](const v1::PoolDataset& d) { return d.name() == dataset; })) {
    return refuse("exposes no dataset ", Printable(dataset));
  }
  const v1::SitePolicy& p = hello.policy();
  if (!p.given()) return absl::OkStatus();
  const auto& grants = p.datasets();
  auto grant = std::find_if(grants.begin(), grants.end(), [&](const v1::DatasetGrant& g) { return g.dataset() == dataset; });
  if (grant == grants.end()) return refuse("its policy opens dataset ", Printable(dataset), " to no job");
  const auto& who = grant->submitters();
  if (std::find(who.begin(), who.end(), "*") == who.end() && std::find(who.begin(), who.end(), job.submitter()) == who.end()) {
    return refuse("its policy does not let ", Printable(job.submitter()), " use dataset ", Printable(dataset));
  }
  if (p.models_size() > 0 && std::find(p.models().begin(), p.models().end(), job.model()) == p.models().end()) {
    return refuse("its policy accepts models ", absl::StrJoin(p.models(), ", "), ", not ", Printable(job.model()));
  }
  if (p.max_parameters() > 0 && job.parameters() > p.max_parameters()) {
    return refuse("a model of ", job.parameters(), " parameters; its policy accepts at most ", p.max_parameters());
  }
  if (p.max_rounds() > 0 && job.rounds() > p.max_rounds()) {
    return refuse(job.rounds(), " rounds; its policy accepts at most ", p.max_rounds());
  }
  if (p.require_secure_aggregation() && !job.secure_aggregation()) {
    return refuse("its policy requires secure aggregation (secure_aggregation.enabled)");
  }
  if (p.max_dp_epsilon() > 0 && !(job.dp() && job.dp_epsilon() > 0 && job.dp_epsilon() <= p.max_dp_epsilon())) {
    return refuse("its policy requires DP with dp.target_epsilon at most ", p.max_dp_epsilon());
  }
  return absl::OkStatus();
}

}  // namespace cleave
