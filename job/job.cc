#include "job/job.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/attacks.h"

namespace cleave {

void ReadLocal(ConfigSection& s, LocalConfig& c) {
  s.Read("data", c.data);
  s.Read("partition", c.partition);
  s.Read("partition_seed", c.partition_seed);
  s.Read("clients", c.clients);
  s.Read("holdout", c.holdout);
  s.Read("attack", c.attack);
  s.Read("attackers", c.attackers);
  s.Read("split_guard", c.split_guard);
  s.Read("trace", c.trace);
  s.ForEach("profiles", [&c](ConfigSection& p) {
    DeviceEmulation d;
    p.Read("uplink_mbps", d.uplink_mbps);
    p.Read("downlink_mbps", d.downlink_mbps);
    p.Read("slowdown", d.slowdown);
    p.Read("memory_limit_mb", d.memory_limit_mb);
    if (p.given()) c.profiles.push_back(d);
  });
}

Status CheckLocal(LocalConfig& c) {
  if (!c.attack.empty()) RETURN_IF_ERROR(AttackNames().Check(c.attack));
  RETURN_IF_ERROR(Range(c.attackers >= 0 && (c.attackers == 0 || !c.attack.empty()),
                        "local.attackers", ">= 0, with local.attack set"));
  for (const DeviceEmulation& d : c.profiles) {
    RETURN_IF_ERROR(Range(d.uplink_mbps >= 0 && d.downlink_mbps >= 0,
                          "local.profiles[].uplink_mbps/downlink_mbps", ">= 0"));
    RETURN_IF_ERROR(Range(d.slowdown >= 1, "local.profiles[].slowdown", ">= 1"));
    RETURN_IF_ERROR(Range(d.memory_limit_mb >= 0, "local.profiles[].memory_limit_mb", ">= 0"));
  }
  RETURN_IF_ERROR(Range(c.clients >= 1, "local.clients", ">= 1"));
  return Range(c.holdout >= 0 && c.holdout <= 0.9, "local.holdout", "in [0, 0.9]");
}

namespace {

// One section of the job: where it lives in JobConfig and how its module reads and
// checks it.
struct JobSection {
  std::string name;
  std::function<void(ConfigSection&, JobConfig&)> read;
  std::function<Status(JobConfig&)> check;
};

template <typename T, typename Owner>
JobSection Section(std::string name, T Owner::*field, void (*read)(ConfigSection&, T&),
                   Status (*check)(T&) = nullptr) {
  return {std::move(name), [field, read](ConfigSection& s, JobConfig& c) { read(s, c.*field); },
          [field, check](JobConfig& c) { return check ? check(c.*field) : absl::OkStatus(); }};
}

// Every section, one line each, in the order they are checked.
const std::vector<JobSection>& Sections() {
  static const auto* sections = new std::vector<JobSection>{
      Section("run", &JobConfig::run, ReadRun, CheckRun),
      Section("model", &JobConfig::model, ReadModel, CheckModel),
      Section("data", &JobConfig::data, ReadData, CheckData),
      Section("clients", &JobConfig::clients, ReadClients, CheckClients),
      Section("scheduler", &JobConfig::scheduler, ReadScheduler, CheckScheduler),
      Section("train", &JobConfig::train, ReadTrain, CheckTrain),
      Section("strategy", &JobConfig::strategy, ReadStrategy, CheckStrategy),
      Section("split", &JobConfig::split, ReadSplit, CheckSplit),
      Section("compression", &JobConfig::compression, ReadCompression),
      Section("server", &JobConfig::server, ReadServer, CheckServer),
      Section("tls", &JobConfig::tls, ReadTls, CheckTls),
      Section("auth", &JobConfig::auth, ReadAuth),
      Section("secure_aggregation", &JobConfig::secure_aggregation, ReadSecureAggregation,
              CheckSecureAggregation),
      Section("dp", &JobConfig::dp, ReadDp, CheckDp),
      Section("aggregation", &JobConfig::aggregation, ReadAggregation, CheckAggregation),
      Section("width", &JobConfig::width, ReadWidth, CheckWidth),
      Section("local", &JobConfig::local, ReadLocal, CheckLocal),
  };
  return *sections;
}

// Reads every section of `root` into `c`; an unknown key anywhere is an error.
Status ReadSections(ConfigSection& root, JobConfig& c) {
  for (const JobSection& section : Sections()) {
    ConfigSection s = root.Section(section.name);
    section.read(s, c);
    RETURN_IF_ERROR(s.Finish());
  }
  return root.Finish();
}

}  // namespace

Status CheckJob(JobConfig& c) {
  for (const JobSection& section : Sections()) RETURN_IF_ERROR(section.check(c));
  RETURN_IF_ERROR(CheckRegisteredNames(c));
  return CheckCombinations(c);
}

StatusOr<JobConfig> ParseJob(const std::string& yaml_text, const std::string& base_dir) {
  ASSIGN_OR_RETURN(ConfigSection root, ConfigSection::Parse(yaml_text, base_dir));
  JobConfig c;
  RETURN_IF_ERROR(ReadSections(root, c));
  // A job without a test set evaluates nothing on the server.
  if (c.data.test.empty()) c.server.evaluate = false;
  RETURN_IF_ERROR(CheckJob(c));
  return c;
}

StatusOr<JobConfig> LoadJob(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto c = ParseJob(text.str(), std::filesystem::path(path).parent_path().string());
  if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  return c;
}

std::vector<ConfigSection::Key> JobKeys() {
  ConfigSection root;
  JobConfig c;
  for (const JobSection& section : Sections()) {
    ConfigSection s = root.Section(section.name);
    section.read(s, c);
  }
  std::vector<ConfigSection::Key> keys;
  for (ConfigSection::Key& k : root.Keys()) {
    if (k.name.find('.') != std::string::npos) keys.push_back(std::move(k));  // not a section
  }
  return keys;
}

}  // namespace cleave
