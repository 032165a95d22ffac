// Internal to python/src: what the binding's client half (binding.cc) and its strategy
// (strategy.cc) share: arrays between ParameterSets and NumPy, Python objects held by C++
// code, and the guard that keeps what Python throws out of C++.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/parameter_set.h"
#include "core/status.h"

namespace cleave::python {

namespace py = pybind11;

// Bytes of trained parameters copied on their way from Python to the upload: only a
// non-contiguous array is (made contiguous once); float32 arrays in C order are read
// where they are.
extern std::atomic<int64_t> g_copied_bytes;

// `set`'s tensors as NumPy float32 arrays over its values, which they own from now on
// (a caller that keeps `set` passes a copy).
py::list OwnedArrays(ParameterSet set);

// A returned parameter as a contiguous float32 array (a torch tensor through .numpy()).
StatusOr<py::array> AsFloatArray(py::handle value, size_t index);

// A Python callable held by C++ code; released with the GIL.
std::shared_ptr<py::object> Held(py::object o);

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

}  // namespace cleave::python
