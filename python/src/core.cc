// Errors, knobs, policies, ExpertShape and Topology for Python.
#include <Python.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <variant>

#include "feplb/core/error.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/limits.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/text.h"
#include "feplb/core/topology.h"
#include "python/src/bindings.h"

namespace feplb::python {
namespace {

void register_errors() {
  // InputError (bad input: a file, an argument) -> ValueError; any other feplb::Error (a broken
  // invariant inside feplb) -> RuntimeError. Both keep the C++ message.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      // printable(): valid UTF-8 whatever bytes a path or a name held.
      PyErr_SetString(PyExc_ValueError, printable(e.what()).c_str());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, printable(e.what()).c_str());
    }
  });
}

Topology make_topology(const py::object& num_ranks_arg, const py::object& num_experts_arg,
                       const py::object& gpus_per_node_arg, const py::object& placement) {
  // Beyond int's range here; the library's own checks name the rest.
  const auto int_of = [](const py::object& v, std::string_view name) {
    return static_cast<int>(int_arg(v, name, INT_MIN, INT_MAX));
  };
  const int num_ranks = int_of(num_ranks_arg, "num_ranks");
  const int num_experts = int_of(num_experts_arg, "num_experts");
  const int gpus_per_node = int_of(gpus_per_node_arg, "gpus_per_node");
  if (placement.is_none()) return Topology::contiguous(num_ranks, gpus_per_node, num_experts);
  FEPLB_REQUIRE_INPUT(
      py::isinstance<py::sequence>(placement) && !py::isinstance<py::str>(placement),
      "placement: expected a sequence of home GPUs, got {}",
      std::string(py::str(py::type::handle_of(placement).attr("__name__"))));
  const auto homes = py::reinterpret_borrow<py::sequence>(placement);
  FEPLB_REQUIRE_INPUT(homes.size() == static_cast<size_t>(num_experts),
                      "placement: has {} entries, expected num_experts = {}", homes.size(),
                      num_experts);
  std::vector<int> home(homes.size());
  for (size_t e = 0; e < home.size(); ++e) {
    home[e] = int_of(homes[e], fmt::format("placement[{}]", e));
  }
  return Topology::with_placement(num_ranks, gpus_per_node, std::move(home));
}

int gpu_of(const Topology& t, const py::object& gpu_arg) {
  const int64_t gpu = int_arg(gpu_arg, "gpu", INT64_MIN, INT64_MAX);
  FEPLB_REQUIRE_INPUT(gpu >= 0 && gpu < t.num_ranks(), "gpu: {} is outside [0, {})", gpu,
                      t.num_ranks());
  return static_cast<int>(gpu);
}

}  // namespace

Knobs knobs_from(const py::dict& overrides) {
  Knobs knobs;
  for (const auto& item : overrides) {
    const std::string name = py::str(item.first);
    const py::handle v = item.second;
    // Numbers go to set_knob (the parser the CLI and the C API use) as they are: an int that
    // int64 holds as an integer, a larger one as its digits, a float as a double.
    const bool number = PyIndex_Check(v.ptr()) || PyFloat_Check(v.ptr()) ||
                        py::isinstance(v, py::module_::import("numbers").attr("Real"));
    if (PyBool_Check(v.ptr()) || !number) {
      require_knob_name(name);  // an unknown name is named first
      throw InputError(fmt::format("knob {}: expected a number, got {}", printable(name),
                                   std::string(py::str(py::type::handle_of(v).attr("__name__")))));
    }
    if (PyIndex_Check(v.ptr())) {
      const py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
      if (!i) throw py::error_already_set();
      int overflow = 0;
      const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
      if (overflow == 0) {
        set_knob(knobs, name, static_cast<int64_t>(x));
      } else {
        const std::string digits = py::repr(i);
        set_knob(knobs, name, std::string_view(digits));
      }
    } else {
      const double x = PyFloat_AsDouble(v.ptr());  // a float, or a number.Real that converts
      if (x == -1.0 && PyErr_Occurred()) throw py::error_already_set();
      set_knob(knobs, name, x);
    }
  }
  return knobs;
}

int64_t int_arg(py::handle v, std::string_view name, int64_t lo, int64_t hi) {
  const std::string type = py::str(py::type::handle_of(v).attr("__name__"));
  FEPLB_REQUIRE_INPUT(!PyBool_Check(v.ptr()) && PyIndex_Check(v.ptr()),
                      "{}: expected an integer, got {}", name, type);
  const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  FEPLB_REQUIRE_INPUT(overflow == 0 && x >= lo && x <= hi, "{}: {} is outside {}", name,
                      std::string(py::repr(i)),
                      range_text(static_cast<double>(lo), static_cast<double>(hi)));
  return static_cast<int64_t>(x);
}

std::string text_arg(py::handle v, std::string_view name) {
  FEPLB_REQUIRE_INPUT(PyUnicode_Check(v.ptr()), "{}: expected a str, got {}", name,
                      std::string(py::str(py::type::handle_of(v).attr("__name__"))));
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(v.ptr(), &size);
  if (utf8 == nullptr) {
    PyErr_Clear();
    throw InputError(fmt::format("{}: not valid Unicode text (a lone surrogate)", name));
  }
  return std::string(utf8, static_cast<size_t>(size));
}

