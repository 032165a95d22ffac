# Cross-compiling for arm64 edge devices with Debian's g++-aarch64-linux-gnu against an
# arm64 sysroot made by scripts/arm64-sysroot.sh (docs/deployment.md, "ARM edge clients"):
#   cmake -S . -B build-arm64/build -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64.cmake
# Code generators run on the host: the host's protoc, and the host's gRPC plugins, which
# the sysroot script links where gRPC's arm64 package names them (same versions).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

set(CLEAVE_ARM64_SYSROOT "${CMAKE_CURRENT_LIST_DIR}/../build-arm64/sysroot"
    CACHE PATH "arm64 sysroot (scripts/arm64-sysroot.sh)")
get_filename_component(CLEAVE_ARM64_SYSROOT "${CLEAVE_ARM64_SYSROOT}" ABSOLUTE)
if(NOT EXISTS "${CLEAVE_ARM64_SYSROOT}/.complete")
  message(FATAL_ERROR "no arm64 sysroot at ${CLEAVE_ARM64_SYSROOT}: run scripts/arm64-sysroot.sh")
endif()
set(CMAKE_SYSROOT "${CLEAVE_ARM64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH "${CLEAVE_ARM64_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

set(ENV{PKG_CONFIG_SYSROOT_DIR} "${CLEAVE_ARM64_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR}
    "${CLEAVE_ARM64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${CLEAVE_ARM64_SYSROOT}/usr/share/pkgconfig")

set(Protobuf_PROTOC_EXECUTABLE /usr/bin/protoc CACHE FILEPATH "host protoc")
# qemu-user runs what the build and CTest execute: GoogleTest's test discovery, the tests.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static -L "${CLEAVE_ARM64_SYSROOT}")
