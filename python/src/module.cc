// The _feplb extension module: pybind11 bindings over the planning library (feplb_core) and the
// simulator (feplb_sim). Import the Python package `feplb` (python/feplb), which wraps it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "feplb/sim/data_dir.h"
#include "python/src/bindings.h"

PYBIND11_MODULE(_feplb, m) {
  m.doc() = "feplb's C++ core; use the feplb package, which wraps it";
  // The bundled data (the measured GEMM tables, the default trace), looked for as the CLI does
  // (feplb/sim/data_dir.h): $FEPLB_DATA_DIR, then `installed` (the package's own copy), then the
  // installed share/feplb/data, then the repository's data/ this module was built from.
  m.def(
      "data_search_path",
      [](const std::vector<std::string>& installed) { return feplb::data_search_path(installed); },
      pybind11::arg("installed"));
  m.def(
      "find_data_dir",
      [](const std::string& relative, const std::vector<std::string>& installed) {
        return feplb::find_data_dir(relative, feplb::data_search_path(installed));
      },
      pybind11::arg("relative"), pybind11::arg("installed"));
  m.def(
      "find_data",
      [](const std::string& relative, const std::vector<std::string>& installed) {
        return feplb::find_data(relative, feplb::data_search_path(installed));
      },
      pybind11::arg("relative"), pybind11::arg("installed"));
  feplb::python::bind_core(m);
  feplb::python::bind_plan(m);
  feplb::python::bind_trace(m);
  feplb::python::bind_simulate(m);
}
