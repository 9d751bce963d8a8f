# Finds NCCL >= the requested version. Looks in NCCL_HOME (CMake or environment variable) first,
# then the CUDA toolkit and system paths. Accepts an installation that has only the versioned
# libnccl.so.2 (as Python wheels ship it).
#
# Defines NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR, NCCL_LIBRARY and the imported target NCCL::nccl.

set(_nccl_hints)
if(DEFINED NCCL_HOME)
  list(APPEND _nccl_hints "${NCCL_HOME}")
endif()
if(DEFINED ENV{NCCL_HOME})
  list(APPEND _nccl_hints "$ENV{NCCL_HOME}")
endif()

# The hint alone first: with several names and several directories CMake tries every name in a
# directory before the next directory only with NAMES_PER_DIR; otherwise a system libnccl.so would
# win over the hinted libnccl.so.2.
if(_nccl_hints)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
               HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
             HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_major REGEX "^#define NCCL_MAJOR +[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_minor REGEX "^#define NCCL_MINOR +[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_patch REGEX "^#define NCCL_PATCH +[0-9]+")
  string(REGEX REPLACE "[^0-9]*([0-9]+)" "\\1" _nccl_major "${_nccl_major}")
  string(REGEX REPLACE "[^0-9]*([0-9]+)" "\\1" _nccl_minor "${_nccl_minor}")
  string(REGEX REPLACE "[^0-9]*([0-9]+)" "\\1" _nccl_patch "${_nccl_patch}")
  set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
                                  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
