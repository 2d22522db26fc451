# ONNX Runtime C/C++ API headers, which ORT's Python wheels do not ship.
#
# ORT_INCLUDE_DIR (CMake variable or environment) wins. Otherwise the build fetches Debian trixie's
# libonnxruntime-dev 1.21 (headers of ORT API 21, pinned by hash) from a Debian mirror: the one in
# RMSNORM_ONNX_DEBIAN_MIRROR (CMake variable or environment), else the first Debian mirror named
# in this machine's apt configuration. The .deb is cached per user, so rebuilds do not download.
#
# Result: ORT_INCLUDE_DIR points at a folder holding onnxruntime_c_api.h and onnxruntime_cxx_api.h.

set(_ORT_DEB_NAME "libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb")
set(_ORT_DEB_POOL_PATH "pool/main/o/onnxruntime/${_ORT_DEB_NAME}")
set(_ORT_DEB_SHA256 "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08")

set(ORT_INCLUDE_DIR "" CACHE PATH
    "Folder with onnxruntime_c_api.h / onnxruntime_cxx_api.h (API >= 21); empty: fetch them")
set(RMSNORM_ONNX_DEBIAN_MIRROR "" CACHE STRING
    "Debian mirror base URL (ending in /debian) to fetch the ORT headers from; empty: apt config")

function(_ort_check_include_dir dir origin)
  foreach(header onnxruntime_c_api.h onnxruntime_cxx_api.h)
    if(NOT EXISTS "${dir}/${header}")
      message(FATAL_ERROR "${origin} ORT_INCLUDE_DIR='${dir}' has no ${header}; point it at the "
                          "folder holding the ONNX Runtime C/C++ API headers (API version >= 21)")
    endif()
  endforeach()
endfunction()

