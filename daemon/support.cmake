# gssupport: what ties gpushared to its host: the configuration file
# (config.c) and the systemd notify/watchdog/socket-activation protocols
# (notify.c). Included from daemon/CMakeLists.txt.
add_library(gssupport STATIC
  ${CMAKE_CURRENT_SOURCE_DIR}/notify.c
  ${CMAKE_CURRENT_SOURCE_DIR}/config.c)
target_include_directories(gssupport PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(gssupport PUBLIC gscommon)
set_target_properties(gssupport PROPERTIES POSITION_INDEPENDENT_CODE ON)

if(GS_TESTS)
  gs_unit_test(test_config SOURCES ${GS_SOURCE_DIR}/tests/unit/test_config.c LIBS gssupport)
  gs_unit_test(test_notify SOURCES ${GS_SOURCE_DIR}/tests/unit/test_notify.c LIBS gssupport)
endif()

# The service units are installed by the top-level CMakeLists.txt; the
# groups and user they rely on go where systemd-sysusers looks for them.
install(FILES ${GS_SOURCE_DIR}/systemd/sysusers.d/gpushare.conf DESTINATION lib/sysusers.d)
