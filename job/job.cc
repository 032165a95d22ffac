#include "job/job.h"

#include "absl/strings/str_cat.h"
#include "aggregation/registry.h"
#include "models/names.h"
#include "server/round_registry.h"
#include "server/selection.h"
#include "split/names.h"

namespace cleave {

Status CheckJob(JobConfig& c) {
  ASSIGN_OR_RETURN(const StrategyKind* strategy, Strategies().Get(c.strategy.name));
  if (!c.strategy.server_lr_given) c.strategy.server_lr = strategy->default_server_lr;
  RETURN_IF_ERROR(RuleNames().Check(c.aggregation.rule));
  if (c.split.enabled()) RETURN_IF_ERROR(SplitModeNames().Check(c.split.mode));
  RETURN_IF_ERROR(LossNames().Check(c.train.loss));
  RETURN_IF_ERROR(OptimizerNames().Check(c.train.optimizer));
  RETURN_IF_ERROR(SchedulerModeNames().Check(c.scheduler.mode));
  RETURN_IF_ERROR(SelectionNames().Check(c.clients.selection));
  return CheckCombinations(c);
}

StatusOr<JobConfig> ParseJob(const std::string& yaml_text, const std::string& base_dir) {
  ASSIGN_OR_RETURN(JobConfig c, JobConfig::ParseYaml(yaml_text, base_dir));
  RETURN_IF_ERROR(CheckJob(c));
  return c;
}

StatusOr<JobConfig> LoadJob(const std::string& path) {
  ASSIGN_OR_RETURN(JobConfig c, JobConfig::LoadYaml(path));
  if (Status s = CheckJob(c); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return c;
}

}  // namespace cleave
