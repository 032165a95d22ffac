// A whole job: every section of the YAML, each read and checked by the module that owns
// it, then the rules that combine modules. Every program and test that reads a job config
// reads it through here.
//
//   core/config_section   reading one section: keys, types, unknown keys (knows no module)
//   MODULE/options.h      a module's section(s): the options struct with its defaults, a
//                         Read and a Check (ranges, the names its registries hold)
//   job/job.cc            the sections, registered one line each
//   job/registered_names.cc  the names a section picks from a registry above its module
//   job/rules.cc          the cross-module rules ("X does not combine with Y"), all in
//                         one place
//
// Codecs (compression.*) are checked where they are built, once the server knows each
// one's direction (Coordinator::Init names the key). Errors are INVALID_ARGUMENT naming
// the key; LoadJob's start with the file's path.
#pragma once

#include <string>
#include <vector>

#include "core/config_section.h"
#include "core/device_trace.h"
#include "core/status.h"
#include "server/options.h"

namespace cleave {

// What `cleave local` and `cleave simulate` read: the clients they start.
struct LocalConfig {
  std::string data = "fmnist:/usr/share/datasets/fashion-mnist";  // local.data
  std::string partition = "iid";  // local.partition: iid | dirichlet:A | shards:S | labels:K
  uint64_t partition_seed = 42;   // local.partition_seed
  int clients = 10;               // local.clients: default for `cleave local --clients`
  // local.holdout: the fraction of its data each client keeps to evaluate the global
  // model (federated evaluation, cleave-client --holdout); 0 = none
  double holdout = 0;
  // local.attack: what the attackers do (AttackNames(), client/attacks.h); "" = none
  std::string attack;
  int attackers = 0;              // local.attackers: the last this many clients attack
  // local.split_guard: every client runs SplitGuard (cleave-client --split-guard) on its
  // sl and sfl split tasks, refusing a server that hijacks training
  bool split_guard = false;
  // local.profiles: device profiles given to the clients in turn (client i gets
  // profiles[i % size]); empty = no emulation.
  std::vector<DeviceEmulation> profiles;
  // local.trace: a device trace file (core/device_trace.h: speed, links and online
  // windows per client); replaces local.profiles. Empty = none.
  std::string trace;
};

void ReadLocal(ConfigSection& s, LocalConfig& c);
Status CheckLocal(LocalConfig& c);

// The federation the server runs, and the clients `cleave local` starts.
struct JobConfig : FederationConfig {
  LocalConfig local;
};

// Reads every section (an unknown key or section is an error), then CheckJob.
// `base_dir` resolves relative paths (model.path, model.weights, train.loss_path).
StatusOr<JobConfig> ParseJob(const std::string& yaml_text, const std::string& base_dir = "");
// ParseJob of the file at `path`; errors start with the path.
StatusOr<JobConfig> LoadJob(const std::string& path);

// Every section's Check (ranges, registered names, the defaults that depend on them such
// as strategy.server_lr), then CheckCombinations: for a config built in code too.
Status CheckJob(JobConfig& config);

// The choices of sections whose module sits below the registry that holds them
// (job/registered_names.cc): train.loss and train.optimizer (models' registries, the
// train section being core's), scheduler.mode and clients.selection (the server's,
// whose options the job layer reads before any server exists).
Status CheckRegisteredNames(const JobConfig& config);

// The rules that combine modules (job/rules.cc): each refusal says why the combination
// is unsound.
Status CheckCombinations(const JobConfig& config);

// Every key a job may set, as SECTION.KEY (local.profiles[].KEY for a profile's), with
// its default rendered as YAML writes it ("" for a nested section's own key).
std::vector<ConfigSection::Key> JobKeys();

}  // namespace cleave
