# The control plane: store, auth, devices, rpc, server, and gpushared itself.
add_library(gscontrol STATIC
  ${CMAKE_CURRENT_SOURCE_DIR}/store.c ${CMAKE_CURRENT_SOURCE_DIR}/auth.c
  ${CMAKE_CURRENT_SOURCE_DIR}/devices.c ${CMAKE_CURRENT_SOURCE_DIR}/log.c
  ${CMAKE_CURRENT_SOURCE_DIR}/rpc.c ${CMAKE_CURRENT_SOURCE_DIR}/rpc_arena.c
  ${CMAKE_CURRENT_SOURCE_DIR}/server.c ${CMAKE_CURRENT_SOURCE_DIR}/supervisor.c
  ${CMAKE_CURRENT_SOURCE_DIR}/datasets.c ${CMAKE_CURRENT_SOURCE_DIR}/jobs.c)
target_include_directories(gscontrol PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
# The control plane plans and validates jobs (gsplan, gstrain's model) but
# never runs a kernel: that is the executors' (gpushare-executor).
target_link_libraries(gscontrol PUBLIC gsplan gstrain gstrain_io gsalloc gskernels gssupport gsproto gscommon
                      PkgConfig::SQLITE PkgConfig::LIBUV PkgConfig::ZLIB)

add_executable(gpushared ${CMAKE_CURRENT_SOURCE_DIR}/main.c)
target_link_libraries(gpushared PRIVATE gscontrol)

install(TARGETS gpushared RUNTIME DESTINATION bin)

if(GS_TESTS)
  gs_unit_test(test_store SOURCES ${GS_SOURCE_DIR}/tests/unit/test_store.c LIBS gscontrol)
  gs_unit_test(test_auth SOURCES ${GS_SOURCE_DIR}/tests/unit/test_auth.c LIBS gscontrol)
endif()
