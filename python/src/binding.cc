// cleave._cleave: the native half of the Python package (python/cleave/). A client
// whose training and evaluation are Python callables (ClientOptions::external) runs the
// C++ client's whole protocol, TLS to heartbeats; the global model reaches Python as
// NumPy arrays and the trained arrays are read in place (TensorView), not copied. A
// server runs the C++ coordinator in this process, calling a Python strategy's methods
// (PythonStrategy) for its decisions only.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aggregation/accumulate.h"
#include "aggregation/strategy.h"
#include "cleave/v1/cleave.pb.h"
#include "client/client.h"
#include "client/split_client.h"
#include "core/files.h"
#include "core/fit.h"
#include "job/job.h"
#include "server/options.h"
#include "server/server.h"

namespace py = pybind11;

namespace cleave {
namespace {

// Bytes of trained parameters copied on their way from Python to the upload: only a
// non-contiguous array is (made contiguous once); float32 arrays in C order are read
// where they are.
std::atomic<int64_t> g_copied_bytes{0};
// Whether this process has run a client or a server (and so gRPC's threads): forking it
// then is unsafe (cleave.run_local refuses).
std::atomic<bool> g_grpc_started{false};

// The global model as read-only NumPy float32 arrays over its values (no copy), which
// keep it alive. Read-only: the update is computed from the same values after fit.
py::list ToArrays(const ClientOptions::External::Global& global) {
  auto* held = new ClientOptions::External::Global(global);
  py::capsule owner(held, [](void* p) { delete static_cast<ClientOptions::External::Global*>(p); });
  py::list out;
  for (const Tensor& t : global->tensors()) {
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    py::array_t<float> a(shape, t.values.data(), owner);
    a.attr("setflags")(py::arg("write") = false);
    out.append(std::move(a));
  }
  return out;
}

// `set`'s tensors as NumPy float32 arrays over its values, which they own from now on
// (a caller that keeps `set` passes a copy).
py::list OwnedArrays(ParameterSet set) {
  auto* held = new ParameterSet(std::move(set));
  py::capsule owner(held, [](void* p) { delete static_cast<ParameterSet*>(p); });
  py::list out;
  for (Tensor& t : held->mutable_tensors()) {
    out.append(py::array_t<float>(std::vector<py::ssize_t>(t.shape.begin(), t.shape.end()), t.values.data(), owner));
  }
  return out;
}

// What fit and evaluate get as `config` (Flower's names where it has them).
py::dict ConfigOf(const v1::Task& task) {
  py::dict c;
  c["server_round"] = task.round();
  c["round"] = task.round();
  c["local_epochs"] = task.train().local_epochs();
  c["local_steps"] = task.train().local_steps();
  c["batch_size"] = task.train().batch_size();
  c["lr"] = task.train().lr();
  c["momentum"] = task.train().momentum();
  c["weight_decay"] = task.train().weight_decay();
  c["proximal_mu"] = task.train().proximal_mu();
  c["optimizer"] = task.train().optimizer().empty() ? "sgd" : task.train().optimizer();
  c["seed"] = task.train().seed();
  return c;
}

// The Python error of a callable as a status that fails the task, message kept.
Status PythonError(const char* what, py::error_already_set& e) {
  return absl::InvalidArgumentError(absl::StrCat(what, " raised ", e.what()));
}

// A returned parameter as a contiguous float32 array (a torch tensor through .numpy()).
StatusOr<py::array> AsFloatArray(py::handle value, size_t index) {
  py::object v = py::reinterpret_borrow<py::object>(value);
  if (!py::isinstance<py::array>(v) && py::hasattr(v, "detach") && py::hasattr(v, "numpy")) {
    v = v.attr("detach")().attr("cpu")().attr("numpy")();  // a torch tensor: a view, no copy
  }
  if (!py::isinstance<py::array>(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", index, " is a ", std::string(py::str(v.get_type().attr("__name__"))),
                     ", not a NumPy array or torch tensor"));
  }
  py::array a = v.cast<py::array>();
  if (!a.dtype().is(py::dtype::of<float>())) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", index, " is ", std::string(py::str(a.dtype())), "; the model's are float32"));
  }
  if (!(a.flags() & py::array::c_style)) {
    a = py::module_::import("numpy").attr("ascontiguousarray")(a).cast<py::array>();
    g_copied_bytes += a.nbytes();
  }
  return a;
}

