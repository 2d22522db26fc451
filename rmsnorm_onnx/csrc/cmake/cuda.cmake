# The CUDA EP kernel of librmsnorm_onnx. Included by CMakeLists.txt when RMSNORM_ONNX_CUDA is on.
#
# - architectures: machine code (SASS) once per binary-compatible family, PTX for what comes after:
#   sm_75 (Turing), sm_80 (Ampere and Ada: a cubin for X.y runs on every X.z with z >= y, so
#   sm_86 and sm_89 run sm_80's code), sm_90 (Hopper), and compute_90 PTX, which the driver
#   compiles for newer GPUs (Blackwell and later) on first load. -DCMAKE_CUDA_ARCHITECTURES=...
#   overrides (e.g. 90 alone while iterating, or "75-real 80-real 86-real 89-real 90" for
#   family-specific SASS).
# - nvcc compiles the architectures in parallel (--threads, RMSNORM_ONNX_NVCC_THREADS; 0: one
#   per CPU); each architecture's ptxas report stays in one piece (nvcc buffers each thread's).
# - the CUDA runtime is linked statically: the library loads where there is no driver or GPU.
# - ptxas's resource report (-Xptxas -v: registers, spills, shared memory per kernel and
#   architecture) is captured by a compiler launcher and gathered next to the library as
#   rmsnorm_onnx_ptxas.txt, installed with it; tests/test_cuda_build.py checks it.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 75-real 80-real 90)
endif()
set(RMSNORM_ONNX_NVCC_THREADS "0" CACHE STRING
    "nvcc --threads: architectures compiled at once (0: one per CPU, 1: one after another)")
enable_language(CUDA)
message(STATUS "rmsnorm_onnx: CUDA kernels for ${CMAKE_CUDA_ARCHITECTURES} with nvcc "
               "${CMAKE_CUDA_COMPILER_VERSION} (--threads ${RMSNORM_ONNX_NVCC_THREADS}): the "
               "longest step of the build (about 1.5 min of 2 cores); RMSNORM_ONNX_CUDA=OFF skips it")

# The target exists already, so the CMAKE_CUDA_* defaults did not reach it: set its properties.
target_sources(rmsnorm_onnx PRIVATE "${CMAKE_CURRENT_LIST_DIR}/../cuda/rmsnorm.cu")
set_target_properties(rmsnorm_onnx PROPERTIES
  CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
  CUDA_RUNTIME_LIBRARY Static
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_VISIBILITY_PRESET hidden)
target_compile_definitions(rmsnorm_onnx PRIVATE RMSNORM_ONNX_WITH_CUDA=1)
target_compile_options(rmsnorm_onnx PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v --threads=${RMSNORM_ONNX_NVCC_THREADS}>)

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
