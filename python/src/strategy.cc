#include "python/src/strategy.h"

#include <pybind11/stl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "aggregation/accumulate.h"
#include "core/fit.h"

namespace cleave::python {
namespace {

// A strategy whose decisions are a Python object's (cleave.Strategy's shape): which
// clients train with what (configure_fit), the round's aggregate from the results
// (aggregate_fit), the federated evaluation's figures (aggregate_evaluate) and the
// server's own measure of each new model (evaluate). What it does not define, the job's
// built-in strategy does (`fallback`). Results are kept whole until the round ends (as
// robust rules keep them): aggregate_fit sees every client's parameters.
class PythonStrategy : public Strategy {
 public:
  // Called with the GIL held.
  PythonStrategy(py::object strategy, std::unique_ptr<Strategy> fallback)
      : py_(Held(std::move(strategy))), fallback_(std::move(fallback)) {
    py::object base = py::module_::import("cleave.server").attr("Strategy");
    for (const char* method :
         {"configure_fit", "configure_evaluate", "aggregate_evaluate", "evaluate", "state", "load_state"}) {
      // Its own method, not cleave.Strategy's placeholder.
      if (!py::hasattr(*py_, method)) continue;
      const py::object mine = py_->get_type().attr(method), placeholder = py::getattr(base, method, py::none());
      if (!mine.is(placeholder)) {
        defines_.insert(method);
      }
    }
  }

  std::string name() const override {
    py::gil_scoped_acquire gil;
    return "python:" + std::string(py::str(py_->get_type().attr("__name__")));
  }

  // Each decision through Python, guarded: what the strategy's code throws (pybind11's
  // type errors on what it returned among them) ends the run or is refused, saying so.
  using Strategy::ConfigureRound;
  RoundPlan ConfigureRound(int64_t round, const std::vector<std::string>& available,
                           const ClientSampler& sample) override {
    try {
      return ConfigureRoundPy(round, available, sample);
    } catch (const std::exception& e) {
      py::gil_scoped_acquire gil;  // a Python error among them is read with it held
      RoundPlan plan;
      plan.stop_reason = absl::StrCat("configure_fit or configure_evaluate: ", e.what());
      return plan;
    }
  }
  Status FinishRound(int num_failures, ParameterSet* global) override {
    return Guarded("aggregate_fit or evaluate", [&] { return FinishRoundPy(num_failures, global); });
  }
  EvaluationSummary AggregateEvaluation(int64_t round, const std::vector<ClientEvaluationResult>& results) override {
    try {
      return AggregateEvaluationPy(round, results);
    } catch (const std::exception& e) {
      py::gil_scoped_acquire gil;
      spdlog::warn("round {}: aggregate_evaluate: {}; the built-in evaluation summary stands", round, e.what());
      stats_["aggregate_evaluate_failed"] = 1;
      return SummariseEvaluations(results);
    }
  }

  RoundPlan ConfigureRoundPy(int64_t round, const std::vector<std::string>& available, const ClientSampler& sample) {
    round_ = round;
    RoundPlan plan = fallback_->ConfigureRound(round, available, sample);
    py::gil_scoped_acquire gil;
    if (!Defines("configure_fit")) return plan;
    try {
      py::object chosen = py_->attr("configure_fit")(round, available);
      if (chosen.is_none()) return plan;
      plan.clients.clear();
      plan.client_fit.clear();
      for (py::handle item : chosen) {
        if (py::isinstance<py::str>(item)) {
          plan.clients.push_back(item.cast<std::string>());
          continue;
        }
        auto pair = item.cast<py::tuple>();
        const std::string id = pair[0].cast<std::string>();
        plan.clients.push_back(id);
        FitSettings fit = plan.fit;
        py::dict c = pair[1].cast<py::dict>();
        if (c.contains("lr")) fit.lr = c["lr"].cast<double>();
        if (c.contains("local_epochs")) fit.local_epochs = c["local_epochs"].cast<int>();
        if (c.contains("local_steps")) fit.local_steps = c["local_steps"].cast<int64_t>();
        if (c.contains("batch_size")) fit.batch_size = c["batch_size"].cast<int>();
        if (c.contains("momentum")) fit.momentum = c["momentum"].cast<double>();
        if (c.contains("weight_decay")) fit.weight_decay = c["weight_decay"].cast<double>();
        if (c.contains("proximal_mu")) fit.proximal_mu = c["proximal_mu"].cast<double>();
        if (Status s = CheckFit(fit, absl::StrCat("configure_fit's config for ", id)); !s.ok()) {
          plan = RoundPlan();
          plan.stop_reason = std::string(s.message());
          return plan;
        }
        plan.client_fit[id] = fit;
      }
    } catch (py::error_already_set& e) {
      plan = RoundPlan();
      plan.stop_reason = absl::StrCat("the strategy's configure_fit raised ", e.what());
    } catch (const std::exception& e) {  // pybind11's cast and type errors, bad_alloc
      plan = RoundPlan();
      plan.stop_reason = absl::StrCat("configure_fit must return client ids or (id, config) pairs: ", e.what());
    }
    if (plan.clients.empty() && plan.stop_reason.empty()) {
      plan.stop_reason = absl::StrCat("configure_fit chose no client for round ", round);
    }
    if (plan.stop_reason.empty() && Defines("configure_evaluate")) ConfigureEvaluation(round, plan);
    std::set<std::string> chosen;
    std::string why;  // made before the plan is reset: `id` is one of its clients
    for (const std::string& id : plan.clients) {
      if (std::find(available.begin(), available.end(), id) == available.end()) {
        why = absl::StrCat("configure_fit chose ", id, ", which is not an available client");
      } else if (!chosen.insert(id).second) {
        why = absl::StrCat("configure_fit chose ", id, " twice");
      }
      if (!why.empty()) break;
    }
    if (!why.empty()) {
      plan = RoundPlan();
      plan.stop_reason = std::move(why);
    }
    return plan;
  }

