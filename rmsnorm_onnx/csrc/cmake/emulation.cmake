# librmsnorm_onnx_emulated: the CUDA kernel body (cuda/rmsnorm_kernel.h) compiled for the host and
# run by a fiber emulator of CUDA blocks and warps (cuda/emulation/, none of which ships in the
# custom-op library), with the launch configuration the CUDA launcher would choose. Used only by tests/test_cuda_emulated.py (ctypes); built with or without nvcc.
# Included by CMakeLists.txt; option RMSNORM_ONNX_EMULATION (default ON) turns it off.
if(NOT RMSNORM_ONNX_EMULATION)
  return()
endif()

add_library(rmsnorm_onnx_emulated SHARED
  "${CMAKE_CURRENT_LIST_DIR}/../cuda/emulation/emulated_api.cc"
  "${CMAKE_CURRENT_LIST_DIR}/../cuda/emulation/emulator.cc")
target_include_directories(rmsnorm_onnx_emulated PRIVATE "${CMAKE_CURRENT_LIST_DIR}/..")
target_compile_features(rmsnorm_onnx_emulated PRIVATE cxx_std_17)
find_package(Threads REQUIRED)  # the launch-protocol tests race threads
target_link_libraries(rmsnorm_onnx_emulated PRIVATE Threads::Threads)
set_target_properties(rmsnorm_onnx_emulated PROPERTIES
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  POSITION_INDEPENDENT_CODE ON)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(rmsnorm_onnx_emulated PRIVATE -Wall -Wextra -O2)
endif()
install(TARGETS rmsnorm_onnx_emulated LIBRARY DESTINATION rmsnorm_onnx RUNTIME DESTINATION rmsnorm_onnx)

if(RMSNORM_ONNX_SANITIZE)
  # the sanitizer run (tools/run_sanitized.sh) checks the emulated CUDA kernel too
  target_compile_options(rmsnorm_onnx_emulated PRIVATE
    -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_link_options(rmsnorm_onnx_emulated PRIVATE -fsanitize=address,undefined)
endif()