// Runs `f`, a call into Python and the reading of what it returned, with whatever that
// throws (a Python exception, pybind11's cast and type errors, bad_alloc) turned into
// INVALID_ARGUMENT naming `what`: nothing thrown in Python's code crosses into C++'s.
template <typename F>
auto Guarded(const std::string& what, F f) -> decltype(f()) {
  try {
    return f();
  } catch (py::error_already_set& e) {
    py::gil_scoped_acquire gil;  // `f` released it: a Python error is read with it held
    return absl::InvalidArgumentError(absl::StrCat(what, " raised ", e.what()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", e.what()));
  }
}

StatusOr<ClientOptions::ExternalFit> CallFitUnguarded(const py::object& fit, const v1::Task& task,
                                                      const ClientOptions::External::Global& global) {
  py::gil_scoped_acquire gil;
  py::object result;
  try {
    result = fit(ToArrays(global), ConfigOf(task));
  } catch (py::error_already_set& e) {
    return PythonError("fit", e);
  }
  if (!py::isinstance<py::tuple>(result) || py::len(result) != 3) {
    return absl::InvalidArgumentError("fit must return (parameters, num_examples, metrics)");
  }
  py::tuple r = result.cast<py::tuple>();
  if (!py::isinstance<py::sequence>(r[0]) || py::len(r[0]) != global->size()) {
    return absl::InvalidArgumentError(absl::StrCat("fit returned ", py::isinstance<py::sequence>(r[0]) ? py::len(r[0]) : 0,
                                                   " parameters; the model has ", global->size()));
  }
  ClientOptions::ExternalFit out;
  auto keep = std::make_unique<py::list>();
  py::sequence params = r[0].cast<py::sequence>();
  for (size_t i = 0; i < global->size(); ++i) {
    ASSIGN_OR_RETURN(py::array a, AsFloatArray(params[i], i));
    TensorView view;
    view.name = global->tensors()[i].name;
    view.shape.assign(a.shape(), a.shape() + a.ndim());
    view.data = static_cast<const char*>(a.data());
    view.numel = a.size();
    out.parameters.push_back(std::move(view));
    keep->append(a);
  }
  // The arrays live until the update is computed; releasing them takes the GIL.
  out.keep = std::shared_ptr<const void>(keep.release(), [](const void* p) {
    py::gil_scoped_acquire again;
    delete static_cast<const py::list*>(p);
  });
  try {
    out.examples = r[1].cast<int64_t>();
    py::dict metrics = r[2].cast<py::dict>();
    if (metrics.contains("loss")) out.loss = metrics["loss"].cast<double>();
    else if (metrics.contains("train_loss")) out.loss = metrics["train_loss"].cast<double>();
  } catch (py::error_already_set& e) {
    return PythonError("reading fit's num_examples and metrics", e);
  } catch (const std::exception& e) {  // pybind11's cast and type errors, bad_alloc
    return absl::InvalidArgumentError(absl::StrCat("fit's num_examples or metrics: ", e.what()));
  }
  return out;
}

StatusOr<ClientOptions::ExternalFit> CallFit(const py::object& fit, const v1::Task& task,
                                             const ClientOptions::External::Global& global) {
  return Guarded("fit", [&] { return CallFitUnguarded(fit, task, global); });
}

StatusOr<ClientOptions::ExternalEvaluation> CallEvaluateUnguarded(const py::object& evaluate, const v1::Task& task,
                                                                  const ClientOptions::External::Global& global) {
  py::gil_scoped_acquire gil;
  ClientOptions::ExternalEvaluation out;
  try {
    py::dict config = ConfigOf(task);
    // The strategy's configuration for this client's evaluation (configure_evaluate),
    // over the round's: a JSON object from the server, bounded.
    if (!task.evaluate_config().empty()) {
      if (task.evaluate_config().size() > kMaxEvaluateConfigBytes) {
        return absl::InvalidArgumentError("the task's evaluate_config is over 64 KiB");
      }
      py::object extra = py::module_::import("json").attr("loads")(task.evaluate_config());
      if (!py::isinstance<py::dict>(extra)) return absl::InvalidArgumentError("the task's evaluate_config is not an object");
      config.attr("update")(extra);
    }
    py::object result = evaluate(ToArrays(global), config);
    if (!py::isinstance<py::tuple>(result) || py::len(result) != 3) {
      return absl::InvalidArgumentError("evaluate must return (loss, num_examples, metrics)");
    }
    py::tuple r = result.cast<py::tuple>();
    out.loss = r[0].cast<double>();
    out.examples = r[1].cast<int64_t>();
    for (auto [k, v] : r[2].cast<py::dict>()) {
      if (py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)) {
        out.metrics[py::str(k)] = v.cast<double>();
      }
    }
  } catch (py::error_already_set& e) {
    return PythonError("evaluate", e);
  } catch (const std::exception& e) {  // pybind11's cast and type errors, bad_alloc
    return absl::InvalidArgumentError(absl::StrCat("evaluate's loss, num_examples or metrics: ", e.what()));
  }
  if (auto a = out.metrics.find("accuracy"); a != out.metrics.end()) out.accuracy = a->second;
  return out;
}

StatusOr<ClientOptions::ExternalEvaluation> CallEvaluate(const py::object& evaluate, const v1::Task& task,
                                                         const ClientOptions::External::Global& global) {
  return Guarded("evaluate", [&] { return CallEvaluateUnguarded(evaluate, task, global); });
}

// A Python callable held by C++ code; released with the GIL.
std::shared_ptr<py::object> Held(py::object o) {
  return std::shared_ptr<py::object>(new py::object(std::move(o)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

// The device's stages of a split model in Python (cleave.start_split_client's runner:
// begin, forward, backward, parameters), as ExternalSplit hooks.
std::shared_ptr<const ExternalSplit> SplitHooks(const py::object& runner) {
  auto r = Held(runner);
  auto out = std::make_shared<ExternalSplit>();
  out->begin = [r](const v1::Task& task, const ParameterSet& part) -> StatusOr<int64_t> {
    py::gil_scoped_acquire gil;
    try {
      return (*r).attr("begin")(OwnedArrays(part), ConfigOf(task)).cast<int64_t>();
    } catch (py::error_already_set& e) {
      return PythonError("begin", e);
    } catch (const std::exception& e) {  // pybind11's cast and type errors, bad_alloc
      return absl::InvalidArgumentError(absl::StrCat("begin must return the examples of an epoch: ", e.what()));
    }
  };
  out->forward = [r](int64_t seq) -> StatusOr<std::optional<ExternalSplit::Batch>> {
    py::gil_scoped_acquire gil;
    try {
      py::object got = (*r).attr("forward")(seq);
      if (got.is_none()) return std::optional<ExternalSplit::Batch>();
      py::tuple pair = got.cast<py::tuple>();
      ASSIGN_OR_RETURN(py::array act, AsFloatArray(pair[0], 0));
      py::array_t<int64_t, py::array::c_style | py::array::forcecast> labels(pair[1]);
      ExternalSplit::Batch b;
      b.activations.shape.assign(act.shape(), act.shape() + act.ndim());
      const float* v = static_cast<const float*>(act.data());
      b.activations.values.assign(v, v + act.size());
      b.labels.assign(labels.data(), labels.data() + labels.size());
      return std::optional<ExternalSplit::Batch>(std::move(b));
    } catch (py::error_already_set& e) {
      return PythonError("forward", e);
    } catch (const std::exception& e) {  // pybind11's cast and type errors, bad_alloc
      return absl::InvalidArgumentError(absl::StrCat("forward must return (activations, labels) or None: ", e.what()));
    }
  };
  out->backward = [r](int64_t seq, const Activations& grad) -> Status {
    py::gil_scoped_acquire gil;
    py::array_t<float> g(std::vector<py::ssize_t>(grad.shape.begin(), grad.shape.end()));
    std::copy(grad.values.begin(), grad.values.end(), g.mutable_data());
    try {
      (*r).attr("backward")(seq, g);
    } catch (py::error_already_set& e) {
      return PythonError("backward", e);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("backward: ", e.what()));
    }
    return absl::OkStatus();
  };
  out->parameters = [r]() -> StatusOr<ParameterSet> {
    py::gil_scoped_acquire gil;
    ParameterSet out;
    try {
      py::list params = (*r).attr("parameters")().cast<py::list>();
      for (size_t i = 0; i < params.size(); ++i) {
        ASSIGN_OR_RETURN(py::array a, AsFloatArray(params[i], i));
        const float* v = static_cast<const float*>(a.data());
        RETURN_IF_ERROR(out.Add(Tensor{absl::StrCat(i), std::vector<int64_t>(a.shape(), a.shape() + a.ndim()),
                                       std::vector<float>(v, v + a.size())}));
      }
    } catch (py::error_already_set& e) {
      return PythonError("parameters", e);
    } catch (const std::exception& e) {  // pybind11's cast and type errors, bad_alloc
      return absl::InvalidArgumentError(absl::StrCat("parameters must return a list of arrays: ", e.what()));
    }
    return out;
  };
  return out;
}

// Runs one client until the server ends the run; raises RuntimeError with the status.
// `fit` and `evaluate` train and measure whole models; a `split` runner (with fit None)
// runs the device's stages of split tasks.
py::dict RunClient(const py::dict& options, const py::object& fit, const py::object& evaluate,
                   const py::object& split) {
  ClientOptions o;
  const auto get = [&](const char* key, auto fallback) {
    return options.contains(key) && !options[key].is_none() ? options[key].cast<decltype(fallback)>() : fallback;
  };
  o.server = get("server", std::string());
  o.name = get("name", std::string("python-client"));
  o.insecure = get("insecure", false);
  o.tls_ca = get("ca", std::string());
  o.tls_cert = get("cert", std::string());
  o.tls_key = get("key", std::string());
  o.token = get("token", std::string());
  o.declared_examples = get("num_examples", int64_t{0});
  o.give_up_after_s = get("give_up_after_s", 600.0);
  // None (0 here): each round's count is what fit returns, as in Flower.
  o.count_from_fit = o.declared_examples == 0 && !fit.is_none();
  if (o.declared_examples < 0 || (o.declared_examples == 0 && !o.count_from_fit)) {
    throw py::value_error("num_examples must be positive");
  }
  if (!std::isfinite(o.give_up_after_s) || o.give_up_after_s <= 0) {
    throw py::value_error(absl::StrCat("give_up_after_s must be a finite number of seconds > 0, not ", o.give_up_after_s));
  }
  // The callables are called with the GIL held (CallFit takes it) and released with it.
  if (!fit.is_none()) {
    auto fit_fn = Held(fit);
    o.external.fit = [fit_fn](const v1::Task& t, const ClientOptions::External::Global& g) {
      return CallFit(*fit_fn, t, g);
    };
  }
  if (!evaluate.is_none()) {
    auto eval_fn = Held(evaluate);
    o.external.evaluate = [eval_fn](const v1::Task& t, const ClientOptions::External::Global& g) {
      return CallEvaluate(*eval_fn, t, g);
    };
  }
  if (!split.is_none()) o.external.split = SplitHooks(split);
  g_grpc_started = true;
  Status s;
  int tasks = 0;
  ClientState state;
  {
    py::gil_scoped_release released;
    Client client(std::move(o));
    s = client.Run();
    tasks = client.tasks_completed();
    state = client.State();
  }
  if (!s.ok()) throw std::runtime_error(s.ToString());
  py::dict out;
  out["tasks_completed"] = tasks;
  out["tasks_failed"] = state.tasks_failed;
  out["bytes_sent"] = state.bytes_sent;
  out["bytes_received"] = state.bytes_received;
  return out;
}

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
  RoundPlan ConfigureRound(int64_t round, const std::vector<std::string>& available, std::mt19937_64& rng) override {
    try {
      return ConfigureRoundPy(round, available, rng);
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

  RoundPlan ConfigureRoundPy(int64_t round, const std::vector<std::string>& available, std::mt19937_64& rng) {
    round_ = round;
    RoundPlan plan = fallback_->ConfigureRound(round, available, rng);
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

// Runs a server for the job `config` (a YAML file's path, or its text) in this process
// until its run ends; `strategy` (or None: the job's) decides. `on_listen(port)` is
// called once it serves. Returns the rounds' count; raises RuntimeError on failure.
int64_t RunServer(const std::string& config, const py::dict& options, const py::object& strategy,
                  const py::object& on_listen) {
  const bool text = config.find('\n') != std::string::npos;
  StatusOr<JobConfig> job = text ? ParseJob(config, ".") : LoadJob(config);
  if (!job.ok()) throw py::value_error(job.status().ToString());
  ServerOptions o;
  o.config = *job;
  o.listen = options.contains("listen") ? options["listen"].cast<std::string>() : "";
  o.run_dir = options.contains("run_dir") && !options["run_dir"].is_none() ? options["run_dir"].cast<std::string>() : "";
  o.insecure = options.contains("insecure") && options["insecure"].cast<bool>();
  o.config_text = text ? config : ReadFile(config).value_or("");
  if (!strategy.is_none()) {
    auto held = Held(strategy);
    o.strategy = [held](const StrategyJob& j) -> StatusOr<std::unique_ptr<Strategy>> {
      ASSIGN_OR_RETURN(std::unique_ptr<Strategy> fallback, CreateStrategy(j));
      py::gil_scoped_acquire gil;
      auto s = std::make_unique<PythonStrategy>(*held, std::move(fallback));
      if (s->Defines("state") != s->Defines("load_state")) {
        return absl::InvalidArgumentError("a strategy's state() and load_state() go together: define both or neither");
      }
      return std::unique_ptr<Strategy>(std::move(s));
    };
  }
  StatusOr<std::unique_ptr<Server>> server;
  Status s;
  g_grpc_started = true;
  {
    py::gil_scoped_release released;
    server = Server::Create(std::move(o));
    if (server.ok()) s = (*server)->Start();
  }
  if (!server.ok()) throw std::runtime_error(server.status().ToString());
  if (!s.ok()) throw std::runtime_error(s.ToString());
  if (!on_listen.is_none()) on_listen((*server)->port());
  {
    py::gil_scoped_release released;
    s = (*server)->Run();
  }
  if (!s.ok()) throw std::runtime_error(s.ToString());
  return (*server)->committed_round();
}

}  // namespace
}  // namespace cleave

PYBIND11_MODULE(_cleave, m) {
  m.doc() = "cleave's native client (see the cleave package)";
  m.def("run_client", &cleave::RunClient, py::arg("options"), py::arg("fit"), py::arg("evaluate"),
        py::arg("split") = py::none(),
        "Runs a client whose training is `fit` (and evaluation `evaluate`), or whose split stages are `split`, "
        "until the server ends the run.");
  m.def("run_server", &cleave::RunServer, py::arg("config"), py::arg("options"), py::arg("strategy"),
        py::arg("on_listen"), "Runs a server for the job `config` in this process until its run ends.");
  m.def("grpc_started", [] { return cleave::g_grpc_started.load(); },
        "Whether this process has run a client or a server (gRPC's threads make forking it unsafe).");
  m.def("device_profile", [] {
    const cleave::v1::DeviceProfile d = cleave::LocalDevice();
    py::dict out;
    out["hostname"] = d.hostname();
    out["cpu_cores"] = d.cpu_cores();
    out["memory_bytes"] = d.memory_bytes();
    out["platform"] = d.platform();
    return out;
  }, "What this device declares when it joins: host name, cores, memory in bytes, platform.");
  m.def("copied_bytes", [] { return cleave::g_copied_bytes.load(); },
        "Bytes of trained parameters copied between Python and C++ (only non-contiguous arrays are).");
}
