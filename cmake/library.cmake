# feplb_library(TARGET NAME): one of the libraries `cmake --install` installs and the CMake
# package exports as feplb::NAME (an alias of the same name in this build, so in-tree users and
# the installed package's users spell it alike). Includes start at the repository root here and
# at <prefix>/include when installed; versioned soname (libfeplb_core.so.0.1).
function(feplb_library target name)
  add_library(feplb::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES
    EXPORT_NAME ${name}
    VERSION ${PROJECT_VERSION}
    SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  set_property(GLOBAL APPEND PROPERTY FEPLB_INSTALLED_LIBRARIES ${target})
  feplb_warnings(${target})
endfunction()
