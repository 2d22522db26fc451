# The CUDA EP kernel of librmsnorm_onnx. Included by CMakeLists.txt when RMSNORM_ONNX_CUDA is on.
#
# - architectures: SASS for sm_75, 80, 86, 89 and 90, plus compute_90 PTX so newer GPUs can JIT it;
#   -DCMAKE_CUDA_ARCHITECTURES=... overrides (e.g. 90 alone while iterating).
# - the CUDA runtime is linked statically: the library loads where there is no driver or GPU.
# - ptxas's resource report (-Xptxas -v: registers, spills, shared memory per kernel and
#   architecture) is captured by a compiler launcher and gathered next to the library as
#   rmsnorm_onnx_ptxas.txt, installed with it; tests/test_cuda_build.py checks it.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 75-real 80-real 86-real 89-real 90)
endif()
enable_language(CUDA)


# The target exists already, so the CMAKE_CUDA_* defaults did not reach it: set its properties.
target_sources(rmsnorm_onnx PRIVATE "${CMAKE_CURRENT_LIST_DIR}/../cuda/rmsnorm.cu")
set_target_properties(rmsnorm_onnx PROPERTIES
  CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
  CUDA_RUNTIME_LIBRARY Static
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_VISIBILITY_PRESET hidden)
target_compile_definitions(rmsnorm_onnx PRIVATE RMSNORM_ONNX_WITH_CUDA=1)
target_compile_options(rmsnorm_onnx PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)

set(RMSNORM_ONNX_PTXAS_DIR "${CMAKE_BINARY_DIR}/ptxas")
set(RMSNORM_ONNX_PTXAS_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/cuda_ptxas_report.cmake")
set(_launcher "${CMAKE_COMMAND}" "-DREPORT_DIR=${RMSNORM_ONNX_PTXAS_DIR}"
    -P "${RMSNORM_ONNX_PTXAS_SCRIPT}" --)
if(CMAKE_CUDA_COMPILER_LAUNCHER)  # e.g. ccache: runs under ours
  list(APPEND _launcher ${CMAKE_CUDA_COMPILER_LAUNCHER})
endif()
set_target_properties(rmsnorm_onnx PROPERTIES CUDA_COMPILER_LAUNCHER "${_launcher}")
add_custom_command(TARGET rmsnorm_onnx POST_BUILD
  COMMAND "${CMAKE_COMMAND}" "-DREPORT_DIR=${RMSNORM_ONNX_PTXAS_DIR}"
          "-DOUTPUT=$<TARGET_FILE_DIR:rmsnorm_onnx>/rmsnorm_onnx_ptxas.txt"
          -P "${RMSNORM_ONNX_PTXAS_SCRIPT}"
  COMMENT "Gathering ptxas resource usage into rmsnorm_onnx_ptxas.txt"
  VERBATIM)
install(FILES "$<TARGET_FILE_DIR:rmsnorm_onnx>/rmsnorm_onnx_ptxas.txt" DESTINATION rmsnorm_onnx)
