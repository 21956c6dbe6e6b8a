// The _feplb extension module: pybind11 bindings over the planning library (feplb_core) and the
// simulator (feplb_sim). Import the Python package `feplb` (python/feplb), which wraps it.
#include <pybind11/pybind11.h>

#include "python/src/bindings.h"

#ifndef FEPLB_DATA_DIR
#define FEPLB_DATA_DIR ""
#endif

PYBIND11_MODULE(_feplb, m) {
  m.doc() = "feplb's C++ core; use the feplb package, which wraps it";
  // The repository's data/ folder this module was built from (the measured GEMM table and the
  // bundled trace); an installed package carries its own copy.
  m.attr("BUILD_DATA_DIR") = FEPLB_DATA_DIR;
  feplb::python::bind_core(m);
  feplb::python::bind_plan(m);
  feplb::python::bind_trace(m);
  feplb::python::bind_simulate(m);
}
