# The Python module (python/): pybind11 bindings over feplb_core and feplb_sim. Built when an
# interpreter with numpy, its development headers and pybind11 are found (FEPLB_PYTHON=AUTO), or
# required (ON). Pick the interpreter with -DPython_EXECUTABLE=... (scripts/build passes
# /usr/bin/python3, whose Debian packages hold pybind11, numpy and pytest).
set(FEPLB_WITH_PYTHON OFF)
if(NOT FEPLB_PYTHON STREQUAL "OFF")
  set(feplb_python_why "")
  find_package(Python 3.8 COMPONENTS Interpreter Development.Module)
  if(NOT Python_FOUND)
    set(feplb_python_why "no Python interpreter with development headers")
  else()
    # pybind11 installed into this interpreter with pip keeps its CMake files in the package.
    execute_process(
      COMMAND ${Python_EXECUTABLE} -c "import pybind11; print(pybind11.get_cmake_dir())"
      OUTPUT_VARIABLE feplb_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE feplb_rc ERROR_QUIET)
    if(feplb_rc EQUAL 0 AND IS_DIRECTORY "${feplb_pybind11_dir}")
      list(APPEND CMAKE_PREFIX_PATH "${feplb_pybind11_dir}")
    endif()
    find_package(pybind11 2.10 CONFIG QUIET)
    execute_process(COMMAND ${Python_EXECUTABLE} -c "import numpy"
                    RESULT_VARIABLE feplb_rc OUTPUT_QUIET ERROR_QUIET)
    if(NOT pybind11_FOUND)
      set(feplb_python_why "no pybind11 >= 2.10 for ${Python_EXECUTABLE}")
    elseif(NOT feplb_rc EQUAL 0)
      set(feplb_python_why "${Python_EXECUTABLE} cannot import numpy")
    else()
      set(FEPLB_WITH_PYTHON ON)
    endif()
  endif()
  if(NOT FEPLB_WITH_PYTHON AND FEPLB_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "FEPLB_PYTHON=ON but ${feplb_python_why}")
  endif()
endif()
if(FEPLB_WITH_PYTHON)
  set(feplb_python_status
      "Python module built for ${Python_EXECUTABLE}: scripts/python runs it (or PYTHONPATH=${CMAKE_BINARY_DIR}/python ${Python_EXECUTABLE})")
  message(STATUS "feplb: Python module ON (${Python_EXECUTABLE}, pybind11 ${pybind11_VERSION})")
elseif(FEPLB_PYTHON STREQUAL "OFF")
  set(feplb_python_status "Python module not built (FEPLB_PYTHON=OFF)")
  message(STATUS "feplb: Python module OFF")
else()
  set(feplb_python_status
      "Python module not built (${feplb_python_why}; pick an interpreter with PYTHON=... scripts/build)")
  message(STATUS "feplb: Python module OFF (${feplb_python_why}; pick an interpreter with "
                 "-DPython_EXECUTABLE=...)")
endif()
# scripts/build prints it.
file(WRITE ${CMAKE_BINARY_DIR}/python-module.txt "${feplb_python_status}\n")
