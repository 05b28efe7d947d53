# Compiler flags shared by every module.
#
# Baseline ISA: x86-64-v3 (AVX2, FMA, F16C, BMI2) -- the oldest CPU tandem supports. Wider ISAs
# (AVX-512, AVX-512 BF16/VNNI, AMX) are only used by kernels that are selected at run time from
# the CPU's features (core/cpu_features.h): code after a `#pragma GCC target`, or the few kernel
# translation units ops/cpu/CMakeLists.txt compiles with ISA flags (docs/development.md, "CPU
# instruction sets", says why and what keeps them safe). core/cpu_check.c, compiled for plain
# x86-64, refuses older CPUs with a clear message before any other code runs.
set(TANDEM_BASELINE_FLAGS -march=x86-64-v3 -mtune=generic)
set(TANDEM_WARNING_FLAGS -Wall -Wextra -Wno-unused-parameter)

function(tandem_module name)
  # tandem_module(<name> DEPS <targets...>): a static library from every .cpp in the folder.
  cmake_parse_arguments(ARG "" "" "DEPS;SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    file(GLOB ARG_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  endif()
  if(NOT ARG_SOURCES)  # a module with only headers so far
    add_library(tandem_${name} INTERFACE)
    target_include_directories(tandem_${name} INTERFACE ${PROJECT_SOURCE_DIR})
    target_link_libraries(tandem_${name} INTERFACE ${ARG_DEPS})
    return()
  endif()
  add_library(tandem_${name} STATIC ${ARG_SOURCES})
  target_include_directories(tandem_${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(tandem_${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${TANDEM_BASELINE_FLAGS} ${TANDEM_WARNING_FLAGS}>)
  target_link_libraries(tandem_${name} PUBLIC ${ARG_DEPS})
endfunction()
