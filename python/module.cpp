// The Python module's native part, `cubevec._cubevec`: the generation library (load once, generate
// many) with NumPy results. python/cubevec/__init__.py builds the diffusers-style classes on it.
// The GIL is released while a pipeline loads or generates; Ctrl-C (SIGINT in the main thread)
// stops a generation at its next step and raises KeyboardInterrupt; cubevec errors become Python
// exceptions (cubevec.Error, ValueError for a bad request or option, FileNotFoundError for a
// missing model folder), never a crash. At interpreter exit, running calls are cancelled and waited
// for; a process forked after the library started its threads gets an error, not a hang.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "pipelines/pipeline.h"
#include "pipelines/request.h"
#include "python/call_guards.h"
#include "python/layers.h"
#include "base/json_text.h"

namespace py = pybind11;
using cubevec::pipelines::Pipeline;
using cubevec::python::ActiveCall;
using cubevec::python::BadArgument;
using cubevec::python::exiting;
using cubevec::python::require_not_exiting;
using cubevec::python::require_not_forked;

namespace {

py::array_t<uint8_t> to_array(const cubevec::media::RgbImage& image) {
  py::array_t<uint8_t> out({image.height, image.width, 3});
  std::copy(image.pixels.begin(), image.pixels.end(), out.mutable_data());
  return out;
}

class PythonPipeline {
 public:
  static std::shared_ptr<PythonPipeline> load(const std::string& path, const std::string& options_json) {
    cubevec::pipelines::LoadOptions options;
    try {
      options = cubevec::pipelines::LoadOptions::parse(options_json, "from_pretrained options");
    } catch (const cubevec::Error& e) {
      throw BadArgument(e.what());
    }
    require_not_forked();
    require_not_exiting();
    auto out = std::make_shared<PythonPipeline>();
    py::gil_scoped_release release;
    const ActiveCall active;
    try {
      out->pipeline_ = Pipeline::load(path, options);
    } catch (const cubevec::Error& e) {  // in from_pretrained's terms, not the command line's flags
      throw cubevec::Error(cubevec::pipelines::in_request_terms(e.what()));
    }
    return out;
  }

  // {"images": [HxWx3 uint8], "report": JSON text}. `on_step(step, steps)` runs with the GIL after
  // each step (the diffusers callback); a pending Ctrl-C cancels the call.
  py::dict generate(const std::string& request_json, const py::object& on_step) const {
    require_not_forked();
    require_not_exiting();
    cubevec::pipelines::Request request;
    try {
      request = pipeline_->checked(cubevec::pipelines::Request::parse(request_json, "the call's arguments"));
    } catch (const cubevec::Error& e) {
      throw BadArgument(cubevec::pipelines::in_request_terms(e.what()));
    }
    std::atomic<bool> cancel{false};
    // An exception raised by the callback or by a signal handler (Ctrl-C): the call stops at that
    // step and the exception is raised to the caller as it was.
    std::unique_ptr<py::error_already_set> python_error;
    cubevec::pipelines::GenerateHooks hooks;
    hooks.cancel = &cancel;
    hooks.on_step = [&](const cubevec::pipelines::Progress& p) {
      if (exiting) {  // the interpreter is exiting: stop without touching Python
        cancel = true;
        return;
      }
      py::gil_scoped_acquire gil;
      try {
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        if (!on_step.is_none()) on_step(p.step, p.steps);
      } catch (py::error_already_set& e) {
        python_error = std::make_unique<py::error_already_set>(std::move(e));
        cancel = true;
      }
    };
    cubevec::pipelines::GenerationResult result;
    try {
      py::gil_scoped_release release;
      const ActiveCall active;
      result = pipeline_->generate(request, hooks);
    } catch (const cubevec::pipelines::Cancelled&) {
      if (python_error) throw std::move(*python_error);
      throw;
    } catch (const BadArgument&) {
      throw;
    } catch (const cubevec::Error& e) {  // in the call's terms, not the command line's flags
      throw cubevec::Error(cubevec::pipelines::in_request_terms(e.what()));
    }
    py::list images;
    for (const auto& image : result.images) images.append(to_array(image));
    py::dict out;
    out["images"] = images;
    out["report"] = cubevec::dump_json(result.report);
    return out;
  }

  std::string family() const { return pipeline_->model().family(); }
  std::string task() const { return pipeline_->model().task(); }

 private:
  std::unique_ptr<Pipeline> pipeline_;
};

// A C++ message as Python text: bytes that are not UTF-8 (a path's) are shown escaped, not lost.
py::object message_text(const char* what) {
  return py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "backslashreplace"));
}

void set_python_error(PyObject* type, const char* what) { PyErr_SetObject(type, message_text(what).ptr()); }

// `self` of a method, through its holder: an instance made with Pipeline.__new__ alone has no C++
// object behind it (pybind11 hands a plain pointer to such an instance as if it had one).
std::shared_ptr<PythonPipeline> loaded(const py::object& self) {
  try {
    auto pipeline = self.cast<std::shared_ptr<PythonPipeline>>();
    if (pipeline) return pipeline;
  } catch (const py::cast_error&) {
  }
  throw py::type_error("this Pipeline was not loaded: make pipelines with Pipeline.load(path)");
}

}  // namespace

PYBIND11_MODULE(_cubevec, m) {
  m.doc() = "cubevec's generation library: a model folder loaded once, then any number of requests";
  // NumPy's C API is set up now, under the import lock, not on the first array a call makes: a
  // thread importing NumPy there while others wait for that one-time setup deadlocked.
  py::module_::import("numpy");
  py::array_t<uint8_t> first_array(std::vector<py::ssize_t>{0});  // pybind11's NumPy API, made here once
  static py::exception<cubevec::Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const BadArgument& e) {
      set_python_error(PyExc_ValueError, e.what());
    } catch (const cubevec::Error& e) {
      set_python_error(error.ptr(), e.what());
    } catch (const std::filesystem::filesystem_error& e) {
      // OSError(errno, text, filename) becomes FileNotFoundError, PermissionError, ... by errno.
      py::object text = message_text(e.code().message().c_str());
      py::object file = message_text(e.path1().c_str());
      PyErr_SetObject(PyExc_OSError, py::make_tuple(e.code().value(), text, file).ptr());
    }
  });
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    exiting = true;
    py::gil_scoped_release release;
    while (cubevec::python::active_calls.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }));
  py::class_<PythonPipeline, std::shared_ptr<PythonPipeline>>(m, "Pipeline")
      .def_static(
          "load",
          [](const std::string& path, const std::string& options_json) {
            std::error_code ec;
            if (!std::filesystem::is_directory(path, ec)) {
              set_python_error(PyExc_FileNotFoundError, (path + ": no such model folder").c_str());
              throw py::error_already_set();
            }
            return PythonPipeline::load(path, options_json);
          },
          py::arg("path"), py::arg("options_json") = "{}", "Loads a diffusers model folder (options: LoadOptions' JSON keys)")
      .def(
          "generate",
          [](const py::object& self, const std::string& request_json, const py::object& on_step) {
            return loaded(self)->generate(request_json, on_step);
          },
          py::arg("request_json"), py::arg("on_step") = py::none(),
          "Runs one request (the library's request JSON); returns {'images': [HxWx3 uint8 arrays], 'report': JSON text}")
      .def_property_readonly(
          "family", [](const py::object& self) { return loaded(self)->family(); }, "\"flux\" or \"wan\"")
      .def_property_readonly(
          "task", [](const py::object& self) { return loaded(self)->task(); }, "\"t2i\" or \"t2v\"");
  cubevec::python::register_layers(m);
}
