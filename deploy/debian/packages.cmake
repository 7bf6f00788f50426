# SPDX-License-Identifier: Apache-2.0
# The Debian packages (cpack -G DEB, run by scripts/package.sh): one package
# per install component, split as Debian splits a library with its daemon and
# tools. scripts/package.sh checks what each package holds and runs lintian on
# them; the systemd suite installs them in a throw-away guest.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME rdmabroker)
set(CPACK_PACKAGE_VENDOR "rdmabroker")
set(CPACK_PACKAGE_CONTACT "rdmabroker maintainers <maintainers@rdmabroker.invalid>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon clients lib dev python)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Dependencies on shared libraries come from dpkg-shlibdeps; the library
# package gets a shlibs file so that packages built against it depend on
# librdmabroker0 (>= this version).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
# dpkg-shlibdeps looks for librdmabroker.so.0 (needed by the CLI) in the build
# tree; it has no shlibs file there, so the dependencies on it are stated (the
# CLI's, and the daemon's: its routes to other brokers use the library).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR}/client-lib)
# Stripped binaries; their debug information goes into -dbgsym packages that
# scripts/lib/finish-debs.sh makes after cpack (CPack 3.25's own,
# CPACK_DEBIAN_DEBUGINFO_PACKAGE, fail lintian: md5sums with build-tree
# paths, no copyright). It also adds Multi-Arch: same to librdmabroker0,
# which CPack has no variable for.
set(CPACK_STRIP_FILES ON)
set(same_version "(= ${PROJECT_VERSION})")

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME rdmabroker)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION net)
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "rdma-core, ibverbs-providers, systemd, librdmabroker0 ${same_version}")
# The CLI is how an operator adds users (rdmabroker passwd) and reads the
# broker's state (rdmabroker stat) through the admin socket.
set(CPACK_DEBIAN_DAEMON_PACKAGE_RECOMMENDS "rdmabroker-clients")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/deploy/debian/daemon/conffiles
    ${PROJECT_SOURCE_DIR}/deploy/debian/daemon/postinst
    ${PROJECT_SOURCE_DIR}/deploy/debian/daemon/prerm
    ${PROJECT_SOURCE_DIR}/deploy/debian/daemon/postrm)
set(CPACK_COMPONENT_DAEMON_DESCRIPTION "RDMA topic message broker (daemon)
rdmabrokerd relays topic messages between publishers and subscribers over
RDMA (InfiniBand, RoCE; reliable connections and multicast groups) and over
TCP for hosts without RDMA. It runs under systemd (Type=notify, watchdog,
live reload of /etc/rdmabroker/broker.yaml), exports Prometheus metrics and
health probes, and authenticates and authorizes its clients.
This package holds the daemon, its configuration and its systemd unit.")

set(CPACK_DEBIAN_CLIENTS_PACKAGE_NAME rdmabroker-clients)
set(CPACK_DEBIAN_CLIENTS_PACKAGE_SECTION net)
set(CPACK_DEBIAN_CLIENTS_PACKAGE_DEPENDS "librdmabroker0 ${same_version}")
set(CPACK_COMPONENT_CLIENTS_DESCRIPTION "RDMA topic message broker (command-line client)
The rdmabroker command publishes, subscribes, requests and replies through an
rdmabroker daemon over RDMA or TCP, measures it (bench), reads its state
through the admin socket (stat) and hashes passwords for its configuration
(passwd). Its exit codes tell scripts what happened.")

set(CPACK_DEBIAN_LIB_PACKAGE_NAME librdmabroker0)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
# symbols: what the library exports, with the version that brought each
# (scripts/symbols.sh writes it; scripts/package.sh checks it is current).
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/deploy/debian/lib/symbols
    ${PROJECT_SOURCE_DIR}/deploy/debian/lib/triggers
    ${PROJECT_SOURCE_DIR}/deploy/debian/lib/postinst
    ${PROJECT_SOURCE_DIR}/deploy/debian/lib/postrm)
set(CPACK_COMPONENT_LIB_DESCRIPTION "RDMA topic message broker (client library)
librdmabroker connects applications to an rdmabroker daemon over RDMA or TCP
to publish, subscribe (with queue groups) and make requests, and reconnects
when the broker restarts. It has a C++ API and a C API.
This package holds the shared library.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME librdmabroker-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "librdmabroker0 ${same_version}")
set(CPACK_COMPONENT_DEV_DESCRIPTION "RDMA topic message broker (client library, development files)
librdmabroker connects applications to an rdmabroker daemon over RDMA or TCP
to publish, subscribe (with queue groups) and make requests.
This package holds the C and C++ headers, the CMake package
(find_package(rdmabroker), target rdmabroker::rdmabroker) and the pkg-config
file (rdmabroker.pc).")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-rdmabroker)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/deploy/debian/python/postinst
    ${PROJECT_SOURCE_DIR}/deploy/debian/python/prerm)
# The package loads librdmabroker.so.0 with ctypes, so no tool can find the
# dependency: it is stated here.
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3:any, librdmabroker0 (>= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_PYTHON_DESCRIPTION "RDMA topic message broker (Python 3 client)
The rdmabroker Python package connects to an rdmabroker daemon over RDMA or
TCP through librdmabroker's C API: publish, subscribe with a callback or as an
iterator, queue groups, request and reply, and an asyncio form
(rdmabroker.aio).")
include(CPack)
