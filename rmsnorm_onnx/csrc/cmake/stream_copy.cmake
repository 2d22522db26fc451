# librmsnorm_onnx_stream_copy: the kernel benchmark's memory ceiling (stream_copy.cc), a plain
# streaming copy on the benchmark's threads, loaded by rmsnorm_onnx/bench/stream_copy.py through
# ctypes. A library of its own: the custom-op library exports RegisterCustomOps alone.
# Included by CMakeLists.txt.
add_library(rmsnorm_onnx_stream_copy SHARED "${CMAKE_CURRENT_LIST_DIR}/../stream_copy.cc")
target_compile_features(rmsnorm_onnx_stream_copy PRIVATE cxx_std_17)
find_package(Threads REQUIRED)
target_link_libraries(rmsnorm_onnx_stream_copy PRIVATE Threads::Threads)
set_target_properties(rmsnorm_onnx_stream_copy PROPERTIES
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  POSITION_INDEPENDENT_CODE ON)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(rmsnorm_onnx_stream_copy PRIVATE -Wall -Wextra -O2)
endif()
install(TARGETS rmsnorm_onnx_stream_copy
  LIBRARY DESTINATION rmsnorm_onnx RUNTIME DESTINATION rmsnorm_onnx)