void require_counts(const Int64Array& a, std::string_view name, std::vector<py::ssize_t> shape,
                    std::string_view expected, int64_t max_value) {
  const auto dims = [](const std::vector<py::ssize_t>& s) {
    return fmt::format("({})", fmt::join(s, ", "));
  };
  std::vector<py::ssize_t> got(a.shape(), a.shape() + a.ndim());
  FEPLB_REQUIRE_INPUT(got == shape, "{}: shape {}, expected {} = {}", name, dims(got), expected,
                      dims(shape));
  const int64_t* data = a.data();
  const auto n = static_cast<size_t>(a.size());
  for (size_t i = 0; i < n; ++i) {
    if (data[i] >= 0 && data[i] <= max_value) continue;
    // Name the entry by its index along each axis.
    std::vector<py::ssize_t> index(shape.size());
    size_t rest = i;
    for (size_t d = shape.size(); d-- > 0;) {
      index[d] = static_cast<py::ssize_t>(rest % static_cast<size_t>(shape[d]));
      rest /= static_cast<size_t>(shape[d]);
    }
    if (data[i] < 0) {
      throw InputError(
          fmt::format("{}[{}]: {} is negative", name, fmt::join(index, "]["), data[i]));
    }
    throw InputError(
        fmt::format("{}[{}]: {} is above {}", name, fmt::join(index, "]["), data[i], max_value));
  }
}

namespace {

// The module's functions: the error mapping's test hook, the policies, the limits, the knobs.
void bind_functions(py::module_& m) {
  m.def(
      "_raise_for_test",
      [](const std::string& kind, const std::string& message) {
        if (kind == "input") throw InputError(message);
        throw Error(message);
      },
      "Throws feplb::InputError (kind 'input') or feplb::Error: tests the exception mapping.");

  m.def("policies", &planner_names, "Names of every planner, in the CLI's order.");

  // The file formats' limits (feplb/core/limits.h): the Python layer checks sizes against them
  // before copying an array.
  py::dict limits_dict;
  limits_dict["ranks"] = limits::kMaxRanks;
  limits_dict["experts"] = limits::kMaxExperts;
  limits_dict["tokens_per_rank"] = limits::kMaxTokensPerRank;
  limits_dict["expert_dim"] = limits::kMaxExpertDim;
  limits_dict["step_id"] = limits::kMaxStepId;
  limits_dict["trace_counts"] = limits::kMaxTraceCounts;
  limits_dict["free_form_bytes"] = limits::kMaxFreeFormBytes;
  m.attr("LIMITS") = limits_dict;

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
}

void bind_expert_shape(py::module_& m) {
  py::class_<ExpertShape>(m, "ExpertShape",
                          "One SwiGLU expert: gate and up [hidden, ffn], down [ffn, hidden].")
      .def(py::init([](const py::object& hidden_arg, const py::object& ffn_arg,
                       const py::object& dtype) {
             const int64_t hidden = int_arg(hidden_arg, "hidden", INT64_MIN, INT64_MAX);
             const int64_t ffn = int_arg(ffn_arg, "ffn", INT64_MIN, INT64_MAX);
             FEPLB_REQUIRE_INPUT(hidden >= 1, "hidden: {} must be at least 1", hidden);
             FEPLB_REQUIRE_INPUT(ffn >= 1, "ffn: {} must be at least 1", ffn);
             FEPLB_REQUIRE_INPUT(hidden <= limits::kMaxExpertDim && ffn <= limits::kMaxExpertDim,
                                 "hidden, ffn: {}, {} above the limit of {}", hidden, ffn,
                                 limits::kMaxExpertDim);
             return ExpertShape{hidden, ffn, parse_dtype(text_arg(dtype, "dtype"), "dtype")};
           }),
           py::arg("hidden"), py::arg("ffn"), py::arg("dtype") = "bf16")
      .def_static(
          "for_model",
          [](const py::object& model_arg) {
            const std::string model = text_arg(model_arg, "model");
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
}

void bind_topology(py::module_& m) {
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
          [](const Topology& t, const py::object& gpu_arg) {
            const int gpu = gpu_of(t, gpu_arg);
            std::vector<int64_t> e(t.local_experts(gpu).begin(), t.local_experts(gpu).end());
            return to_numpy(e);
          },
          py::arg("gpu"), "The experts whose home is `gpu`, ascending.")
      .def(
          "domain_of",
          [](const Topology& t, const py::object& gpu) { return t.domain_of(gpu_of(t, gpu)); },
          py::arg("gpu"))
      .def("__eq__",
           [](const Topology& a, const Topology& b) {
             return a.num_ranks() == b.num_ranks() && a.domain_size() == b.domain_size() &&
                    std::ranges::equal(a.homes(), b.homes());
           })
      .def("__repr__", [](const Topology& t) { return fmt::format("Topology({})", t.describe()); });
}

}  // namespace

void bind_core(py::module_& m) {
  register_errors();
  bind_functions(m);
  bind_expert_shape(m);
  bind_topology(m);
}

}  // namespace feplb::python
