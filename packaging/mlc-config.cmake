# The CMake package of mlc, a header-only C99 machine-learning library (installed by make install).
#
#   find_package(mlc 0.1 REQUIRED)                      # or: COMPONENTS OpenCL OpenBLAS
#   add_executable(app main.c)
#   target_link_libraries(app PRIVATE mlc::mlc)         # the include directory, -lm, C99
#
# Header-only: define MLC_IMPLEMENTATION in exactly one source file before #include "mlc.h".
# Targets (each an INTERFACE target; link the ones you want, the options bring mlc::mlc along):
#   mlc::mlc       the headers, libm, C99
#   mlc::opencl    component OpenCL: MLC_OPENCL (the backend of mlc_opencl.h) and the OpenCL C
#                  headers; libOpenCL is opened at run time, so nothing of OpenCL is linked, only
#                  ${CMAKE_DL_LIBS} for dlopen (glibc before 2.34)
#   mlc::openblas  component OpenBLAS: MLC_USE_CBLAS (matrix products through cblas_sgemm) with
#                  OpenBLAS's cblas.h and library (Accelerate on Apple)
# A component that was not asked for is still looked for, quietly; mlc_OpenCL_FOUND and
# mlc_OpenBLAS_FOUND say which were found. MLC_OPENCL_INCLUDE_DIR, MLC_OPENBLAS_INCLUDE_DIR and
# MLC_OPENBLAS_LIBRARY (cache variables) point the search elsewhere.

if(CMAKE_VERSION VERSION_LESS 3.5)
  message(FATAL_ERROR "mlc's CMake package needs CMake 3.5 or later")
endif()

# <prefix>/lib/cmake/mlc/ -> <prefix>
get_filename_component(_mlc_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

if(NOT TARGET mlc::mlc)
  add_library(mlc::mlc INTERFACE IMPORTED)
  set_target_properties(mlc::mlc PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${_mlc_prefix}/include"
    INTERFACE_COMPILE_FEATURES c_std_99)
  if(UNIX)
    set_property(TARGET mlc::mlc APPEND PROPERTY INTERFACE_LINK_LIBRARIES m)
  endif()
endif()

# OpenCL: <CL/cl.h> at build time (Apple: the OpenCL framework's headers, always there)
if(APPLE)
  set(mlc_OpenCL_FOUND TRUE)
else()
  find_path(MLC_OPENCL_INCLUDE_DIR CL/cl.h HINTS ENV OpenCL_ROOT ENV OPENCL_ROOT PATH_SUFFIXES include)
  if(MLC_OPENCL_INCLUDE_DIR)
    set(mlc_OpenCL_FOUND TRUE)
  else()
    set(mlc_OpenCL_FOUND FALSE)
    set(_mlc_OpenCL_why "no CL/cl.h (install the OpenCL headers, e.g. Debian's opencl-headers)")
  endif()
endif()
if(mlc_OpenCL_FOUND AND NOT TARGET mlc::opencl)
  add_library(mlc::opencl INTERFACE IMPORTED)
  set_target_properties(mlc::opencl PROPERTIES
    INTERFACE_COMPILE_DEFINITIONS MLC_OPENCL
    INTERFACE_LINK_LIBRARIES "mlc::mlc;${CMAKE_DL_LIBS}")
  if(MLC_OPENCL_INCLUDE_DIR)
    set_property(TARGET mlc::opencl APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${MLC_OPENCL_INCLUDE_DIR}")
  endif()
endif()

# OpenBLAS: cblas.h and libopenblas (Apple: mlc.h takes cblas_sgemm from Accelerate)
if(APPLE)
  set(mlc_OpenBLAS_FOUND TRUE)
  set(_mlc_blas_libs "-framework Accelerate")
  set(_mlc_blas_include "")
else()
  find_path(MLC_OPENBLAS_INCLUDE_DIR cblas.h HINTS ENV OpenBLAS_HOME ENV OPENBLAS_ROOT
            PATH_SUFFIXES include/openblas openblas include)
  find_library(MLC_OPENBLAS_LIBRARY NAMES openblas libopenblas HINTS ENV OpenBLAS_HOME ENV OPENBLAS_ROOT
               PATH_SUFFIXES lib lib64)
  if(MLC_OPENBLAS_INCLUDE_DIR AND MLC_OPENBLAS_LIBRARY)
    set(mlc_OpenBLAS_FOUND TRUE)
    set(_mlc_blas_libs "${MLC_OPENBLAS_LIBRARY}")
    set(_mlc_blas_include "${MLC_OPENBLAS_INCLUDE_DIR}")
  else()
    set(mlc_OpenBLAS_FOUND FALSE)
    set(_mlc_OpenBLAS_why "no cblas.h or libopenblas (install OpenBLAS, e.g. Debian's libopenblas-dev)")
  endif()
endif()
if(mlc_OpenBLAS_FOUND AND NOT TARGET mlc::openblas)
  add_library(mlc::openblas INTERFACE IMPORTED)
  set_target_properties(mlc::openblas PROPERTIES
    INTERFACE_COMPILE_DEFINITIONS MLC_USE_CBLAS
    INTERFACE_LINK_LIBRARIES "mlc::mlc;${_mlc_blas_libs}")
  if(_mlc_blas_include)
    set_property(TARGET mlc::openblas APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_mlc_blas_include}")
  endif()
endif()

# Components asked for: an unknown one or a REQUIRED one not found means mlc is not found
set(mlc_FOUND TRUE)
foreach(_mlc_comp IN LISTS mlc_FIND_COMPONENTS)
  if(NOT _mlc_comp STREQUAL "OpenCL" AND NOT _mlc_comp STREQUAL "OpenBLAS")
    set(mlc_${_mlc_comp}_FOUND FALSE)
    set(_mlc_${_mlc_comp}_why "unknown component (mlc has OpenCL and OpenBLAS)")
  endif()
  if(NOT mlc_${_mlc_comp}_FOUND AND mlc_FIND_REQUIRED_${_mlc_comp})
    set(mlc_FOUND FALSE)
    string(APPEND mlc_NOT_FOUND_MESSAGE "component ${_mlc_comp}: ${_mlc_${_mlc_comp}_why}. ")
  endif()
endforeach()

unset(_mlc_prefix)
unset(_mlc_comp)
unset(_mlc_blas_libs)
unset(_mlc_blas_include)
unset(_mlc_OpenCL_why)
unset(_mlc_OpenBLAS_why)
