// The _feplb extension's shared pieces: one bind_* function per part of the API, and the
// conversions between numpy arrays, Python keyword arguments and the library's types.
// Arrays handed to Python are copies: Python owns them, the library keeps nothing of them.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "feplb/core/knobs.h"
#include "feplb/core/routing.h"

namespace feplb::python {

namespace py = pybind11;

// Integer counts as the bindings take them: C-contiguous int64 (the Python layer converts and
// checks dtype and shape first, naming the argument; pybind11 refuses unsafe casts).
using Int64Array = py::array_t<int64_t, py::array::c_style>;

// A trace (feplb.Trace) and the path it was loaded from ("" when built in memory).
struct PyTrace {
  Trace trace;
  std::string path;
};

void bind_core(py::module_& m);      // errors, knobs, policies, ExpertShape, Topology
void bind_plan(py::module_& m);      // Planner
void bind_trace(py::module_& m);     // Trace
void bind_simulate(py::module_& m);  // simulate

// Default knobs with each (name, value) of `overrides` set by set_knob (feplb/core/knobs.h: the
// parser of the CLI and the C API, with their messages); InputError for a value not a number.
Knobs knobs_from(const py::dict& overrides);

// A new 1-D numpy array holding a copy of `values`.
template <typename T>
py::array_t<T> to_numpy(std::span<const T> values) {
  py::array_t<T> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}
template <typename T>
py::array_t<T> to_numpy(const std::vector<T>& values) {
  return to_numpy(std::span<const T>(values));
}

// Checks that `a` has exactly `shape` (InputError "NAME: shape (..), expected (..)") and no
// entry outside [0, max_value] (InputError naming the first one).
void require_counts(const Int64Array& a, std::string_view name, std::vector<py::ssize_t> shape,
                    std::string_view expected, int64_t max_value = INT64_MAX);

// A Python integer argument (an int or a numpy integer, not a bool) in [lo, hi]; InputError
// naming it otherwise, however large it is.
int64_t int_arg(py::handle value, std::string_view name, int64_t lo, int64_t hi);
// A Python str argument as UTF-8; InputError naming it for another type or a lone surrogate.
std::string text_arg(py::handle value, std::string_view name);

}  // namespace feplb::python
