# CUTLASS's headers for the grouped GEMM kernels (feplb/cuda/kernels/grouped_gemm_*.cu): the
# pinned release packed in third_party/cutlass (its README says which and why), checked against
# its SHA-256 and unpacked into the build tree once. Nothing is downloaded.
set(FEPLB_CUTLASS_VERSION 4.5.3)
set(FEPLB_CUTLASS_ARCHIVE
    ${PROJECT_SOURCE_DIR}/third_party/cutlass/cutlass-${FEPLB_CUTLASS_VERSION}-include.tar.xz)
set(FEPLB_CUTLASS_SHA256 f4575cb4dbbe9886f41073f7e93aad59d79f6941e86c67775858e3213965d09f)
set(FEPLB_CUTLASS_DIR ${CMAKE_BINARY_DIR}/third_party/cutlass-${FEPLB_CUTLASS_VERSION})
set(_marker ${FEPLB_CUTLASS_DIR}/.unpacked-${FEPLB_CUTLASS_SHA256})
if(NOT EXISTS ${_marker})
  if(NOT EXISTS ${FEPLB_CUTLASS_ARCHIVE})
    message(FATAL_ERROR "feplb: ${FEPLB_CUTLASS_ARCHIVE} is missing (third_party/cutlass/README.md)")
  endif()
  file(SHA256 ${FEPLB_CUTLASS_ARCHIVE} _sha)
  if(NOT _sha STREQUAL FEPLB_CUTLASS_SHA256)
    message(FATAL_ERROR "feplb: ${FEPLB_CUTLASS_ARCHIVE} has SHA-256 ${_sha}, expected "
                        "${FEPLB_CUTLASS_SHA256} (third_party/cutlass/README.md)")
  endif()
  file(REMOVE_RECURSE ${FEPLB_CUTLASS_DIR})
  file(ARCHIVE_EXTRACT INPUT ${FEPLB_CUTLASS_ARCHIVE} DESTINATION ${CMAKE_BINARY_DIR}/third_party)
  file(TOUCH ${_marker})
endif()
set(FEPLB_CUTLASS_INCLUDE ${FEPLB_CUTLASS_DIR}/include)
