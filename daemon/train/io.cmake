# daemon/train/io.cmake: the training runtime's I/O (datasets, checkpoints,
# safetensors export) as gstrain_io, and its unit tests. Included from
# daemon/train/CMakeLists.txt.
add_library(gstrain_io STATIC
  ${CMAKE_CURRENT_LIST_DIR}/data.c
  ${CMAKE_CURRENT_LIST_DIR}/ckpt.c
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.c)
target_include_directories(gstrain_io PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(gstrain_io PUBLIC gscommon PkgConfig::ZLIB m)
set_target_properties(gstrain_io PROPERTIES POSITION_INDEPENDENT_CODE ON)
# The batch gather (uint8 pixels / 255 into fp32) runs every step on the
# job's thread: -O3 vectorises its division (-O2 leaves it scalar, slower
# than the table it replaced).
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/data.c PROPERTIES COMPILE_OPTIONS -O3)

if(GS_TESTS)
  foreach(t data ckpt safetensors)
    if(EXISTS ${GS_SOURCE_DIR}/tests/unit/test_${t}.c)
      gs_unit_test(test_${t} SOURCES ${GS_SOURCE_DIR}/tests/unit/test_${t}.c LIBS gstrain_io)
    endif()
  endforeach()
endif()
