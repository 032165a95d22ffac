#include "job/job.h"
#include "models/names.h"
#include "server/rounds/round_registry.h"
#include "server/rounds/selection.h"

namespace cleave {

Status CheckRegisteredNames(const JobConfig& c) {
  RETURN_IF_ERROR(LossNames().Check(c.train.loss));
  RETURN_IF_ERROR(OptimizerNames().Check(c.train.optimizer));
  RETURN_IF_ERROR(SchedulerModeNames().Check(c.scheduler.mode));
  return SelectionNames().Check(c.clients.selection);
}

}  // namespace cleave