  // Who of the round's clients measures the global model before training, with what
  // (configure_evaluate: ids or (id, config) pairs of the clients that train; None: all).
  void ConfigureEvaluation(int64_t round, RoundPlan& plan) {
    std::string why;
    try {
      py::object chosen = py_->attr("configure_evaluate")(round, plan.clients);
      if (chosen.is_none()) return;
      std::map<std::string, std::string> evaluators;
      py::module_ json = py::module_::import("json");
      for (py::handle item : chosen) {
        std::string id, config = "{}";
        if (py::isinstance<py::str>(item)) {
          id = item.cast<std::string>();
        } else {
          auto pair = item.cast<py::tuple>();
          id = pair[0].cast<std::string>();
          config = json.attr("dumps")(pair[1].cast<py::dict>(), py::arg("allow_nan") = false).cast<std::string>();
        }
        if (std::find(plan.clients.begin(), plan.clients.end(), id) == plan.clients.end()) {
          why = absl::StrCat("configure_evaluate chose ", id, ", which does not train this round");
        } else if (!evaluators.emplace(id, config).second) {
          why = absl::StrCat("configure_evaluate chose ", id, " twice");
        } else if (config.size() > kMaxEvaluateConfigBytes) {
          why = absl::StrCat("configure_evaluate's config for ", id, " is over ", kMaxEvaluateConfigBytes, " bytes");
        }
        if (!why.empty()) break;
      }
      if (why.empty()) plan.evaluators = std::move(evaluators);
    } catch (py::error_already_set& e) {
      why = absl::StrCat("the strategy's configure_evaluate raised ", e.what());
    } catch (const std::exception& e) {  // pybind11's cast and type errors, bad_alloc
      why = absl::StrCat("configure_evaluate must return client ids or (id, config) pairs: ", e.what());
    }
    if (!why.empty()) {
      plan = RoundPlan();
      plan.stop_reason = why;
    }
  }

  RoundPlan ConfigureBuffer(int64_t version) override {
    RoundPlan plan = fallback_->ConfigureBuffer(version);
    plan.stop_reason = "a Python strategy aggregates synchronous rounds only (scheduler.mode: sync)";
    return plan;
  }

  void BeginRound(const ParameterSet& global, int shards) override {
    start_ = global;
    shards_.assign(static_cast<size_t>(std::max(1, shards)), {});
    count_ = 0;
  }

  void Accumulate(const ClientUpdate& update, int shard) override {
    Result r;
    r.name = update.client_name.empty() ? update.client_id : update.client_name;
    r.weight = update.weight;
    r.train_loss = update.train_loss;
    r.parameters = start_;  // start + delta: the parameters the client trained to
    AddScaled(update.delta, 1.0f, &r.parameters);
    shards_[shard].push_back(std::move(r));
    ++count_;
  }

  int accumulated() const override { return count_; }

