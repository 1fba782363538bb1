# daemon/executor.cmake: the per-device executor (gpushare-executor, executor.c)
# and its compute-share scheduler (gsfairshare, fairshare.c), with their unit
# tests. Included from daemon/CMakeLists.txt. The executable lands in this
# directory's build folder, beside gpushared, where the supervisor looks.
add_library(gsfairshare STATIC ${CMAKE_CURRENT_SOURCE_DIR}/fairshare.c)
target_include_directories(gsfairshare PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(gsfairshare PUBLIC Threads::Threads m)
set_target_properties(gsfairshare PROPERTIES POSITION_INDEPENDENT_CODE ON)

if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/executor.c)
  add_executable(gpushare-executor ${CMAKE_CURRENT_SOURCE_DIR}/executor.c)
  target_link_libraries(gpushare-executor PRIVATE gsfairshare gstrain gstrain_io gsalloc
                        gskernels gsproto gscommon Threads::Threads m)
  install(TARGETS gpushare-executor RUNTIME DESTINATION bin)
  # gpuN devices open the CUDA plugin through kernels/loader.c (in gskernels).
  if(EXISTS ${GS_SOURCE_DIR}/kernels/loader.c AND EXISTS ${GS_SOURCE_DIR}/kernels/loader.h)
    target_compile_definitions(gpushare-executor PRIVATE GS_EXECUTOR_CUDA=1)
  endif()
  # The planner (plan.cmake, included before this file): planned peaks in the
  # memory timeline and what would fit in OOM reports.
  if(TARGET gsplan)
    target_link_libraries(gpushare-executor PRIVATE gsplan)
    target_compile_definitions(gpushare-executor PRIVATE GS_EXECUTOR_PLAN=1)
  endif()
endif()

if(GS_TESTS)
  gs_unit_test(test_fairshare SOURCES ${GS_SOURCE_DIR}/tests/unit/test_fairshare.c
               LIBS gsfairshare)
  if(TARGET gpushare-executor AND EXISTS ${GS_SOURCE_DIR}/tests/unit/test_executor.c)
    gs_unit_test(test_executor SOURCES ${GS_SOURCE_DIR}/tests/unit/test_executor.c
                 LIBS gsproto gscommon)
    target_compile_definitions(test_executor PRIVATE
      GS_EXECUTOR_PATH="$<TARGET_FILE:gpushare-executor>")
    if(TARGET gsplan)
      # The test plans its job to size a vdev just too small for it.
      target_link_libraries(test_executor PRIVATE gsplan)
      target_compile_definitions(test_executor PRIVATE GS_EXECUTOR_PLAN=1)
    endif()
    add_dependencies(test_executor gpushare-executor)
    # The shares test trains for about 5 s of device time (CPU time), in
    # either build; the timeout is for a badly overloaded machine.
    set_tests_properties(test_executor PROPERTIES TIMEOUT 900)
  endif()
endif()
