# gsalloc: the vdev allocator (daemon/alloc.c). It needs only the backend
# contract (kernels/backend.h), not the kernels library, so it builds and is
# tested on its own.
add_library(gsalloc STATIC ${CMAKE_CURRENT_SOURCE_DIR}/alloc.c)
target_include_directories(gsalloc PUBLIC ${CMAKE_CURRENT_SOURCE_DIR} ${GS_SOURCE_DIR}/kernels)
target_link_libraries(gsalloc PUBLIC Threads::Threads)
set_target_properties(gsalloc PROPERTIES POSITION_INDEPENDENT_CODE ON)

if(GS_TESTS)
  gs_unit_test(test_alloc SOURCES ${GS_SOURCE_DIR}/tests/unit/test_alloc.c LIBS gsalloc)
endif()

# Prints allocator cost against malloc/free; never part of the test suite.
add_executable(bench_alloc ${GS_SOURCE_DIR}/tests/bench/bench_alloc.c)
target_link_libraries(bench_alloc PRIVATE gsalloc)
