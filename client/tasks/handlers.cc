// Client: which handler runs a task (one per task kind, each in its own file under
// client/tasks/), and the helpers they share.
#include "client/client_impl.h"

#include <chrono>

#include "core/fit.h"
#include "proto/train_config.h"

namespace cleave {

uint64_t BatchSeed(const v1::Task& task, const v1::Welcome& w, const std::string& name) {
  return task.train().seed() ^ std::hash<std::string>{}(name.empty() ? w.client_id() : name);
}

ParameterSet Delta(ParameterSet trained, const ParameterSet& base) {
  for (size_t i = 0; i < trained.size(); ++i) {
    auto& d = trained.mutable_tensors()[i].values;
    const auto& g = base.tensors()[i].values;
    for (size_t j = 0; j < d.size(); ++j) d[j] -= g[j];
  }
  return trained;
}

const std::vector<Client::Impl::TaskHandler>& Client::Impl::TaskHandlers() {
  static const std::vector<TaskHandler> handlers = {
      {"edge", [](const ClientOptions& o, const v1::Task&) { return static_cast<bool>(o.aggregate); },
       &Impl::HandleEdgeTask},
      {"external split", [](const ClientOptions& o, const v1::Task& t) { return o.external.split && t.has_split(); },
       &Impl::HandleExternalSplitTask},
      {"external", [](const ClientOptions& o, const v1::Task&) { return static_cast<bool>(o.external.fit); },
       &Impl::HandleExternalTask},
      {"gossip", [](const ClientOptions&, const v1::Task& t) { return t.has_gossip(); },
       &Impl::HandleGossipTask},
      {"split", [](const ClientOptions&, const v1::Task& t) { return t.has_split(); },
       &Impl::HandleSplitTask},
      {"evaluation", [](const ClientOptions&, const v1::Task& t) { return t.evaluate_only(); },
       &Impl::HandleEvaluationTask},
      {"training", [](const ClientOptions&, const v1::Task&) { return true; },
       &Impl::HandleTrainingTask},
  };
  return handlers;
}

Status Client::Impl::HandleTask(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                const v1::Task& task,
                                const std::function<void(const v1::TaskAck&)>& ack,
                                const NextMessage& next, bool* crashed) {
  const TaskCall call{stub, w, task, ack, next, crashed};
  // What the server asks this device to train with, checked before anything uses it (a
  // batch of 0 divided by zero).
  if (task.has_train()) {
    if (Status s = CheckFit(FitFromProto(task.train()), "the task's train settings"); !s.ok()) return call.Reject(s);
  }
  const bool trains = !task.evaluate_only();
  if (trains && opts.may_train) {
    if (Status s = opts.may_train(); !s.ok()) return call.Reject(s);
  }
  const auto start = std::chrono::steady_clock::now();
  for (const TaskHandler& h : TaskHandlers()) {
    if (!h.matches(opts, task)) continue;
    const Status s = (this->*h.run)(call);
    if (s.ok() && trains && opts.trained) {
      opts.trained(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return s;
  }
  return call.Reject(absl::InternalError("no handler for the task"));
}

}  // namespace cleave
