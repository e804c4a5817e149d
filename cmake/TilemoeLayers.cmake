# The folders of src/ are layers, each a library that may include only the layers below it:
#
#   layer        the MoE layer (one rank of a world)
#   strategies   each published system's decisions: plan compilers, options, cost models
#   exec         plan runners (cpu/, cuda/)
#   kernels      strategy-free kernels (router, layout, permute, combine, gemm/planned, gemm/stock)
#   plan         the plan format's builder, checker and packing
#   comm         transports
#   launch       launcher environments and rendezvous
#   core         config, routing, tensors, errors, traces, CUDA basics
#
# A layer's sources see the src/ folders through an include root of their own (in the build
# tree) that holds links to that layer and the layers below it only, so an include that points
# up ("plan/..." from core) is a file the compiler cannot find: the build fails. Quoted includes
# of a file's own folder still resolve next to the file. include/ (the public API) is visible
# to every layer and to tools/, which sees nothing else.
set(TILEMOE_LAYERS core launch comm plan kernels exec strategies layer)  # bottom to top

# The include root of `layer`: ${CMAKE_BINARY_DIR}/layers/<layer>/<folder> -> src/<folder> for
# the layer itself and every layer below it.
function(tilemoe_layer_root layer out_var)
  list(FIND TILEMOE_LAYERS ${layer} top)
  if(top LESS 0)
    message(FATAL_ERROR "tilemoe_layer_root: ${layer} is not one of the layers ${TILEMOE_LAYERS}")
  endif()
  set(root "${CMAKE_BINARY_DIR}/layers/${layer}")
  file(MAKE_DIRECTORY "${root}")
  foreach(i RANGE 0 ${top})
    list(GET TILEMOE_LAYERS ${i} below)
    if(NOT IS_SYMLINK "${root}/${below}")
      file(CREATE_LINK "${PROJECT_SOURCE_DIR}/src/${below}" "${root}/${below}" SYMBOLIC)
    endif()
  endforeach()
  set(${out_var} "${root}" PARENT_SCOPE)
endfunction()

# Gives `target` the include root of `layer` and the public API. Messages that name a header
# reached through the root (__FILE__ in a macro) name it as src/<folder>/..., not by the build
# tree's path.
function(tilemoe_layer_includes target layer)
  tilemoe_layer_root(${layer} root)
  target_include_directories(${target} PRIVATE "${root}")
  target_include_directories(${target} PUBLIC "${PROJECT_SOURCE_DIR}/include")
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-fmacro-prefix-map=${root}/=src/>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fmacro-prefix-map=${root}/=src/>)
endfunction()

# A static library for the layer in src/<layer>, seeing that layer and those below it; `DEPS`
# are the layer libraries it links (each must be below it).
function(tilemoe_layer_library layer)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  list(FIND TILEMOE_LAYERS ${layer} top)
  foreach(dep IN LISTS ARG_DEPS)
    if(dep MATCHES "^tilemoe_(.*)$")
      list(FIND TILEMOE_LAYERS ${CMAKE_MATCH_1} index)
      if(index GREATER_EQUAL top)
        message(FATAL_ERROR "layer ${layer} links ${dep}, which is not below it (${TILEMOE_LAYERS}, bottom first)")
      endif()
    endif()
  endforeach()
  add_library(tilemoe_${layer} STATIC ${ARG_SOURCES})
  tilemoe_layer_includes(tilemoe_${layer} ${layer})
  target_link_libraries(tilemoe_${layer} PUBLIC ${ARG_DEPS})
endfunction()

# A GPU test or benchmark program (tests/cuda, bench): it sees every layer of src/ (it checks
# internals) and links all of them, the case registry (tests/cases) and `ARGN`.
function(tilemoe_gpu_program name source)
  add_executable(${name} ${source})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PRIVATE tilemoe_runtime tilemoe_cases ${ARGN})
endfunction()
