# gsplan: the memory planner (daemon/plan.c): plans, admission, auto-fit,
# suggestions, OOM reports and memory timelines as text, JSON and messages.
# Included from daemon/CMakeLists.txt; gpushare-run (daemon/train/) links it.
add_library(gsplan STATIC ${CMAKE_CURRENT_SOURCE_DIR}/plan.c)
target_include_directories(gsplan PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(gsplan PUBLIC gstrain gsalloc gskernels gsproto gscommon)
set_target_properties(gsplan PROPERTIES POSITION_INDEPENDENT_CODE ON)

if(GS_TESTS AND EXISTS ${GS_SOURCE_DIR}/tests/unit/test_plan.c)
  gs_unit_test(test_plan SOURCES ${GS_SOURCE_DIR}/tests/unit/test_plan.c LIBS gsplan)
  target_include_directories(test_plan PRIVATE ${GS_SOURCE_DIR}/tests/unit)
  # The shipped examples, encoded by examples/CMakeLists.txt (gs_examples).
  target_compile_definitions(test_plan PRIVATE GS_EXAMPLES_PB_DIR="${CMAKE_BINARY_DIR}/examples")
  if(PROTOC)
    add_dependencies(test_plan gs_examples)
  endif()
  set_tests_properties(test_plan PROPERTIES TIMEOUT 900)
endif()

# Prints the allocator's share of a training step; never part of the test suite.
if(EXISTS ${GS_SOURCE_DIR}/tests/bench/bench_alloc_step.c)
  add_executable(bench_alloc_step ${GS_SOURCE_DIR}/tests/bench/bench_alloc_step.c)
  target_link_libraries(bench_alloc_step PRIVATE gstrain)
  target_compile_definitions(bench_alloc_step PRIVATE
    GS_EXAMPLES_PB_DIR="${CMAKE_BINARY_DIR}/examples")
endif()
