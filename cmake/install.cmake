# `cmake --install BUILD [--prefix P]`: the libraries (feplb_library targets), the public headers
# and the headers they include, the bundled data (<prefix>/share/feplb/data, found there by the
# installed binaries: feplb/sim/data_dir.h), the CLI, and a CMake package so that
# find_package(feplb) gives feplb::core, feplb::sim, feplb::dist and, when built, feplb::cuda.
# tests/consumer is a project built against the installed package (ctest: install.consumer).
include(CMakePackageConfigHelpers)
set(feplb_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/feplb)

# Public headers, by folder: feplb/planning.h and feplb/runtime.h and everything they include,
# plus the simulator's and the launcher's. None includes fmt, nlohmann-json, cuBLAS or NCCL
# (tests/consumer compiles each alone and checks).
set(feplb_public_headers
  feplb/planning.h
  feplb/core/copy_links.h
  feplb/core/cost_model.h
  feplb/core/errors.h
  feplb/core/expert_shape.h
  feplb/core/gpu_class.h
  feplb/core/gpu_classes.def
  feplb/core/knobs.def
  feplb/core/knobs.h
  feplb/core/limits.h
  feplb/core/metrics.h
  feplb/core/placement.h
  feplb/core/placer.h
  feplb/core/plan.h
  feplb/core/planners/planner.h
  feplb/core/routing.h
  feplb/core/schedule.h
  feplb/core/topology.h
  feplb/core/trace_io.h
  feplb/dist/launch.h
  feplb/sim/balance.h
  feplb/sim/cost_choice.h
  feplb/sim/data_dir.h
  feplb/sim/gemm_tables.h
  feplb/sim/placement_report.h
  feplb/sim/prior.h
  feplb/sim/rack.h
  feplb/sim/report.h
  feplb/sim/simulate.h
  feplb/sim/sweep.h
  feplb/sim/workload.h
)
set(feplb_public_cuda_headers
  feplb/runtime.h
  feplb/cuda/c_api.h
  feplb/cuda/device.h
  feplb/cuda/moe_layer.h
  feplb/cuda/nccl_comm.h
  feplb/cuda/runtime.h
  feplb/cuda/stats.h
  feplb/cuda/transport.h
)
set(feplb_headers ${feplb_public_headers})
if(FEPLB_WITH_CUDA)
  list(APPEND feplb_headers ${feplb_public_cuda_headers})
endif()
foreach(h ${feplb_headers})
  get_filename_component(dir ${h} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${dir}
          COMPONENT development)
endforeach()

# Libraries: the CPU ones in one export set; feplb_cuda in its own, which the package loads only
# where the CUDA toolkit is found (so feplb::core needs no CUDA on the consumer's machine).
get_property(feplb_libraries GLOBAL PROPERTY FEPLB_INSTALLED_LIBRARIES)
list(REMOVE_ITEM feplb_libraries feplb_cuda)
install(TARGETS ${feplb_libraries} EXPORT feplbTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
install(EXPORT feplbTargets NAMESPACE feplb:: DESTINATION ${feplb_cmake_dir} COMPONENT development)
if(FEPLB_WITH_CUDA)
  install(TARGETS feplb_cuda EXPORT feplbCudaTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
  install(EXPORT feplbCudaTargets NAMESPACE feplb:: DESTINATION ${feplb_cmake_dir} COMPONENT development)
  # The C API (feplb/cuda/c_api.h) that bindings load at run time (feplb.torch: FEPLB_LIBRARY).
  install(TARGETS feplb_c LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
endif()

# The CLI (and the GPU one, where it is a separate binary) and the data they read.
foreach(exe feplb feplb-gpu)
  if(TARGET ${exe})
    install(TARGETS ${exe} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  endif()
endforeach()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/data/ DESTINATION ${CMAKE_INSTALL_DATADIR}/feplb/data
        COMPONENT runtime)

# The package: feplbConfig.cmake, its version file (same major.minor is compatible: 0.x).
set(feplb_data_dir ${CMAKE_INSTALL_DATADIR}/feplb/data)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/feplbConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/feplbConfig.cmake
                              INSTALL_DESTINATION ${feplb_cmake_dir}
                              PATH_VARS feplb_data_dir CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/feplbConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/feplbConfig.cmake ${PROJECT_BINARY_DIR}/feplbConfigVersion.cmake
        DESTINATION ${feplb_cmake_dir} COMPONENT development)
