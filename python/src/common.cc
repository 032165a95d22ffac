#include "python/src/common.h"

#include <vector>

namespace cleave::python {

std::atomic<int64_t> g_copied_bytes{0};

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

// A Python callable held by C++ code; released with the GIL.
std::shared_ptr<py::object> Held(py::object o) {
  return std::shared_ptr<py::object>(new py::object(std::move(o)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

}  // namespace cleave::python
