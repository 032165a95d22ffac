// A whole job: the YAML read and range-checked by core (JobConfig::ParseYaml), then
// checked against what the modules register and against the rules that combine
// modules. Every program and test that reads a job config reads it through here.
//
//   core/config   every section's keys, types, ranges, defaults (knows no module)
//   job           the choices modules register: strategy.name, aggregation.rule,
//                 split.mode, train.loss, train.optimizer; the defaults
//                 that depend on them (strategy.server_lr); the cross-module rules
//                 (job/rules.cc: "X does not combine with Y"), all in one place
//
// Codecs (compression.*) are checked where they are built, once the server knows each
// one's direction (Coordinator::Init names the key). Errors are INVALID_ARGUMENT naming
// the key; LoadJob's start with the file's path.
#pragma once

#include <string>

#include "core/config.h"
#include "core/status.h"

namespace cleave {

StatusOr<JobConfig> ParseJob(const std::string& yaml_text, const std::string& base_dir = "");
StatusOr<JobConfig> LoadJob(const std::string& path);

// The module-level checks and defaults ParseJob applies after ParseYaml: for a config
// built in code. Fills strategy.server_lr from the strategy's default unless given.
Status CheckJob(JobConfig& config);

// The rules that combine modules (job/rules.cc): each refusal says why the combination
// is unsound.
Status CheckCombinations(const JobConfig& config);

}  // namespace cleave
