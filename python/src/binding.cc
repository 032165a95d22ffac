// cleave._cleave: the native half of the Python package (python/cleave/). A client
// whose training and evaluation are Python callables (ClientOptions::external) runs the
// C++ client's whole protocol, TLS to heartbeats; the global model reaches Python as
// NumPy arrays and the trained arrays are read in place (TensorView), not copied.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cleave/v1/cleave.pb.h"
#include "client/client.h"

namespace py = pybind11;

namespace cleave {
namespace {

// Bytes of trained parameters copied on their way from Python to the upload: only a
// non-contiguous array is (made contiguous once); float32 arrays in C order are read
// where they are.
std::atomic<int64_t> g_copied_bytes{0};

// The global model as NumPy float32 arrays over one copy of it that they keep alive.
py::list ToArrays(const ParameterSet& global) {
  auto* held = new ParameterSet(global);
  py::capsule owner(held, [](void* p) { delete static_cast<ParameterSet*>(p); });
  py::list out;
  for (const Tensor& t : held->tensors()) {
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    out.append(py::array_t<float>(shape, t.values.data(), owner));
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

StatusOr<ClientOptions::ExternalFit> CallFit(const py::object& fit, const v1::Task& task, const ParameterSet& global) {
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
  if (!py::isinstance<py::sequence>(r[0]) || py::len(r[0]) != global.size()) {
    return absl::InvalidArgumentError(absl::StrCat("fit returned ", py::isinstance<py::sequence>(r[0]) ? py::len(r[0]) : 0,
                                                   " parameters; the model has ", global.size()));
  }
  ClientOptions::ExternalFit out;
  auto keep = std::make_unique<py::list>();
  py::sequence params = r[0].cast<py::sequence>();
  for (size_t i = 0; i < global.size(); ++i) {
    ASSIGN_OR_RETURN(py::array a, AsFloatArray(params[i], i));
    TensorView view;
    view.name = global.tensors()[i].name;
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
  } catch (py::cast_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("fit's num_examples or metrics: ", e.what()));
  }
  return out;
}

StatusOr<ClientOptions::ExternalEvaluation> CallEvaluate(const py::object& evaluate, const v1::Task& task,
                                                         const ParameterSet& global) {
  py::gil_scoped_acquire gil;
  ClientOptions::ExternalEvaluation out;
  try {
    py::object result = evaluate(ToArrays(global), ConfigOf(task));
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
  } catch (py::cast_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("evaluate's loss, num_examples or metrics: ", e.what()));
  }
  if (auto a = out.metrics.find("accuracy"); a != out.metrics.end()) out.accuracy = a->second;
  return out;
}

// Runs one client until the server ends the run; raises RuntimeError with the status.
py::dict RunClient(const py::dict& options, const py::object& fit, const py::object& evaluate) {
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
  o.state_dir = get("state_dir", std::string());
  o.declared_examples = get("num_examples", int64_t{0});
  o.give_up_after_s = get("give_up_after_s", 600.0);
  if (o.declared_examples <= 0) throw py::value_error("num_examples must be positive");
  // The callables are called with the GIL held (CallFit takes it) and released with it.
  auto fit_fn = std::shared_ptr<py::object>(new py::object(fit), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
  o.external.fit = [fit_fn](const v1::Task& t, const ParameterSet& g) { return CallFit(*fit_fn, t, g); };
  if (!evaluate.is_none()) {
    auto eval_fn = std::shared_ptr<py::object>(new py::object(evaluate), [](py::object* p) {
      py::gil_scoped_acquire gil;
      delete p;
    });
    o.external.evaluate = [eval_fn](const v1::Task& t, const ParameterSet& g) { return CallEvaluate(*eval_fn, t, g); };
  }
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

}  // namespace
}  // namespace cleave

PYBIND11_MODULE(_cleave, m) {
  m.doc() = "cleave's native client (see the cleave package)";
  m.def("run_client", &cleave::RunClient, py::arg("options"), py::arg("fit"), py::arg("evaluate"),
        "Runs a client whose training is `fit` (and evaluation `evaluate`) until the server ends the run.");
  m.def("copied_bytes", [] { return cleave::g_copied_bytes.load(); },
        "Bytes of trained parameters copied between Python and C++ (only non-contiguous arrays are).");
}
