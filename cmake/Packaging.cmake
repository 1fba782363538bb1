# cmake/Packaging.cmake: the gpushare Debian package (CPack, DEB generator).
#
#   cmake --build build && (cd build && cpack -G DEB)
#
# builds build/gpushare_<version>_<arch>.deb with everything `cmake
# --install` puts under /usr: gpushared, gpuctl, gpushare-executor,
# gpushare-run, the CUDA plugin where it was built, the systemd units, the
# sysusers.d and tmpfiles.d entries, the docs and the examples. Included
# last from the top-level CMakeLists.txt, so every module's install() rules
# exist by then; the install() rules that belong to no module live here.
#
# The package always installs under /usr, whatever CMAKE_INSTALL_PREFIX the
# build was configured with (the units say ExecStart=/usr/bin/gpushared).
# Depends: comes from dpkg-shlibdeps (package dpkg-dev) reading the ELF
# files; libraries no Debian package owns (a CUDA toolkit installed from
# NVIDIA's own archives, which libgskernels_cuda.so links) are left out of
# it, since CPack passes --ignore-missing-info: the CUDA runtime is then the
# administrator's to install, and without it gpushared serves the cpu
# device and says why (docs/gpu.md).
#
# Maintainer scripts (cmake/debian/): postinst creates the groups gpushare
# and gpushare-admin and the user gpushare with systemd-sysusers (addgroup
# and adduser where systemd is absent), the state directory with
# systemd-tmpfiles, enables gpushared.socket with deb-systemd-helper (as
# debhelper's dh_installsystemd does: also without a running systemd, and
# under DPKG_ROOT) and on a first install under systemd starts it; prerm
# stops the units on removal; postrm masks the socket on removal and undoes
# its enablement on purge, and keeps /var/lib/gpushared, the tenants' data.

# Installed files that belong to no module.
install(FILES ${CMAKE_CURRENT_LIST_DIR}/../systemd/tmpfiles.d/gpushare.conf
        DESTINATION lib/tmpfiles.d)
install(FILES ${CMAKE_CURRENT_LIST_DIR}/../README.md DESTINATION share/doc/gpushare)
install(FILES docs/architecture.md docs/gpu.md docs/jobs.md docs/operations.md docs/protocol.md
              docs/security.md
        DESTINATION share/doc/gpushare)
# The example jobs: their text form and the binary JobSpecs `gpuctl submit`
# takes (examples/CMakeLists.txt encodes them).
foreach(stem ${GS_EXAMPLE_NAMES})
  install(FILES examples/${stem}.txtpb ${CMAKE_BINARY_DIR}/examples/${stem}.pb
          DESTINATION share/doc/gpushare/examples)
endforeach()
install(FILES examples/README.md DESTINATION share/doc/gpushare/examples)
# The protocol, where `gpuctl job encode` finds it (client/cmd_job.c).
install(FILES proto/gpushare.proto DESTINATION share/gpushare)
install(FILES completion/gpuctl.bash DESTINATION share/bash-completion/completions RENAME gpuctl)

# The package's copyright file and, gzip'd (-n: the same bytes every
# build), its changelog: a native package's, /usr/share/doc/gpushare/changelog.gz.
install(FILES ${CMAKE_CURRENT_LIST_DIR}/debian/copyright DESTINATION share/doc/gpushare)
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/changelog.gz
  COMMAND gzip -9nc ${CMAKE_CURRENT_LIST_DIR}/debian/changelog > ${CMAKE_BINARY_DIR}/changelog.gz
  DEPENDS ${CMAKE_CURRENT_LIST_DIR}/debian/changelog)
add_custom_target(gs_changelog ALL DEPENDS ${CMAKE_BINARY_DIR}/changelog.gz)
install(FILES ${CMAKE_BINARY_DIR}/changelog.gz DESTINATION share/doc/gpushare)

set(GS_PACKAGE_MAINTAINER "gpushare maintainers <maintainers@gpushare.example.org>" CACHE STRING
    "Maintainer: field of the Debian package (name <address>)")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME gpushare)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR gpushare)
set(CPACK_PACKAGE_CONTACT "${GS_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "multi-tenant GPU sharing daemon")
set(CPACK_PACKAGE_DESCRIPTION
    "gpushared owns a machine's GPUs (or its CPU), splits them into quota-limited
virtual devices and runs tenants' training jobs on them with weighted fair
shares of device time, checkpointing so jobs survive restarts. gpuctl is
its command-line client; gpushare-run runs one job without the daemon.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# The programs ship stripped; RelWithDebInfo's symbols go to
# gpushare-dbgsym_<version>_<arch>.ddeb beside the package, by build id.
set(CPACK_DEBIAN_DEBUGINFO_PACKAGE ON)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # gpushare_0.1.0_amd64.deb
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${GS_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# postinst falls back to adduser where systemd-sysusers is absent; the
# Python client (/usr/lib/python3/dist-packages/gpushare) needs a python3.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser, python3:any")
# protobuf-compiler: protoc, which `gpuctl job encode` and `job show` run;
# python3-protobuf: the Python client's one library.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd, protobuf-compiler, python3-protobuf")
# Suggests: where the CUDA plugin is in the package, Debian's packages of
# the libraries it links (kernels/cuda: cudart and cublasLt), named as
# Debian names them after the toolkit's sonames (libcudart.so.11.0 ->
# libcudart11.0 in Debian 12 non-free, libcudart.so.12 -> libcudart12).
if(TARGET gskernels_cuda)
  find_package(CUDAToolkit REQUIRED)
  set(gs_cudart libcudart${CUDAToolkit_VERSION_MAJOR})
  if(CUDAToolkit_VERSION_MAJOR EQUAL 11)
    set(gs_cudart libcudart11.0)
  endif()
  set(CPACK_DEBIAN_PACKAGE_SUGGESTS "${gs_cudart}, libcublaslt${CUDAToolkit_VERSION_MAJOR}")
endif()
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_CURRENT_LIST_DIR}/debian/postinst
    ${CMAKE_CURRENT_LIST_DIR}/debian/prerm
    ${CMAKE_CURRENT_LIST_DIR}/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)  # scripts 0755, as dpkg wants

include(CPack)