# The first http(s) URL ending in /debian in the apt sources (deb822 "URIs:" lines in
# sources.list.d/*.sources, one-line "deb URL suite ..." entries in sources.list and *.list).
function(_ort_mirror_from_apt out_var)
  set(candidates "")
  file(GLOB deb822_files "/etc/apt/sources.list.d/*.sources")
  foreach(f IN LISTS deb822_files)
    file(STRINGS "${f}" lines REGEX "^[ \t]*URIs:")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*URIs:[ \t]*" "" uris "${line}")
      string(REGEX REPLACE "[ \t]+" ";" uris "${uris}")
      list(APPEND candidates ${uris})
    endforeach()
  endforeach()
  file(GLOB list_files "/etc/apt/sources.list" "/etc/apt/sources.list.d/*.list")
  foreach(f IN LISTS list_files)
    file(STRINGS "${f}" lines REGEX "^[ \t]*deb[ \t]")
    foreach(line IN LISTS lines)
      # skip an optional "[arch=... signed-by=...]" block, then take the URL
      string(REGEX REPLACE "^[ \t]*deb[ \t]+(\\[[^]]*\\][ \t]+)?" "" rest "${line}")
      string(REGEX MATCH "^[^ \t]+" uri "${rest}")
      list(APPEND candidates "${uri}")
    endforeach()
  endforeach()
  foreach(uri IN LISTS candidates)
    string(REGEX REPLACE "/+$" "" uri "${uri}")
    if(uri MATCHES "^https?://.+/debian$")
      set(${out_var} "${uri}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out_var} "" PARENT_SCOPE)
endfunction()

function(_ort_fetch_headers out_var)
  # Per-user cache of the .deb, shared by every build tree (pip builds in fresh temp folders).
  if(DEFINED ENV{RMSNORM_ONNX_CACHE_DIR} AND NOT "$ENV{RMSNORM_ONNX_CACHE_DIR}" STREQUAL "")
    set(cache_dir "$ENV{RMSNORM_ONNX_CACHE_DIR}")
  elseif(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
    set(cache_dir "$ENV{XDG_CACHE_HOME}/rmsnorm_onnx")
  elseif(DEFINED ENV{HOME} AND NOT "$ENV{HOME}" STREQUAL "")
    set(cache_dir "$ENV{HOME}/.cache/rmsnorm_onnx")
  else()
    set(cache_dir "${CMAKE_BINARY_DIR}/_deps")
  endif()
  set(deps_dir "${CMAKE_BINARY_DIR}/_deps/ort_headers")
  set(include_dir "${deps_dir}/usr/include/onnxruntime")
  if(EXISTS "${include_dir}/onnxruntime_c_api.h" AND EXISTS "${deps_dir}/.sha256-${_ORT_DEB_SHA256}")
    set(${out_var} "${include_dir}" PARENT_SCOPE)
    return()
  endif()

  set(deb "${cache_dir}/${_ORT_DEB_NAME}")
  set(have_deb FALSE)
  if(EXISTS "${deb}")
    file(SHA256 "${deb}" cached_hash)
    if(cached_hash STREQUAL _ORT_DEB_SHA256)
      set(have_deb TRUE)
    else()
      file(REMOVE "${deb}")
    endif()
  endif()

  if(NOT have_deb)
    set(mirror "${RMSNORM_ONNX_DEBIAN_MIRROR}")
    if(mirror STREQUAL "" AND DEFINED ENV{RMSNORM_ONNX_DEBIAN_MIRROR})
      set(mirror "$ENV{RMSNORM_ONNX_DEBIAN_MIRROR}")
    endif()
    if(mirror STREQUAL "")
      _ort_mirror_from_apt(mirror)
    endif()
    if(mirror STREQUAL "")
      message(FATAL_ERROR
        "rmsnorm_onnx needs the ONNX Runtime C/C++ API headers (version >= 1.21). Either pass "
        "ORT_INCLUDE_DIR=<folder with onnxruntime_c_api.h> (CMake variable or environment), or "
        "RMSNORM_ONNX_DEBIAN_MIRROR=<Debian mirror base URL ending in /debian> to fetch "
        "${_ORT_DEB_NAME}; no Debian mirror was found in /etc/apt.")
    endif()
    string(REGEX REPLACE "/+$" "" mirror "${mirror}")
    set(url "${mirror}/${_ORT_DEB_POOL_PATH}")
    set(partial "${CMAKE_BINARY_DIR}/_deps/${_ORT_DEB_NAME}.part")
    message(STATUS "rmsnorm_onnx: fetching ORT headers from ${url}")
    # The hash is checked below rather than with EXPECTED_HASH, so that a failed connection and a
    # wrong file each get their own message.
    file(DOWNLOAD "${url}" "${partial}" TLS_VERIFY ON STATUS dl_status)
    list(GET dl_status 0 dl_code)
    if(NOT dl_code EQUAL 0)
      list(GET dl_status 1 dl_message)
      file(REMOVE "${partial}")
      message(FATAL_ERROR
        "rmsnorm_onnx: could not fetch ${url} (${dl_message}). Pass ORT_INCLUDE_DIR=<folder with "
        "onnxruntime_c_api.h> or RMSNORM_ONNX_DEBIAN_MIRROR=<a reachable Debian mirror>.")
    endif()
    file(SHA256 "${partial}" got_hash)
    if(NOT got_hash STREQUAL _ORT_DEB_SHA256)
      file(REMOVE "${partial}")
      message(FATAL_ERROR
        "rmsnorm_onnx: ${url} has SHA-256 ${got_hash}, expected ${_ORT_DEB_SHA256}; the mirror "
        "serves a different file. Pass ORT_INCLUDE_DIR=<folder with onnxruntime_c_api.h> or "
        "another RMSNORM_ONNX_DEBIAN_MIRROR.")
    endif()
    file(MAKE_DIRECTORY "${cache_dir}")
    # copy then rename, so a concurrent build never sees half a file
    file(COPY_FILE "${partial}" "${deb}.tmp" ONLY_IF_DIFFERENT RESULT copy_result)
    if(copy_result EQUAL 0)
      file(RENAME "${deb}.tmp" "${deb}" RESULT rename_result)
    endif()
    if(NOT EXISTS "${deb}")
      set(deb "${partial}")  # read-only cache: use the build tree's copy
    endif()
  endif()

  # A .deb is an ar archive holding data.tar.*; the headers live in its usr/include/onnxruntime.
  set(unpack_dir "${CMAKE_BINARY_DIR}/_deps/ort_deb")
  file(REMOVE_RECURSE "${unpack_dir}" "${deps_dir}")
  file(ARCHIVE_EXTRACT INPUT "${deb}" DESTINATION "${unpack_dir}")
  file(GLOB data_tar "${unpack_dir}/data.tar.*")
  if(NOT data_tar)
    message(FATAL_ERROR "rmsnorm_onnx: ${deb} holds no data.tar.*; not a Debian package?")
  endif()
  file(ARCHIVE_EXTRACT INPUT "${data_tar}" DESTINATION "${deps_dir}" PATTERNS "*usr/include/*")
  file(REMOVE_RECURSE "${unpack_dir}")
  _ort_check_include_dir("${include_dir}" "extracted")
  file(TOUCH "${deps_dir}/.sha256-${_ORT_DEB_SHA256}")
  set(${out_var} "${include_dir}" PARENT_SCOPE)
endfunction()

if(ORT_INCLUDE_DIR STREQUAL "" AND DEFINED ENV{ORT_INCLUDE_DIR}
   AND NOT "$ENV{ORT_INCLUDE_DIR}" STREQUAL "")
  set(ORT_INCLUDE_DIR "$ENV{ORT_INCLUDE_DIR}" CACHE PATH "" FORCE)
endif()

if(NOT ORT_INCLUDE_DIR STREQUAL "")
  _ort_check_include_dir("${ORT_INCLUDE_DIR}" "given")
  set(RMSNORM_ONNX_ORT_INCLUDE_DIR "${ORT_INCLUDE_DIR}")
else()
  _ort_fetch_headers(RMSNORM_ONNX_ORT_INCLUDE_DIR)
endif()

file(STRINGS "${RMSNORM_ONNX_ORT_INCLUDE_DIR}/onnxruntime_c_api.h" _ort_api_line
     REGEX "^#define ORT_API_VERSION [0-9]+")
string(REGEX MATCH "[0-9]+$" RMSNORM_ONNX_ORT_API_VERSION "${_ort_api_line}")
if(RMSNORM_ONNX_ORT_API_VERSION LESS 17)
  message(FATAL_ERROR "ORT headers in ${RMSNORM_ONNX_ORT_INCLUDE_DIR} are API "
                      "${RMSNORM_ONNX_ORT_API_VERSION}; rmsnorm_onnx needs API >= 17 (ORT 1.17)")
endif()
message(STATUS "rmsnorm_onnx: ORT headers (API ${RMSNORM_ONNX_ORT_API_VERSION}) in "
               "${RMSNORM_ONNX_ORT_INCLUDE_DIR}")