  Status FinishRoundPy(int num_failures, ParameterSet* global) {
    if (count_ == 0) return absl::FailedPreconditionError("no results this round");
    stats_.clear();
    py::gil_scoped_acquire gil;
    py::module_ types = py::module_::import("types");
    py::list results, failures;
    for (auto& shard : shards_) {
      for (Result& r : shard) {
        py::dict metrics;
        metrics["train_loss"] = r.train_loss;
        py::object fit_res = types.attr("SimpleNamespace")(py::arg("parameters") = OwnedArrays(std::move(r.parameters)),
                                                           py::arg("num_examples") = r.weight,
                                                           py::arg("metrics") = metrics);
        results.append(py::make_tuple(r.name, fit_res));
      }
    }
    shards_.clear();
    for (int i = 0; i < num_failures; ++i) {
      failures.append(py::module_::import("builtins").attr("RuntimeError")("a client's task failed"));
    }
    ParameterSet next = *global;
    try {
      py::tuple out = py_->attr("aggregate_fit")(round_, results, failures).cast<py::tuple>();
      if (out.size() != 2) return absl::InvalidArgumentError("aggregate_fit must return (parameters, metrics)");
      if (out[0].is_none()) return absl::OkStatus();  // Flower's "no new model": keep it
      py::sequence params = out[0].cast<py::sequence>();
      if (py::len(params) != next.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("aggregate_fit returned ", py::len(params), " parameters; the model has ", next.size()));
      }
      for (size_t t = 0; t < next.size(); ++t) {
        ASSIGN_OR_RETURN(py::array a, AsFloatArray(params[t], t));
        Tensor& tensor = next.mutable_tensors()[t];
        if (std::vector<int64_t>(a.shape(), a.shape() + a.ndim()) != tensor.shape) {
          return absl::InvalidArgumentError(absl::StrCat("aggregate_fit's parameter ", t, " is not ", tensor.name,
                                                         "'s shape"));
        }
        const float* v = static_cast<const float*>(a.data());
        for (size_t i = 0; i < tensor.values.size(); ++i) {
          if (!std::isfinite(v[i])) return absl::InvalidArgumentError(absl::StrCat("aggregate_fit's ", tensor.name, " is not finite"));
          tensor.values[i] = v[i];
        }
      }
      for (auto [k, v] : out[1].cast<py::dict>()) {
        if (py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)) stats_["fit_" + std::string(py::str(k))] = v.cast<double>();
      }
      if (Defines("evaluate")) {  // the server's own measure of the new model
        py::object e = py_->attr("evaluate")(round_, OwnedArrays(next));
        if (!e.is_none()) {
          py::tuple le = e.cast<py::tuple>();
          if (le.size() != 2) return absl::InvalidArgumentError("evaluate must return (loss, metrics) or None");
          ASSIGN_OR_RETURN(stats_["evaluate_loss"], Figure("evaluate's loss", le[0].cast<double>()));
          for (auto [k, v] : le[1].cast<py::dict>()) {
            if (py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)) {
              const std::string key = py::str(k);
              ASSIGN_OR_RETURN(stats_["evaluate_" + key], Figure("evaluate's " + key, v.cast<double>()));
            }
          }
        }
      }
    } catch (py::error_already_set& e) {
      return absl::InvalidArgumentError(absl::StrCat("the strategy raised ", e.what()));
    } catch (const std::exception& e) {  // pybind11's cast and type errors, bad_alloc
      return absl::InvalidArgumentError(absl::StrCat("the strategy returned the wrong types: ", e.what()));
    }
    *global = std::move(next);
    return absl::OkStatus();
  }

  EvaluationSummary AggregateEvaluationPy(int64_t round, const std::vector<ClientEvaluationResult>& results) {
    EvaluationSummary summary = SummariseEvaluations(results);
    py::gil_scoped_acquire gil;
    if (!Defines("aggregate_evaluate")) return summary;
    py::module_ types = py::module_::import("types");
    py::list rs;
    for (const ClientEvaluationResult& r : results) {
      py::dict metrics;
      metrics["accuracy"] = r.accuracy;
      for (const auto& [k, v] : r.metrics) metrics[py::str(k)] = v;
      rs.append(py::make_tuple(r.client_name, types.attr("SimpleNamespace")(py::arg("loss") = r.loss,
                                                                            py::arg("num_examples") = r.examples,
                                                                            py::arg("metrics") = metrics)));
    }
    try {
      py::tuple out = py_->attr("aggregate_evaluate")(round, rs, py::list()).cast<py::tuple>();
      if (out.size() != 2) throw py::cast_error("aggregate_evaluate must return (loss, metrics)");
      // Checked whole before any of it is taken: a bad figure leaves the built-in summary.
      EvaluationSummary mine = summary;
      Status bad;
      if (!out[0].is_none()) {
        auto loss = Figure("aggregate_evaluate's loss", out[0].cast<double>());
        if (loss.ok()) mine.loss = *loss; else bad = loss.status();
      }
      for (auto [k, v] : out[1].cast<py::dict>()) {
        const std::string key = py::str(k);
        if (key != "accuracy" && !py::isinstance<py::float_>(v) && !py::isinstance<py::int_>(v)) continue;
        auto value = Figure("aggregate_evaluate's " + key, v.cast<double>());
        if (value.ok() && key == "accuracy" && (*value < 0 || *value > 1)) {
          value = absl::InvalidArgumentError(absl::StrCat("aggregate_evaluate's accuracy is ", *value, ", not in [0, 1]"));
        }
        if (!value.ok()) {
          bad = value.status();
        } else if (key == "accuracy") {
          mine.accuracy = *value;
        } else {
          mine.metrics[key] = *value;
        }
      }
      if (!bad.ok()) {
        spdlog::warn("round {}: {}; the built-in evaluation summary stands", round, std::string(bad.message()));
        stats_["aggregate_evaluate_failed"] = 1;
        return summary;
      }
      return mine;
    } catch (py::error_already_set&) {
      stats_["aggregate_evaluate_failed"] = 1;  // the built-in summary stands
    } catch (const std::exception&) {
      stats_["aggregate_evaluate_failed"] = 1;
    }
    return summary;
  }

  // The strategy's own state (state(): {name: array of numbers}), kept as float32 tensors
  // in the checkpoint and before each round (a round that fails is undone with it).
  ParameterSet State() const override {
    if (!Defines("state")) return ParameterSet();
    py::gil_scoped_acquire gil;
    ParameterSet out;
    Status bad;
    try {
      py::module_ np = py::module_::import("numpy");
      for (auto [k, v] : py_->attr("state")().cast<py::dict>()) {
        py::array a = np.attr("ascontiguousarray")(v, py::arg("dtype") = "float32").cast<py::array>();
        Tensor t{"py/" + std::string(py::str(k)), std::vector<int64_t>(a.shape(), a.shape() + a.ndim()), {}};
        const float* p = static_cast<const float*>(a.data());
        t.values.assign(p, p + a.size());
        bad.Update(out.Add(std::move(t)));
      }
    } catch (py::error_already_set& e) {
      bad = absl::InvalidArgumentError(absl::StrCat("the strategy's state() raised ", e.what()));
    } catch (const std::exception& e) {  // pybind11's cast and type errors, bad_alloc
      bad = absl::InvalidArgumentError(absl::StrCat("state() must return {name: array of numbers}: ", e.what()));
    }
    if (!bad.ok()) {  // kept as none: load_state then gets nothing to restore
      spdlog::error("{}", std::string(bad.message()));
      return ParameterSet();
    }
    return out;
  }
  Status Restore(const ParameterSet& state) override {
    if (state.size() == 0) return absl::OkStatus();
    if (!Defines("load_state")) {
      return absl::FailedPreconditionError("the checkpoint holds the strategy's state, and it has no load_state()");
    }
    py::gil_scoped_acquire gil;
    try {
      py::dict saved;
      for (const Tensor& t : state.tensors()) {
        if (t.name.rfind("py/", 0) != 0) return absl::InvalidArgumentError("not a Python strategy's state: " + t.name);
        saved[py::str(t.name.substr(3))] = py::array_t<float>(std::vector<py::ssize_t>(t.shape.begin(), t.shape.end()),
                                                              t.values.data());  // a copy of its own
      }
      py_->attr("load_state")(saved);
    } catch (py::error_already_set& e) {
      return absl::InvalidArgumentError(absl::StrCat("the strategy's load_state() raised ", e.what()));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("load_state(): ", e.what()));
    }
    return absl::OkStatus();
  }
  std::map<std::string, double> RoundStats() const override { return stats_; }
  // Whether the object has its own `method` (not cleave.Strategy's placeholder).
  bool Defines(const std::string& method) const { return defines_.count(method) > 0; }

 private:
  struct Result {
    std::string name;
    int64_t weight = 0;
    double train_loss = 0;
    ParameterSet parameters;
  };
  // A figure a strategy returned, which metrics and reports take as a number.
  static StatusOr<double> Figure(const std::string& what, double v) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat(what, " is ", v, ", not a finite number"));
    return v;
  }

  std::shared_ptr<py::object> py_;
  std::set<std::string> defines_;  // which of the optional methods the object has
  std::unique_ptr<Strategy> fallback_;
  int64_t round_ = 0;
  ParameterSet start_;
  std::vector<std::vector<Result>> shards_;
  std::atomic<int> count_{0};
  std::map<std::string, double> stats_;
};

}  // namespace

StatusOr<std::unique_ptr<Strategy>> MakePythonStrategy(const py::object& strategy, std::unique_ptr<Strategy> fallback) {
  auto s = std::make_unique<PythonStrategy>(strategy, std::move(fallback));
  if (s->Defines("state") != s->Defines("load_state")) {
    return absl::InvalidArgumentError("a strategy's state() and load_state() go together: define both or neither");
  }
  return std::unique_ptr<Strategy>(std::move(s));
}

}  // namespace cleave::python
