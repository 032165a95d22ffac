// cleave._cleave: the native half of the Python package (python/cleave/). A client
// whose training and evaluation are Python callables (ClientOptions::external) runs the
// C++ client's whole protocol, TLS to heartbeats; the global model reaches Python as
// NumPy arrays and the trained arrays are read in place (TensorView), not copied. A
// server runs the C++ coordinator in this process, calling a Python strategy's methods
// (PythonStrategy) for its decisions only.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aggregation/strategy.h"
#include "cleave/v1/cleave.pb.h"
#include "client/client.h"
#include "client/split_client.h"
#include "core/files.h"
#include "job/job.h"
#include "python/src/common.h"
#include "python/src/strategy.h"
#include "server/options.h"
#include "server/server.h"

namespace py = pybind11;

namespace cleave {
namespace {

using python::AsFloatArray;
using python::g_copied_bytes;
using python::Guarded;
using python::Held;
using python::OwnedArrays;

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
      return python::MakePythonStrategy(*held, std::move(fallback));
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
