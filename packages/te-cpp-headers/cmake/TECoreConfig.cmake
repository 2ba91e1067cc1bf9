# TECore: te's C API for CMake projects.
#
#   find_package(TECore CONFIG REQUIRED)   # TECore_DIR = `python -m te_cpp_headers --cmakedir`
#   target_link_libraries(app PRIVATE TECore::te_core)
#
# Headers come from this package. The library is te-core's libte_core.so: TECore_LIBRARY if set,
# else the one of the te-core wheel importable by the Python found here (Python3_EXECUTABLE, or
# python3 on PATH).
include(FindPackageHandleStandardArgs)
set(TECore_VERSION 0.1.0)

get_filename_component(TECore_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../include" ABSOLUTE)

if(NOT TECore_LIBRARY)
  if(NOT Python3_EXECUTABLE)
    find_program(Python3_EXECUTABLE NAMES python3 python)
  endif()
  if(Python3_EXECUTABLE)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c "import te_core; print(te_core.library_path())"
      OUTPUT_VARIABLE _te_library OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _te_result ERROR_QUIET)
    if(_te_result EQUAL 0 AND EXISTS "${_te_library}")
      set(TECore_LIBRARY "${_te_library}" CACHE FILEPATH "te-core's libte_core.so")
    endif()
  endif()
endif()

find_package_handle_standard_args(TECore
  REQUIRED_VARS TECore_LIBRARY TECore_INCLUDE_DIR
  VERSION_VAR TECore_VERSION
  REASON_FAILURE_MESSAGE
    "libte_core.so not found: pip install te-core (into the Python CMake finds: set Python3_EXECUTABLE), or set TECore_LIBRARY")

if(TECore_FOUND AND NOT TARGET TECore::te_core)
  add_library(TECore::te_core SHARED IMPORTED)
  set_target_properties(TECore::te_core PROPERTIES
    IMPORTED_LOCATION "${TECore_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${TECore_INCLUDE_DIR}")
endif()
