// Errors, knobs, policies, ExpertShape and Topology for Python.
#include <Python.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <variant>

#include "feplb/core/error.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/topology.h"
#include "python/src/bindings.h"

namespace feplb::python {
namespace {

// A Python number as an integer (ints, numpy integers, integral floats) or a double; InputError
// naming the knob for anything else (bools and strings included).
int64_t integer_of(py::handle v, std::string_view name) {
  FEPLB_REQUIRE_INPUT(!PyBool_Check(v.ptr()), "{}: expected an integer, got a bool", name);
  if (PyIndex_Check(v.ptr())) {
    const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    FEPLB_REQUIRE_INPUT(overflow == 0, "{}: {} does not fit in 64 bits", name,
                        std::string(py::str(v)));
    return static_cast<int64_t>(x);
  }
  const double x = PyFloat_AsDouble(v.ptr());
  if (x == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw InputError(fmt::format("{}: expected an integer, got {}", name,
                                 std::string(py::str(py::type::handle_of(v).attr("__name__")))));
  }
  FEPLB_REQUIRE_INPUT(std::isfinite(x) && std::floor(x) == x && std::fabs(x) < 9.0e15,
                      "{}: expected an integer, got {}", name, x);
  return static_cast<int64_t>(x);
}

double real_of(py::handle v, std::string_view name) {
  FEPLB_REQUIRE_INPUT(!PyBool_Check(v.ptr()), "{}: expected a number, got a bool", name);
  if (PyIndex_Check(v.ptr())) return static_cast<double>(integer_of(v, name));
  const double x = PyFloat_AsDouble(v.ptr());
  if (x == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw InputError(fmt::format("{}: expected a number, got {}", name,
                                 std::string(py::str(py::type::handle_of(v).attr("__name__")))));
  }
  FEPLB_REQUIRE_INPUT(std::isfinite(x), "{}: {} is not a finite number", name, x);
  return x;
}

void register_errors() {
  // InputError (bad input: a file, an argument) -> ValueError; any other feplb::Error (a broken
  // invariant inside feplb) -> RuntimeError. Both keep the C++ message.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}

Topology make_topology(int num_ranks, int num_experts, int gpus_per_node,
                       const std::optional<std::vector<int>>& placement) {
  if (!placement) return Topology::contiguous(num_ranks, gpus_per_node, num_experts);
  FEPLB_REQUIRE_INPUT(placement->size() == static_cast<size_t>(std::max(num_experts, 0)),
                      "placement: has {} entries, expected num_experts = {}", placement->size(),
                      num_experts);
  return Topology::with_placement(num_ranks, gpus_per_node, *placement);
}

void require_gpu(const Topology& t, int gpu) {
  FEPLB_REQUIRE_INPUT(gpu >= 0 && gpu < t.num_ranks(), "gpu: {} is outside [0, {})", gpu,
                      t.num_ranks());
}

}  // namespace

Knobs knobs_from(const py::dict& overrides) {
  Knobs knobs;
  const std::vector<KnobInfo> infos = list_knobs(knobs);
  for (const auto& item : overrides) {
    const std::string name = py::str(item.first);
    const auto it =
        std::find_if(infos.begin(), infos.end(), [&](const KnobInfo& k) { return k.name == name; });
    FEPLB_REQUIRE_INPUT(it != infos.end(), "{}: unknown knob (feplb.knobs() lists them)", name);
    double value = 0;
    if (auto* p = std::get_if<int64_t*>(&it->value)) {
      **p = integer_of(item.second, name);
      value = static_cast<double>(**p);
    } else {
      **std::get_if<double*>(&it->value) = value = real_of(item.second, name);
    }
    FEPLB_REQUIRE_INPUT(value >= it->minimum, "{}: {} is below its minimum {} {}", name, value,
                        it->minimum, it->unit);
  }
  return knobs;
}

void require_counts(const Int64Array& a, std::string_view name, std::vector<py::ssize_t> shape,
                    std::string_view expected) {
  const auto dims = [](const std::vector<py::ssize_t>& s) {
    return fmt::format("({})", fmt::join(s, ", "));
  };
  std::vector<py::ssize_t> got(a.shape(), a.shape() + a.ndim());
  FEPLB_REQUIRE_INPUT(got == shape, "{}: shape {}, expected {} = {}", name, dims(got), expected,
                      dims(shape));
  const int64_t* data = a.data();
  const auto n = static_cast<size_t>(a.size());
  for (size_t i = 0; i < n; ++i) {
    if (data[i] >= 0) continue;
    // Name the entry by its index along each axis.
    std::vector<py::ssize_t> index(shape.size());
    size_t rest = i;
    for (size_t d = shape.size(); d-- > 0;) {
      index[d] = static_cast<py::ssize_t>(rest % static_cast<size_t>(shape[d]));
      rest /= static_cast<size_t>(shape[d]);
    }
    throw InputError(fmt::format("{}[{}]: {} is negative", name, fmt::join(index, "]["), data[i]));
  }
}

void bind_core(py::module_& m) {
  register_errors();

  m.def(
      "_raise_for_test",
      [](const std::string& kind, const std::string& message) {
        if (kind == "input") throw InputError(message);
        throw Error(message);
      },
      "Throws feplb::InputError (kind 'input') or feplb::Error: tests the exception mapping.");

  m.def("policies", &planner_names, "Names of every planner, in the CLI's order.");

  m.def(
      "knob_table",
      [] {
        Knobs defaults;
        py::list out;
        for (const KnobInfo& k : list_knobs(defaults)) {
          const bool integer = std::holds_alternative<int64_t*>(k.value);
          py::object def = integer ? py::object(py::int_(static_cast<int64_t>(k.default_value)))
                                   : py::object(py::float_(k.default_value));
          out.append(py::make_tuple(std::string(k.name), integer ? "int" : "float", def, k.minimum,
                                    std::string(k.unit), std::string(k.help)));
        }
        return out;
      },
      "(name, type, default, minimum, unit, help) of every knob, from feplb/core/knobs.def.");

  m.def(
      "knobs_with",
      [](const py::dict& overrides) {
        Knobs k = knobs_from(overrides);
        py::dict out;
        for (const KnobInfo& info : list_knobs(k)) {
          std::visit([&](auto* p) { out[py::str(std::string(info.name))] = *p; }, info.value);
        }
        return out;
      },
      "Every knob's value once `overrides` are applied (checked as the planners check them).");

  py::class_<ExpertShape>(m, "ExpertShape",
                          "One SwiGLU expert: gate and up [hidden, ffn], down [ffn, hidden].")
      .def(py::init([](int64_t hidden, int64_t ffn, const std::string& dtype) {
             FEPLB_REQUIRE_INPUT(hidden >= 1, "hidden: {} must be at least 1", hidden);
             FEPLB_REQUIRE_INPUT(ffn >= 1, "ffn: {} must be at least 1", ffn);
             return ExpertShape{hidden, ffn, parse_dtype(dtype, "dtype")};
           }),
           py::arg("hidden"), py::arg("ffn"), py::arg("dtype") = "bf16")
      .def_static(
          "for_model",
          [](const std::string& model) {
            const std::optional<ExpertShape> s = shape_for_model(model);
            FEPLB_REQUIRE_INPUT(s.has_value(),
                                "model: no expert shape is known for '{}'; give "
                                "feplb.ExpertShape(hidden, ffn, dtype)",
                                model);
            return *s;
          },
          py::arg("model"), "The shape of a known model, by name prefix (e.g. 'glm5-128e').")
      .def_readonly("hidden", &ExpertShape::hidden)
      .def_readonly("ffn", &ExpertShape::ffn)
      .def_property_readonly("dtype",
                             [](const ExpertShape& s) { return std::string(dtype_name(s.dtype)); })
      .def_property_readonly("weight_bytes", &ExpertShape::weight_bytes,
                             "Bytes of one expert's weights (3 hidden ffn dtype).")
      .def_property_readonly("row_bytes", &ExpertShape::row_bytes,
                             "Bytes of one token row (hidden dtype).")
      .def("__eq__",
           [](const ExpertShape& a, const ExpertShape& b) {
             return a.hidden == b.hidden && a.ffn == b.ffn && a.dtype == b.dtype;
           })
      .def("__hash__",
           [](const ExpertShape& s) {
             return py::hash(py::make_tuple(s.hidden, s.ffn, static_cast<int>(s.dtype)));
           })
      .def("__repr__", [](const ExpertShape& s) {
        return fmt::format("ExpertShape(hidden={}, ffn={}, dtype='{}')", s.hidden, s.ffn,
                           dtype_name(s.dtype));
      });

  py::class_<Topology>(m, "Topology",
                       "One EP group: GPUs, NVLink domains (one node's GPUs), experts and their "
                       "home GPUs (contiguous unless a placement is given).")
      .def(py::init(&make_topology), py::arg("num_ranks"), py::arg("num_experts"),
           py::arg("gpus_per_node") = 8, py::arg("placement") = py::none())
      .def_property_readonly("num_ranks", &Topology::num_ranks)
      .def_property_readonly("num_experts", &Topology::num_experts)
      .def_property_readonly("experts_per_rank", &Topology::experts_per_rank)
      .def_property_readonly("domain_size", &Topology::domain_size,
                             "GPUs per NVLink domain (rows move only inside one).")
      .def_property_readonly("num_domains", &Topology::num_domains)
      .def_property_readonly(
          "homes",
          [](const Topology& t) {
            std::vector<int64_t> h(t.homes().begin(), t.homes().end());
            return to_numpy(h);
          },
          "[num_experts] home GPU of each expert (a copy).")
      .def(
          "local_experts",
          [](const Topology& t, int gpu) {
            require_gpu(t, gpu);
            std::vector<int64_t> e(t.local_experts(gpu).begin(), t.local_experts(gpu).end());
            return to_numpy(e);
          },
          py::arg("gpu"), "The experts whose home is `gpu`, ascending.")
      .def(
          "domain_of",
          [](const Topology& t, int gpu) {
            require_gpu(t, gpu);
            return t.domain_of(gpu);
          },
          py::arg("gpu"))
      .def("__eq__",
           [](const Topology& a, const Topology& b) {
             return a.num_ranks() == b.num_ranks() && a.domain_size() == b.domain_size() &&
                    std::ranges::equal(a.homes(), b.homes());
           })
      .def("__repr__", [](const Topology& t) { return fmt::format("Topology({})", t.describe()); });
}

}  // namespace feplb::python
